"""The test workers' own support: a worker that will not stop is reported with
where each of its processes was stuck (``tests.support.celery_worker``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from celery import Celery

from tests.celery_tests import celery_app as tasks
from tests.support import celery_worker
from tests.support.celery_worker import Log, running_worker


def test_a_worker_that_does_not_stop_in_time_fails_with_every_process_stack(
    app: Celery,
    celery_redis_url: str,
    logdir: Path,
    log: Log,
    key: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(celery_worker, "WORKER_STOP_TIMEOUT_S", 1.0)
    try:
        with (
            pytest.raises(pytest.fail.Exception) as failed,
            running_worker(celery_redis_url, "prefork", logdir, concurrency=1),
        ):
            # A warm shutdown waits for this task, which waits for a gate
            # nobody opens (for tasks.GATE_TIMEOUT_S).
            tasks.hold_until_gate.delay(log.key, key, log.gate)
            log.wait("entered", 1)
    finally:
        log.open_gate()

    message = str(failed.value)
    assert "worker did not stop cleanly within 1.0 s" in message
    # The main process and its one child each wrote their stacks, one after
    # the other; the child's shows the task it was stuck in.
    dumps = message.split("Current thread")
    assert len(dumps) >= 3, message
    assert any("in hold_until_gate" in dump for dump in dumps), message
