"""Who holds a lock, and no waiting for yourself, in a real prefork Celery worker."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery

from redis_fifo_lock import LockUsageError
from tests.celery_tests import celery_app as tasks
from tests.support.celery_worker import RESULT_TIMEOUT_S, Worker, running_worker, unique

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def worker(app: Celery, celery_redis_url: str, logdir: Path) -> Iterator[Worker]:
    """A real prefork worker, started and proven ready."""
    with running_worker(celery_redis_url, "prefork", logdir) as worker:
        yield worker


def test_a_task_s_grant_records_its_host_process_name_and_id(worker: Worker) -> None:
    holder, task_id = tasks.report_holder.delay(unique("h")).get(timeout=RESULT_TIMEOUT_S)

    host, _, rest = holder.partition(" pid ")
    pid, _, caller = rest.partition(": ")
    assert host == socket.gethostname()
    assert int(pid) != os.getpid()  # a prefork child process
    assert caller == f"celery task tests.celery_tests.celery_app.report_holder[{task_id}]"


def test_a_task_taking_its_own_lock_again_fails_at_once_instead_of_hanging(
    worker: Worker,
) -> None:
    result = tasks.nest_own_lock.delay(unique("n"))
    with pytest.raises(LockUsageError, match=r"already held .* not reentrant"):
        result.get(timeout=RESULT_TIMEOUT_S)
