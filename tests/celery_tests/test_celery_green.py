"""Celery's green pools, gevent and eventlet, with a real worker each.

Under ``--pool gevent`` or ``--pool eventlet`` the worker monkey-patches
``threading``: a portal started with it would be a greenlet sharing the hub
with the task bodies, and would renew nothing while a body blocks the hub (a
CPU-bound loop, a C driver), nor let a body run ``asyncio.run()``. These tests
hold a lock across several leases among fifty greenlets and this process, and
across a CPU-bound stretch longer than the lease.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import TimeLimitExceeded
from redis import Redis

from fifolock_celery import lock_for
from redis_fifo_lock.holds import violations
from tests.celery_tests import celery_app as tasks
from tests.support.celery_worker import RESULT_TIMEOUT_S, ROOT, Log, Worker, running_worker

GREEN_POOLS = ("gevent", "eventlet")
CONCURRENCY = 50
LONG_HOLD_MS = 2500
"""A long hold spans two and a half leases (``tasks.GREEN_LEASE_MS``)."""


def green(name: str) -> Any:
    """A pool param, skipped when the library is not installed."""
    if importlib.util.find_spec(name) is None:
        return pytest.param(name, marks=pytest.mark.skip(reason=f"{name} is not installed"))
    return name


@pytest.fixture(scope="module", params=[green(name) for name in GREEN_POOLS])
def worker(
    request: pytest.FixtureRequest, app: Celery, celery_redis_url: str, logdir: Path
) -> Iterator[Worker]:
    """A real green worker (``--pool`` = the param, concurrency 50)."""
    with running_worker(celery_redis_url, request.param, logdir, concurrency=CONCURRENCY) as w:
        yield w


def test_greenlets_and_another_process_take_turns_across_several_leases(
    app: Celery, worker: Worker, log: Log, key: str
) -> None:
    record = Redis.from_url(app.conf.record_url)
    inside, crowded = f"{log.key}:inside", f"{log.key}:crowded"
    # Two holds of two and a half leases among short ones: more than the
    # concurrency's worth of greenlets wait at once, in order.
    holds_ms = [LONG_HOLD_MS if i % 15 == 0 else 10 for i in range(30)]
    results = [tasks.count_inside.delay(log.key, key, hold_ms) for hold_ms in holds_ms]
    log.wait("entered", 1)

    def contend() -> None:  # this process takes the same lock meanwhile
        lock = lock_for(app, f"green-{key}")
        for _ in range(3):
            with lock.hold(timeout=60):
                if record.incr(inside) != 1:
                    record.rpush(crowded, "here")
                record.decr(inside)

    contenders = [threading.Thread(target=contend) for _ in range(2)]
    for thread in contenders:
        thread.start()
    fences = [result.get(timeout=60) for result in results]
    for thread in contenders:
        thread.join(timeout=60)

    try:
        assert record.lrange(crowded, 0, -1) == []
        holds = log.holds()
        assert len(holds) == len(results) and len(set(fences)) == len(results)
        assert violations(holds) == []
        assert len({h.thread for h in holds}) > 1, "the holds ran in several greenlets"
    finally:
        record.delete(inside, crowded)
        record.close()


def test_a_body_that_blocks_the_hub_longer_than_its_lease_keeps_the_lock(
    app: Celery, worker: Worker, log: Log, key: str
) -> None:
    """The portal renews from an OS thread of its own while a CPU-bound body
    blocks the hub: a greenlet portal let the lease run out, this process got
    the lock while the body still ran, and the body failed with LeaseLost."""
    spinner = tasks.spin_inside.delay(log.key, key, LONG_HOLD_MS)
    log.wait("entered", 1)

    with lock_for(app, f"green-{key}").hold(timeout=RESULT_TIMEOUT_S):
        granted_ns = time.monotonic_ns()  # the clock of the record

    spinner.get(timeout=RESULT_TIMEOUT_S, propagate=False)
    assert spinner.successful(), f"the spinning body failed: {spinner.result!r}"
    assert spinner.result is False, "its lease was lost"
    [hold] = log.holds()
    assert hold.exited_ns is not None and hold.exited_ns < granted_ns


def test_a_locked_body_can_run_a_coroutine(worker: Worker, key: str) -> None:
    """A greenlet portal's loop was the running loop of every greenlet:
    ``asyncio.run()`` (and ``async_to_sync``) failed in every task of the worker."""
    assert tasks.run_a_coroutine.delay(key).get(timeout=RESULT_TIMEOUT_S) == key


def _script_result(module: str, *args: str) -> dict[str, Any]:
    """The JSON line ``python -m module *args`` printed last (it must exit 0)."""
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def spin(pool: str, url: str, mutant: str = "") -> dict[str, Any]:
    """What ``tests.support.green_spin`` saw in a ``pool``-patched process."""
    return _script_result("tests.support.green_spin", pool, url, *([mutant] if mutant else []))


@pytest.mark.parametrize("pool", [green(name) for name in GREEN_POOLS])
def test_a_patched_process_renews_while_its_hub_is_blocked(pool: str, redis_url: str) -> None:
    seen = spin(pool, redis_url)

    assert (seen["lost"], seen["released"], seen["asyncio_run"]) == (False, "ok", True)


@pytest.mark.parametrize("pool", [green(name) for name in GREEN_POOLS])
def test_the_renewal_from_a_blocked_hub_kills_greenlet_portal(pool: str, redis_url: str) -> None:
    seen = spin(pool, redis_url, "greenlet-portal")

    assert (seen["lost"], seen["released"]) == (True, "LeaseLost"), "greenlet-portal passed"
    assert "running event loop" in seen["asyncio_run"]


def test_time_limits_end_a_waiter_and_a_holder_and_leave_the_lock_free(
    app: Celery, worker: Worker, log: Log, key: str
) -> None:
    """gevent's pool enforces a hard time limit by raising ``gevent.Timeout``
    in the greenlet (and no soft one); eventlet's has none."""
    if worker.pool != "gevent":
        pytest.skip(f"Celery's {worker.pool} pool has no time limits")
    lock = lock_for(app, f"gate-{key}")
    with lock.hold(timeout=5):
        waiter = tasks.pass_gate.apply_async((log.key, key), time_limit=0.5)
        waiter.get(timeout=RESULT_TIMEOUT_S, propagate=False)
        waiting = lock.status().waiting
    holder = tasks.hold_until_gate.apply_async((log.key, key, log.gate), time_limit=0.5)
    holder.get(timeout=RESULT_TIMEOUT_S, propagate=False)
    status = lock.status()

    assert isinstance(waiter.result, TimeLimitExceeded), waiter.result
    assert isinstance(holder.result, TimeLimitExceeded), holder.result
    assert waiting == 0 and not status.held and status.waiting == 0
    assert [e["event"] for e in log.entries()] == ["enter"]  # the holder's body only


def test_a_terminated_holder_frees_the_lock_at_once(worker: Worker, log: Log, key: str) -> None:
    """``revoke(terminate=True)`` kills the greenlet (``GreenletExit``): the
    body's lease is released, not left to expire."""
    holder = tasks.hold_until_gate.delay(log.key, key, log.gate)
    log.wait("entered", 1)
    started = time.monotonic()

    holder.revoke(terminate=True)
    fence = tasks.pass_gate.delay(log.key, key).get(timeout=RESULT_TIMEOUT_S)

    waited_s = time.monotonic() - started
    [entered, *_] = log.entries()

    assert fence > entered["fence"]
    # An expiring lease lasts at least two thirds of lease_ms after its last renewal.
    assert waited_s < tasks.LEASE_MS / 1000 * 2 / 3, f"the next holder waited {waited_s:.3f} s"


def handover(pool: str, mutant: str = "") -> dict[str, Any]:
    """What ``tests.support.green_guard`` saw in a ``pool``-patched process."""
    return _script_result("tests.support.green_guard", pool, *([mutant] if mutant else []))


@pytest.mark.parametrize("pool", [green(name) for name in GREEN_POOLS])
def test_a_guard_held_by_a_green_thread_passes_to_the_portal_thread(pool: str) -> None:
    assert handover(pool) == {"handed": True}


def test_the_handover_under_eventlet_kills_green_guards() -> None:
    if importlib.util.find_spec("eventlet") is None:
        pytest.skip("eventlet is not installed")
    assert handover("eventlet", "green-guards") == {"handed": False}, "green-guards passed"


def fork_and_use(url: str, mutant: str = "") -> subprocess.CompletedProcess[str]:
    """Run ``tests.support.green_fork`` (eventlet), with ``mutant`` applied if given."""
    if importlib.util.find_spec("eventlet") is None:
        pytest.skip("eventlet is not installed")
    args = [sys.executable, "-W", "ignore", "-m", "tests.support.green_fork", url]
    return subprocess.run(
        [*args, *([mutant] if mutant else [])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_eventlet_process_and_its_forked_child_both_keep_using_the_lock(
    redis_url: str,
) -> None:
    """A child forked from an eventlet process shares its hub's epoll: the
    child's copy of the parent's waker unregistered the parent's pipe there,
    and the parent hung in its next call (3 runs of 3) until the waker re-armed."""
    done = fork_and_use(redis_url)

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"before": 20, "after": 20, "child": 0}


FORK_MUTANT_RUNS = 8
"""The mutant hangs only when the child's wait ends while the parent waits
(9 runs of 12 measured): 8 runs all passing would happen about once in 60,000."""


def test_the_fork_kills_waker_never_rearms(redis_url: str) -> None:
    for _ in range(FORK_MUTANT_RUNS):
        done = fork_and_use(redis_url, "waker-never-rearms")
        if done.returncode != 0:
            break

    assert done.returncode != 0, f"waker-never-rearms passed {FORK_MUTANT_RUNS} runs"
    assert "Timeout (0:00:06)!" in done.stderr  # faulthandler: it hung
