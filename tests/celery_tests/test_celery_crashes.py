"""Tasks that die or fail in a real prefork worker: SIGKILL, hard time limits, our errors.

A dead holder must free the lock within ``lease_ms`` (it stops renewing), a
dead waiter's queue entry must be skipped at the next hand-off, and every
exception we raise must cross from the child process to the parent and the
result backend without taking the worker down.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from celery.exceptions import TimeLimitExceeded, WorkerLostError

from fifolock_celery import lock_for
from redis_fifo_lock import LeaseLost
from tests.celery_tests import celery_app as tasks
from tests.support.celery_worker import RESULT_TIMEOUT_S, Log, Worker, running_worker
from tests.support.polling import until_sync

SLACK_MS = 1000
"""Allowance (ms) for process start-up and scheduling on a busy 2-core machine."""


@pytest.fixture(scope="module")
def worker(app: Celery, celery_redis_url: str, logdir: Path) -> Iterator[Worker]:
    """A prefork worker (concurrency 4), started and proven ready."""
    with running_worker(celery_redis_url, "prefork", logdir) as worker:
        yield worker


def entered_ns(log: Log, task_id: str) -> int | None:
    """When ``task_id`` entered its lock (monotonic ns), or None if it never did."""
    times = [e["ns"] for e in log.entries() if e["event"] == "enter" and e["task_id"] == task_id]
    return times[0] if times else None


def test_a_child_killed_mid_hold_frees_the_lock_within_a_lease(
    app: Celery, worker: Worker, log: Log, key: str
) -> None:
    lock = lock_for(app, f"gate-{key}")
    blocked = tasks.hold_until_gate.delay(log.key, key, log.gate)
    log.wait("entered", 1)
    [holder] = log.entries()
    follower = tasks.pass_gate.delay(log.key, key)
    until_sync(lambda: lock.status().waiting == 1, "the follower queued for the lock")

    assert holder["pid"] != worker.main_pid
    try:
        os.kill(holder["pid"], signal.SIGKILL)
        killed_ns = time.monotonic_ns()  # the clock of the record
        fence = follower.get(timeout=RESULT_TIMEOUT_S)
    finally:
        log.open_gate()  # frees the holder, should the kill have missed

    waited_ms = ((entered_ns(log, follower.id) or 0) - killed_ns) / 1e6
    assert fence > holder["fence"]
    assert waited_ms <= tasks.LEASE_MS + tasks.POLL_MS + SLACK_MS, waited_ms
    with pytest.raises(WorkerLostError):
        blocked.get(timeout=RESULT_TIMEOUT_S)


def test_a_hard_time_limit_frees_the_lock_and_reaps_a_killed_waiters_entry(
    app: Celery, worker: Worker, log: Log, key: str
) -> None:
    lock = lock_for(app, f"gate-{key}")
    holder = tasks.hold_until_killed.delay(log.key, key, log.gate)  # killed after 3 s
    [holder_fence] = log.wait("entered", 1)
    waiter = tasks.wait_until_killed.delay(log.key, key, log.gate)  # killed after 1 s
    until_sync(lambda: lock.status().waiting == 1, "the waiter queued")
    follower = tasks.pass_gate.delay(log.key, key)
    until_sync(lambda: lock.status().waiting == 2, "the follower queued")

    fence = follower.get(timeout=RESULT_TIMEOUT_S)

    for killed in (holder, waiter):
        with pytest.raises(TimeLimitExceeded):
            killed.get(timeout=RESULT_TIMEOUT_S)
    # The waiter died in the queue, never granted: its entry was skipped at the
    # hand-off, with no grant (and no fence) wasted on it.
    assert entered_ns(log, waiter.id) is None
    assert fence > holder_fence
    started_ns = entered_ns(log, holder.id)
    follower_ns = entered_ns(log, follower.id)
    assert started_ns is not None and follower_ns is not None
    waited_ms = (follower_ns - started_ns) / 1e6
    limit_ms = tasks.TIME_LIMIT_S * 1000
    # The limit counts from the task's start, a moment before it entered.
    assert limit_ms - 100 <= waited_ms <= limit_ms + tasks.LEASE_MS + tasks.POLL_MS + SLACK_MS
    status = lock.status()
    assert (status.held, status.waiting, status.last_fence) == (False, 0, fence)
    assert tasks.ping.delay().get(timeout=RESULT_TIMEOUT_S)["hostname"] == worker.hostname


@pytest.mark.parametrize("kind", sorted(tasks.ERRORS))
def test_each_error_we_raise_reaches_the_caller_and_the_worker_keeps_running(
    worker: Worker, kind: str
) -> None:
    result = tasks.raise_error.delay(kind)
    result.get(timeout=RESULT_TIMEOUT_S, propagate=False)

    expected = tasks.ERRORS[kind]()
    assert type(result.result) is type(expected)
    assert str(result.result) == str(expected)
    assert tasks.ping.delay().get(timeout=RESULT_TIMEOUT_S)["hostname"] == worker.hostname
    text = worker.log_text()
    assert "MaybeEncodingError" not in text and "pickle" not in text.lower()


def test_a_lease_lost_mid_hold_fails_the_task_loudly_and_the_worker_keeps_running(
    app: Celery, worker: Worker, key: str
) -> None:
    result = tasks.lose_the_lease.delay(key)

    with pytest.raises(LeaseLost, match=f"'lose-{key}'"):
        result.get(timeout=RESULT_TIMEOUT_S)
    assert not lock_for(app, f"lose-{key}").status().held
    assert tasks.ping.delay().get(timeout=RESULT_TIMEOUT_S)["hostname"] == worker.hostname
