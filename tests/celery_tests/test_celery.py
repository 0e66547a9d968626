"""``@fifo_locked`` and ``FifoLockedTask`` in a real worker, on every pool.

Each pool gets a ``celery -A tests.celery_tests.celery_app worker`` subprocess of its own
(concurrency 4), against the session's Redis: prefork (real child processes),
threads and solo, plus gevent and eventlet when they are installed. The tasks
(``tests/celery_tests/celery_app.py``) write enter/exit entries to a record kept apart from
the lock, and the tests check the record: no two holds of one lock overlap,
fences increase in entry order, different lock names do run at once (where the
pool runs tasks at once).
"""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.result import AsyncResult

from fifolock_celery import lock_for
from redis_fifo_lock import LockTimeout, NotReplicated
from redis_fifo_lock.holds import violations
from tests.celery_tests import celery_app as tasks
from tests.support.celery_worker import (
    RESULT_TIMEOUT_S,
    Log,
    Worker,
    running_worker,
    unique,
)


def pool(name: str) -> Any:
    """A ``worker`` param; gevent and eventlet are skipped when not installed."""
    if name in ("gevent", "eventlet") and importlib.util.find_spec(name) is None:
        return pytest.param(name, marks=pytest.mark.skip(reason=f"{name} is not installed"))
    return name


@pytest.fixture(
    scope="module",
    params=[pool(name) for name in ("prefork", "threads", "solo", "gevent", "eventlet")],
)
def worker(
    request: pytest.FixtureRequest, app: Celery, celery_redis_url: str, logdir: Path
) -> Iterator[Worker]:
    """A real worker (``--pool`` = the param, concurrency 4), started and proven ready."""
    with running_worker(celery_redis_url, request.param, logdir) as worker:
        yield worker


def concurrent(worker: Worker) -> bool:
    """Whether the worker's pool runs several tasks at once."""
    return worker.pool != "solo"


def get(result: AsyncResult[Any]) -> Any:
    """The task's return value, within ``RESULT_TIMEOUT_S``."""
    return result.get(timeout=RESULT_TIMEOUT_S)


def test_same_invoice_tasks_take_turns_while_different_invoices_overlap(
    app: Celery, worker: Worker, log: Log
) -> None:
    a, b = unique("a"), unique("b")
    results: list[tuple[str, AsyncResult[Any]]] = []
    for _ in range(3):  # four ways to pass the same arguments, alternating invoices
        results.append((a, tasks.hold_invoice.delay(log.key, a)))
        results.append((b, tasks.hold_invoice.apply_async((log.key,), {"invoice_id": b})))
        results.append(
            (
                a,
                app.send_task(
                    "tests.celery_tests.celery_app.hold_invoice", [log.key, a, tasks.HOLD_MS]
                ),
            )
        )
        results.append((b, tasks.hold_invoice.delay(log.key, invoice_id=b, hold_ms=tasks.HOLD_MS)))

    names = [(invoice, get(result)) for invoice, result in results]

    assert all(name == f"invoice-{invoice}" for invoice, name in names), names
    holds = log.holds()
    assert len(holds) == len(results)
    by_lock = {lock: [h for h in holds if h.lock == lock] for lock in {h.lock for h in holds}}
    assert sorted(len(group) for group in by_lock.values()) == [6, 6]
    for group in by_lock.values():
        assert violations(group) == []
    first, second = by_lock.values()
    overlapped = any(x.overlaps(y) for x in first for y in second)
    assert overlapped == concurrent(worker), "different invoices ran at once only if they can"
    if worker.pool == "prefork":
        # The main process took a lock before the pool forked (worker_init in
        # tests/celery_tests/celery_app.py): children that reused its portal thread or
        # clients would hang instead of getting here.
        assert worker.warmed_up_in == worker.main_pid
        assert len({h.pid for h in holds}) >= 2
        assert worker.main_pid not in {h.pid for h in holds}
    else:
        assert {h.pid for h in holds} == {worker.main_pid}
        assert len({h.thread for h in holds}) >= (2 if concurrent(worker) else 1)


def test_every_way_of_declaring_and_calling_gives_one_lock_and_takes_turns(
    app: Celery, worker: Worker, log: Log
) -> None:
    invoice = unique("inv")
    results = [
        tasks.hold_invoice.delay(log.key, invoice),  # @fifo_locked, bind=True
        tasks.hold_invoice_by_base.delay(log.key, invoice),  # base=FifoLockedTask
        app.send_task(
            "tests.celery_tests.celery_app.hold_invoice_by_base",
            kwargs={"log": log.key, "invoice_id": invoice},
        ),
        tasks.hold_region.delay(log.key, invoice),  # default omitted ...
        tasks.hold_region.delay(log.key, invoice, "eu"),  # ... given positionally
        tasks.hold_region.delay(log=log.key, invoice_id=invoice, region="eu"),  # ... by keyword
        tasks.locked_over_another_decorator.delay(log.key, invoice),
        tasks.locked_under_another_decorator.delay(log.key, key=invoice, suffix="x"),
    ]

    names = [get(result) for result in results]

    assert (
        names == [f"invoice-{invoice}"] * 3 + [f"region-eu-{invoice}"] * 3 + [f"deco-{invoice}"] * 2
    )
    holds = log.holds()
    for lock in set(names):
        assert violations([h for h in holds if h.lock == lock]) == []


@pytest.mark.parametrize(
    "ids", [(1, 2), [1, (2, ("x", 3))], tasks.Kind.A], ids=["tuple", "nested", "str-enum"]
)
def test_a_direct_call_waits_for_the_worker_running_the_same_call(
    worker: Worker, log: Log, key: str, ids: object
) -> None:
    """A tuple or a str-enum argument locked "batch-(1, 2)" / "batch-Kind.A" in
    ``.apply()`` but "batch-[1, 2]" / "batch-a" in the worker, which got the
    arguments through JSON: the two bodies overlapped."""
    sent = tasks.hold_batch.delay(log.key, key, ids)
    log.wait("entered", 1)

    direct = tasks.hold_batch.apply((log.key, key, ids), {"hold_ms": 0}).get()

    assert direct == get(sent)
    assert violations(log.holds()) == []


def test_two_executions_of_one_task_id_take_turns(worker: Worker, log: Log) -> None:
    invoice, task_id = unique("redelivered"), str(uuid.uuid4())
    for _ in range(2):  # the second message is what a redelivery looks like
        tasks.hold_invoice.apply_async((log.key, invoice), task_id=task_id)

    log.wait("done", 2)

    holds = log.holds()
    assert [h.task_id for h in holds] == [task_id, task_id]
    assert violations(holds) == []


def test_self_retry_inside_the_body_releases_and_the_retry_gets_the_lock(
    worker: Worker, log: Log
) -> None:
    fence = get(tasks.retry_once.delay(log.key, unique("retry")))

    holds = log.holds()
    assert [h.retries for h in holds] == [0, 1]
    assert violations(holds) == []
    assert fence == holds[1].fence


def test_autoretry_for_releases_before_its_retry_takes_the_same_lock(
    worker: Worker, log: Log
) -> None:
    key = unique("auto")

    name = get(tasks.autoretried.delay(log.key, key))

    holds = log.holds()
    assert name == f"auto-{key}" and {h.lock for h in holds} == {name}
    assert [h.retries for h in holds] == [0, 1]
    assert violations(holds) == []


def test_an_exception_in_the_body_releases_the_lock(app: Celery, worker: Worker, log: Log) -> None:
    key = unique("fail")
    result = tasks.fail_inside.delay(log.key, key)

    with pytest.raises(ValueError, match="failing on purpose"):
        get(result)

    # The result is stored after the body's release, so this is not a race.
    status = lock_for(app, f"fail-{key}").status()
    assert not status.held
    assert status.last_fence == log.holds()[0].fence


def test_current_lease_gives_the_fence_the_lock_granted(
    app: Celery, worker: Worker, log: Log, key: str
) -> None:
    fences = [get(tasks.pass_gate.delay(log.key, key)) for _ in range(2)]

    assert fences == [h.fence for h in log.holds()]
    assert lock_for(app, f"gate-{key}").status().last_fence == fences[-1]
    assert fences[1] > fences[0]


def test_a_task_that_cannot_get_the_lock_in_time_fails_logs_and_leaves_nothing_queued(
    app: Celery, worker: Worker, log: Log, key: str
) -> None:
    lock = lock_for(app, f"gate-{key}")
    with lock.hold(timeout=5) as lease:
        result = tasks.try_gate.delay(log.key, key)
        result.get(timeout=RESULT_TIMEOUT_S, propagate=False)
        status = lock.status()

    assert result.failed()
    assert isinstance(result.result, LockTimeout)  # rebuilt from (name, message)
    assert "not acquired within 0.3 s" in str(result.result)
    assert status.waiting == 0
    assert log.holds() == []
    [record] = log.log_records(f"gate-{key}")
    assert (record["level"], record["policy"], record["task_id"]) == ("WARNING", "wait", result.id)
    assert f"(holder fence {lease.fence})" in record["message"]


def test_decorator_options_override_the_app_settings(worker: Worker) -> None:
    left_ms = get(tasks.lease_left.delay(unique("lease")))

    assert tasks.LEASE_MS < left_ms <= 3000


def test_a_grant_no_replica_acknowledged_fails_the_task_without_running_its_body(
    app: Celery, worker: Worker, log: Log, key: str
) -> None:
    # The session's server has no replica: replicas=1 must reach the core.
    result = tasks.replicated.delay(log.key, key)
    result.get(timeout=RESULT_TIMEOUT_S, propagate=False)

    assert result.failed()
    assert isinstance(result.result, NotReplicated)  # rebuilt from (name, message)
    assert "acknowledged by 0 of the 1 replica(s)" in str(result.result)
    assert log.holds() == []
    assert not lock_for(app, f"replicated-{key}").status().held


def test_the_worker_warns_at_start_about_a_time_limit_beyond_max_hold(
    worker: Worker, log: Log
) -> None:
    ours = [r for r in log.log_records("worker") if r["pid"] == worker.main_pid]

    assert [r["level"] for r in ours] == ["WARNING"]
    assert ours[0]["message"].startswith(
        "task tests.celery_tests.celery_app.limited_beyond_max_hold: its time_limit is 30 s "
        "but its FIFO "
        "lock may be held for at most max_hold_ms=5000 ms;"
    )
