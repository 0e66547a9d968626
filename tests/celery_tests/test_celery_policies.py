"""The contention policies in a real prefork worker: ``wait``, ``retry``, ``skip``.

The test process holds the task's lock by hand (``lock_for(...).hold()``) to
make it busy, and reads the worker's log records from the record (see
``tests/celery_tests/celery_app.py``): every outcome must leave one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, states

from fifolock_celery import CONTENTION_HEADER, SKIPPED, lock_for
from tests.celery_tests import celery_app as tasks
from tests.support.celery_worker import RESULT_TIMEOUT_S, Log, Worker, running_worker
from tests.support.polling import until_sync
from tests.support.record import violations


@pytest.fixture(scope="module")
def worker(app: Celery, celery_redis_url: str, logdir: Path) -> Iterator[Worker]:
    """A prefork worker (concurrency 4), started and proven ready."""
    with running_worker(celery_redis_url, "prefork", logdir) as worker:
        yield worker


def test_wait_queues_in_arrival_order_and_logs_each_grant_with_the_time_waited(
    app: Celery, worker: Worker, log: Log, key: str
) -> None:
    lock = lock_for(app, f"gate-{key}")
    with lock.hold(timeout=5):
        first = tasks.pass_gate.delay(log.key, key)
        until_sync(lambda: lock.status().waiting == 1, "the first task queued")
        second = tasks.pass_gate.delay(log.key, key)
        until_sync(lambda: lock.status().waiting == 2, "the second task queued")

    fences = [first.get(timeout=RESULT_TIMEOUT_S), second.get(timeout=RESULT_TIMEOUT_S)]

    holds = log.holds()
    assert [h.task_id for h in holds] == [first.id, second.id]  # arrival order
    assert violations(holds) == []
    records = log.log_records(f"gate-{key}")
    assert [(r["level"], r["policy"], r["task_id"]) for r in records] == [
        ("INFO", "wait", first.id),
        ("INFO", "wait", second.id),
    ]
    for record, fence in zip(records, fences, strict=True):
        assert f"(fence {fence}) after waiting" in record["message"]


def test_retry_republishes_while_busy_without_spending_max_retries(
    app: Celery, worker: Worker, log: Log, key: str
) -> None:
    with lock_for(app, f"gate-{key}").hold(timeout=5):
        # max_retries=0: one spent retry would fail the task.
        result = tasks.retry_gate.apply_async((log.key, key), headers={"tenant": "t1"})
        log.log_records(f"gate-{key}", count=2)  # two contention retries, then let it in

    outcome: dict[str, Any] = result.get(timeout=RESULT_TIMEOUT_S)

    assert outcome["retries"] == 0
    assert outcome["headers"]["tenant"] == "t1"  # the message's own options are kept
    contention = outcome["headers"][CONTENTION_HEADER]
    assert contention >= 2
    [hold] = log.holds()
    assert hold.task_id == result.id and hold.retries == 0
    records = log.log_records(f"gate-{key}")
    retries = [r for r in records if "republished" in r["message"]]
    assert len(retries) == contention
    assert {(r["level"], r["policy"], r["task_id"]) for r in retries} == {
        ("INFO", "retry", result.id)
    }
    assert f"run again in {tasks.COUNTDOWN_S:g} s" in retries[0]["message"]
    assert "request.retries stays 0" in retries[0]["message"]
    assert records[-1]["level"] == "INFO" and "after waiting" in records[-1]["message"]


def test_skip_returns_the_sentinel_and_logs_a_warning_while_busy(
    app: Celery, worker: Worker, log: Log, key: str
) -> None:
    with lock_for(app, f"gate-{key}").hold(timeout=5) as lease:
        skipped = tasks.skip_gate.delay(log.key, key)
        by_base = tasks.skip_gate_by_base.delay(log.key, key)
        outcomes = [skipped.get(timeout=RESULT_TIMEOUT_S), by_base.get(timeout=RESULT_TIMEOUT_S)]

    assert outcomes == [SKIPPED, SKIPPED]
    assert skipped.state == by_base.state == states.SUCCESS
    assert log.holds() == []
    records = log.log_records(f"gate-{key}")
    assert sorted((r["level"], r["policy"], r["task_id"]) for r in records) == sorted(
        [("WARNING", "skip", skipped.id), ("WARNING", "skip", by_base.id)]
    )
    assert all(f"(holder fence {lease.fence})" in r["message"] for r in records)


def test_skip_runs_the_body_when_the_lock_is_free(worker: Worker, log: Log, key: str) -> None:
    fence = tasks.skip_gate.delay(log.key, key).get(timeout=RESULT_TIMEOUT_S)

    [hold] = log.holds()
    assert fence == hold.fence
