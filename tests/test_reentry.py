"""No waiting for yourself: asking again for a lock the same task or thread holds
or waits for raises ``LockUsageError`` at once (``redis_fifo_lock.reentry``)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from redis.asyncio import Redis

from redis_fifo_lock import FifoLock, LockTimeout, LockUsageError, LoopClients, SyncFifoLock
from tests.support.forking import FAILED, RAISED, RETURNED, needs_fork
from tests.support.polling import until

FAST = {"lease_ms": 2000, "poll_ms": 200}

# Before the check, the refused calls below waited for ever.
pytestmark = pytest.mark.timeout(60)


async def test_a_task_asking_again_for_a_lock_it_holds_is_refused_at_once(
    aredis: Redis,
) -> None:
    lock = FifoLock(aredis, "jobs", **FAST)
    async with lock.hold(timeout=5) as lease:
        with pytest.raises(LockUsageError) as info:
            await FifoLock(aredis, "jobs").acquire()
        assert (await lock.status()).waiting == 0
    message = str(info.value)
    assert message.startswith("FIFO lock 'jobs': already held (fence ")
    assert f"fence {lease.fence}) by asyncio task " in message
    assert "pid" in message
    assert "not reentrant" in message


async def test_other_names_and_namespaces_are_not_refused_and_a_held_token_is_in_use(
    aredis: Redis,
) -> None:
    async with FifoLock(aredis, "jobs", **FAST).hold(timeout=5) as lease:
        async with FifoLock(aredis, "other", **FAST).hold(timeout=5):
            pass
        async with FifoLock(aredis, "jobs", namespace="tenant", **FAST).hold(timeout=5):
            pass
        # Before, this "retry" of a held lease's token was handed the same grant:
        # two holders (see test_tokens.py).
        with pytest.raises(LockUsageError, match="already holds this lock"):
            await FifoLock(aredis, "jobs", **FAST).acquire(timeout=5, token=lease.token)


async def test_a_task_started_by_the_holder_waits_its_turn_and_gets_the_lock_after(
    aredis: Redis,
) -> None:
    lock = FifoLock(aredis, "jobs", **FAST)
    async with lock.hold(timeout=5) as first:
        child = asyncio.create_task(lock.acquire(timeout=10))
        await until(lambda: _waiting(lock), "the child task is queued")
    second = await asyncio.wait_for(child, 10)
    assert second.fence > first.fence
    await lock.release(second)


async def _waiting(lock: FifoLock) -> bool:
    return (await lock.status()).waiting == 1


async def test_a_child_task_started_by_a_released_holder_is_not_refused(
    aredis: Redis,
) -> None:
    lock = FifoLock(aredis, "jobs", **FAST)
    release = asyncio.Event()

    async def later() -> int:
        await release.wait()
        async with lock.hold(timeout=5) as lease:
            return lease.fence

    async with lock.hold(timeout=5):
        child = asyncio.create_task(later())
    release.set()
    assert await asyncio.wait_for(child, 10) > 0


async def test_the_same_task_may_take_the_lock_again_after_releasing_or_timing_out(
    aredis: Redis,
) -> None:
    lock = FifoLock(aredis, "jobs", **FAST)
    async with lock.hold(timeout=5):
        pass
    other = FifoLock(aredis, "jobs", **FAST)
    blocker = asyncio.create_task(other.acquire(timeout=5))
    held = await blocker
    with pytest.raises(TimeoutError):
        await lock.acquire(timeout=0.2)
    await other.release(held)
    async with lock.hold(timeout=5):
        pass


async def test_a_nested_request_with_a_timeout_still_times_out_as_it_always_did(
    aredis: Redis,
) -> None:
    lock = FifoLock(aredis, "jobs", **FAST)
    async with lock.hold(timeout=5) as lease:
        with pytest.raises(LockTimeout) as info:
            await lock.acquire(timeout=0.2)
        assert info.value.holder_fence == lease.fence
        with pytest.raises(LockUsageError, match="already held"):
            await lock.acquire()


def test_a_nested_sync_hold_of_the_same_lock_is_refused_in_the_caller_s_thread(
    redis_url: str,
) -> None:
    lock = SyncFifoLock(redis_url, "jobs", **FAST)
    with lock.hold(timeout=5) as lease:
        with pytest.raises(LockUsageError, match=r"already held \(fence \d+\) by thread"):
            SyncFifoLock(redis_url, "jobs").acquire()
        assert lock.status().waiting == 0
    with lock.hold(timeout=5) as again:
        assert again.fence > lease.fence


def test_async_to_sync_inside_a_sync_hold_is_refused(redis_url: str) -> None:
    clients = LoopClients(redis_url)

    async def nested() -> None:
        await FifoLock(clients, "jobs", **FAST).acquire()

    with (
        SyncFifoLock(clients, "jobs", **FAST).hold(timeout=5),
        pytest.raises(LockUsageError, match="already held"),
    ):
        async_to_sync(nested)()


async def test_a_lost_lease_no_longer_refuses_a_new_request_of_its_task(aredis: Redis) -> None:
    lock = FifoLock(aredis, "jobs", **FAST)
    lease = await lock.acquire()
    assert await FifoLock(aredis, "jobs").force_release() == lease.fence
    await asyncio.wait_for(lease.wait_lost(), 10)
    again = await lock.acquire()
    assert again.fence > lease.fence
    await lock.release(again)


async def test_sync_to_async_inside_an_async_hold_is_refused(aredis: Redis, redis_url: str) -> None:
    def nested() -> None:
        SyncFifoLock(redis_url, "jobs", **FAST).acquire()

    async with FifoLock(aredis, "jobs", **FAST).hold(timeout=5):
        with pytest.raises(LockUsageError, match="already held"):
            await sync_to_async(nested)()


@needs_fork
def test_a_child_forked_by_the_holder_waits_for_the_lock_like_any_other_process(
    redis_url: str,
) -> None:
    """A process forked while its parent holds the lock is another process: its
    untimed acquire waits for the parent's release, and is not refused as if it
    asked for the parent's lease again (the child inherits the parent's flow of
    control, and with it a copy of the claim)."""
    lock = SyncFifoLock(redis_url, "forked-reentry", **FAST)
    with lock.hold(timeout=5):
        pid = os.fork()
        if pid == 0:
            code = FAILED
            signal.alarm(30)  # a child that waits for ever dies of SIGALRM
            try:
                with SyncFifoLock(redis_url, "forked-reentry", **FAST).hold():
                    code = RETURNED
            except LockUsageError as exc:
                print(f"child: {exc}", file=sys.stderr)
                code = RAISED
            finally:
                sys.stderr.flush()
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == RETURNED
