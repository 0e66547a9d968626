"""A real Redis redelivery: an ``acks_late`` task outliving the ``visibility_timeout``.

The worker here runs the ``redelivery`` profile of ``tests/celery_tests/celery_app.py``: a
one-second visibility timeout swept every second, on a queue of its own. While
the first delivery of ``hold_acks_late`` holds its lock, kombu delivers the
same message again; the copies (same task id) must queue behind it and run
only after it, one at a time. The worker also warns at start that this
configuration redelivers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from kombu.transport.redis import Channel as RedisChannel

from fifolock_celery import lock_for
from tests.celery_tests import celery_app as tasks
from tests.support.celery_worker import RESULT_TIMEOUT_S, Log, Worker, running_worker
from tests.support.polling import until_sync
from tests.support.record import violations


@pytest.fixture(scope="module")
def worker(app: Celery, celery_redis_url: str, logdir: Path) -> Iterator[Worker]:
    """A prefork worker (concurrency 3) of the redelivery profile; its queue is
    purged afterwards, so no copy outlives the module."""
    with running_worker(
        celery_redis_url,
        "prefork",
        logdir,
        concurrency=3,
        profile="redelivery",
        queue=tasks.REDELIVERY_QUEUE,
    ) as worker:
        yield worker
    with app.connection_for_write() as connection:
        connection.default_channel.queue_purge(tasks.REDELIVERY_QUEUE)


# kombu < 5.7 (Celery < 5.7) has no unacked_restore_interval / _throttle: it
# sweeps for messages to redeliver every 100 s, past this test's deadlines.
@pytest.mark.skipif(
    not hasattr(RedisChannel, "unacked_restore_interval"),
    reason="kombu < 5.7 redelivers only every 100 s (no unacked_restore_interval)",
)
def test_a_redelivered_task_waits_for_its_first_delivery_to_finish(
    app: Celery, worker: Worker, log: Log, key: str
) -> None:
    lock = lock_for(app, f"gate-{key}")
    first = tasks.hold_acks_late.apply_async((log.key, key, log.gate), queue=tasks.REDELIVERY_QUEUE)
    log.wait("entered", 1)
    until_sync(lambda: lock.status().waiting >= 1, "a redelivered copy queued for the lock")
    log.open_gate()

    first.get(timeout=RESULT_TIMEOUT_S)
    log.wait("done", 2)

    holds = log.holds()
    assert {h.task_id for h in holds} == {first.id}
    assert [h.redelivered for h in holds][:2] == [False, True]
    assert violations(holds) == []


def test_the_worker_warns_at_start_that_acks_late_outlives_the_visibility_timeout(
    worker: Worker, log: Log
) -> None:
    messages = [r["message"] for r in log.log_records("worker") if r["pid"] == worker.main_pid]

    assert any(
        m.startswith(
            "task tests.celery_tests.celery_app.hold_acks_late: it is acks_late and the "
            "Redis broker's "
            f"visibility_timeout is {tasks.VISIBILITY_TIMEOUT_S} s, shorter than its "
            f"time_limit of {tasks.LONG_LIMIT_S} s"
        )
        for m in messages
    ), messages
