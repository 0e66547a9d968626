"""The sync facade: the same async core, driven from threads and sync code."""

from __future__ import annotations

import contextvars
import gc
import logging
import multiprocessing
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff

from redis_fifo_lock import Lease, LeaseLost, LockTimeout, LockUsageError, SyncFifoLock
from redis_fifo_lock.holding import release_retrying
from redis_fifo_lock.holds import violations
from redis_fifo_lock.portal import portal
from redis_fifo_lock.testing import PrivateRedisFactory
from tests.conftest import FaultProxyFactory
from tests.support.forking import RAISED, in_child, needs_fork
from tests.support.polling import until_sync
from tests.support.proxy import FaultProxy, OutageEndsAtRetry
from tests.support.record import Record


def test_threads_never_overlap_while_holds_span_many_polls(redis_url: str, tmp_path: Path) -> None:
    lock = SyncFifoLock(redis_url, "threads", lease_ms=600, poll_ms=100)
    record = Record(tmp_path / "record")

    def work() -> None:
        for _ in range(3):
            with lock.hold() as lease:
                record.enter(lease)
                time.sleep(0.12)  # the hold under test: longer than a poll interval
                record.exit(lease)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    holds = record.holds()
    assert len(holds) == 18
    assert violations(holds) == []


def test_the_lease_is_renewed_while_the_sync_body_runs(redis_url: str) -> None:
    lock = SyncFifoLock(redis_url, "long-sync", lease_ms=300, poll_ms=100)
    with lock.hold() as lease:
        time.sleep(1.2)  # the hold under test: four lease lengths without yielding to us
        assert not lease.lost
        assert lock.status().holder_fence == lease.fence


def test_a_sync_timeout_raises_lock_timeout(redis_url: str) -> None:
    lock = SyncFifoLock(redis_url, "sync-timeout", lease_ms=600, poll_ms=100)
    with lock.hold() as lease, pytest.raises(LockTimeout) as caught:
        lock.acquire(timeout=0.1)
    assert caught.value.holder_fence == lease.fence
    assert lock.status().waiting == 0


def test_a_lost_sync_lease_raises_lease_lost(redis_url: str) -> None:
    import redis

    lock = SyncFifoLock(redis_url, "sync-lost", lease_ms=300, poll_ms=100)
    lease = lock.acquire()
    redis.Redis.from_url(redis_url).delete("fifolock:{sync-lost}:lease")
    with pytest.raises(LeaseLost):
        lock.release(lease)


def test_calling_from_the_portal_thread_is_refused_with_a_hint(redis_url: str) -> None:
    lock = SyncFifoLock(redis_url, "reentrant", lease_ms=600, poll_ms=100)

    async def inside_the_portal() -> None:
        lock.acquire()

    with pytest.raises(LockUsageError, match="FifoLock"):
        portal().call("reentrant", inside_the_portal)


def _child(url: str, queue: multiprocessing.Queue[int]) -> None:
    lock = SyncFifoLock(url, "forked", lease_ms=600, poll_ms=100)
    with lock.hold() as lease:
        queue.put(lease.fence)


def test_a_forked_child_builds_its_own_portal_and_client(redis_url: str) -> None:
    lock = SyncFifoLock(redis_url, "forked", lease_ms=600, poll_ms=100)
    with lock.hold() as first:
        first_fence = first.fence  # the parent's portal and client now exist
    context = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[int] = context.Queue()
    child = context.Process(target=_child, args=(redis_url, queue))
    child.start()
    child_fence = queue.get(timeout=20)
    child.join(timeout=20)
    assert child.exitcode == 0
    with lock.hold() as lease:
        assert lease.fence > child_fence > first_fence


class Interrupted(Exception):
    """Raised by a signal handler, as KeyboardInterrupt or a soft time limit is."""


# The handler's exception can also land in a garbage-collection callback, which
# Python reports as unraisable; that is the fault's noise, not the lock's.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_interrupted_sync_acquire_never_leaves_the_lock_held(redis_url: str) -> None:
    import random
    import signal

    lock = SyncFifoLock(redis_url, "interrupted", lease_ms=600, poll_ms=100)

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    rng = random.Random(7)
    try:
        for _ in range(60):
            lease = None
            try:
                try:
                    signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.0001, 0.003))
                    lease = lock.acquire()
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except Interrupted:
                pass  # inside acquire, or around it (the timer is one-shot)
            if lease is not None:
                lock.release(lease)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    status = lock.status()
    assert (status.held, status.waiting) == (False, 0), status


def _interrupted_during_the_release_retries(proxy: FaultProxy, *, again: bool = False) -> bool:
    """A ``hold()`` whose release meets an outage, its caller interrupted (a
    soft time limit, Ctrl-C) while the release waits to try again: whether
    the lock is free within a few seconds (its lease is 30 s). With ``again``,
    the thread first takes the lock again at once, without a timeout."""
    lock = SyncFifoLock(proxy.url, "interrupted-release", lease_ms=30_000, poll_ms=5000)
    # The outage ends at the first retry, and the main thread is interrupted
    # (SIGALRM, whose handler raises Interrupted) while it waits for it.
    handler = OutageEndsAtRetry(proxy, then=lambda: signal.setitimer(signal.ITIMER_REAL, 0.01))
    logger = logging.getLogger("redis_fifo_lock")
    logger.addHandler(handler)
    previous = signal.signal(signal.SIGALRM, _raise_interrupted)
    try:
        with pytest.raises(Interrupted), lock.hold(timeout=5):
            proxy.max_connections = 0  # Redis out of reach until the first retry
            proxy.reset()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        logger.removeHandler(handler)
    if again:
        lock.release(lock.acquire())
    try:
        until_sync(lambda: not lock.status().held, "the lock free", 5)
    except AssertionError:
        lock.force_release()
        return False
    return True


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted


def test_a_hold_interrupted_while_its_release_retries_still_releases(
    fault_proxy: FaultProxyFactory, redis_url: str
) -> None:
    assert _interrupted_during_the_release_retries(fault_proxy(redis_url))


def test_the_thread_of_an_interrupted_hold_may_take_the_lock_again_at_once(
    fault_proxy: FaultProxyFactory, redis_url: str
) -> None:
    """helper-32: the reentry check took the lease whose release went on in
    the background for one the thread still held, and refused an untimed
    acquire ("would wait for itself for ever") until that release ended."""
    assert _interrupted_during_the_release_retries(fault_proxy(redis_url), again=True)


def _released_with_its_caller(self: SyncFifoLock, lease: Lease) -> None:
    """MUTANT release-cancelled-with-caller: the retried release runs as the
    caller's own call on the portal, so interrupting the caller cancels it and
    the lock stays held until its lease runs out (the bug before this test)."""

    async def run() -> None:
        await release_retrying(self._lock(), lease)

    portal().call(self.name, run)


def test_a_hold_interrupted_while_its_release_retries_kills_release_cancelled_with_caller(
    fault_proxy: FaultProxyFactory, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(SyncFifoLock, "release_retrying", _released_with_its_caller)
    assert not _interrupted_during_the_release_retries(fault_proxy(redis_url))


@pytest.mark.parametrize("lease", ["x", None, 7])
def test_release_retrying_refuses_what_is_not_a_lease_as_release_does(
    redis_url: str, lease: object
) -> None:
    lock = SyncFifoLock(redis_url, "not-a-lease")
    with pytest.raises(LockUsageError, match="not a lease of this lock"):
        lock.release_retrying(lease)  # type: ignore[arg-type]


@needs_fork
def test_a_forked_child_leaving_the_sync_hold_cannot_release_the_parents_lease(
    redis_url: str,
) -> None:
    lock = SyncFifoLock(redis_url, "forked-sync-hold", lease_ms=6000, poll_ms=1000)
    hold = lock.hold()
    lease = hold.__enter__()

    def leave_the_hold() -> None:
        try:
            hold.__exit__(None, None, None)
        except LockUsageError as exc:
            assert "forked-sync-hold" in str(exc)
            raise

    assert in_child(leave_the_hold, LockUsageError) == RAISED
    status = lock.status()
    assert (status.holder_fence, status.last_fence, status.waiting) == (lease.fence, lease.fence, 0)
    hold.__exit__(None, None, None)  # the parent's own release still works
    assert not lock.status().held


class BodyFailed(Exception):
    """What the body of a hold raises in the test below."""


def test_the_sync_hold_keeps_the_body_error_retries_the_release_and_attaches_its_failure(
    redis_url: str,
) -> None:
    import redis

    from redis_fifo_lock import LoopClients

    admin = redis.Redis.from_url(redis_url)
    # Replies slower than 0.2 s time out, and redis-py does not retry on its own.
    clients = LoopClients(redis_url, socket_timeout=0.2, retry=AsyncRetry(NoBackoff(), 0))
    lock = SyncFifoLock(clients, "sync-body-error", lease_ms=30_000, poll_ms=5000)
    try:
        with pytest.raises(BodyFailed) as caught, lock.hold():
            # Scripts wait for 0.5 s: the first release times out, a retry gets in.
            admin.execute_command("CLIENT", "PAUSE", 500, "WRITE")
            raise BodyFailed("the body's own error")
        assert getattr(caught.value, "fifolock_release_error", None) is None
        assert not lock.status().held  # freed now, not in lease_ms (30 s)

        with pytest.raises(BodyFailed) as caught, lock.hold():
            admin.delete("fifolock:{sync-body-error}:lease")  # the release fails: LeaseLost
            raise BodyFailed("the body's own error")
        assert isinstance(caught.value.fifolock_release_error, LeaseLost)  # type: ignore[attr-defined]
        if sys.version_info >= (3, 11):
            assert any("LeaseLost" in note for note in caught.value.__notes__)
    finally:
        admin.close()


REQUEST: contextvars.ContextVar[object] = contextvars.ContextVar("request")


class RequestState:
    """Stands for what a request keeps in context variables (ids, spans, a cache)."""


def test_a_sync_callers_context_is_not_kept_after_its_call(redis_url: str) -> None:
    # Run in a new process, so that the first caller there also starts the
    # portal and opens its connections, as the first request of a server does.
    script = """
import contextvars, gc, sys, weakref
from redis_fifo_lock import SyncFifoLock
from tests.test_sync import REQUEST, RequestState

lock = SyncFifoLock(sys.argv[1], "context", lease_ms=6000, poll_ms=1000)

def request():
    state = RequestState()
    REQUEST.set(state)
    with lock.hold():
        pass
    return weakref.ref(state)

kept = [contextvars.Context().run(request) for _ in range(3)]
gc.collect()
print(sum(ref() is not None for ref in kept))
"""
    done = subprocess.run(
        [sys.executable, "-c", script, redis_url],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0", "requests whose context outlived them"


PER_LOOP_CONNECTIONS = 4
"""Most connections one process's locks on one server may hold per event loop
(the project's bound: 10,000 idle waiters in one process on at most 4)."""


def server_connections(url: str) -> int:
    """How many clients the server at ``url`` has, the probe asking left out."""
    probe = redis.Redis.from_url(url)
    try:
        return len(probe.client_list()) - 1
    finally:
        probe.close()


def test_sync_locks_built_from_one_url_share_the_portals_connections(
    fresh_redis_server: PrivateRedisFactory,
) -> None:
    # A server of its own: no other test's portal client is connected to it.
    url = fresh_redis_server().url
    before = server_connections(url)
    kept = []
    for n in range(50):
        lock = SyncFifoLock(url, f"per-request-{n % 3}", lease_ms=3000, poll_ms=1000)
        with lock.hold(timeout=5):
            pass
        if n % 2:
            kept.append(lock)  # half kept alive, half left to the garbage collector
    gc.collect()
    extra = server_connections(url) - before
    assert extra <= PER_LOOP_CONNECTIONS, f"50 locks from one URL hold {extra} connections"
    assert SyncFifoLock(url, "a").clients is SyncFifoLock(url, "b").clients
    other = SyncFifoLock(f"{url}?socket_timeout=2", "a")
    assert other.clients is not kept[0].clients, "other options need a client of their own"
