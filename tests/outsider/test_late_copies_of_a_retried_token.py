"""Found by an outside attack: a late copy of an acquire whose reply was lost, followed by a late
copy of its ticket-0 withdrawal, gives away a *later* grant of the same token.

README ("Idempotence"): Redis executing a copy of an acquire ... or withdrawal
late or twice ... never gives away a later request of the same token.

acquire.lua checks "is this token held / queued" *before* it checks whether
(token, call) already ended, so a late copy of call A adopts the later grant
of call B (it rewrites the lease's ``call`` to A). A late copy of A's
withdrawal (ticket 0: A's reply never arrived, so it withdraws "the request made
by call A") then matches the lease and ends it: B's holder still believes it
holds the lock, and the next waiter is granted beside it.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from redis.asyncio import Redis as AsyncRedis

from redis_fifo_lock import FifoLock, LeaseLost, LockError
from tests.support.polling import until
from tests.support.replay import ScriptCalls

pytestmark = pytest.mark.timeout(60)


async def test_late_acquire_then_late_ticket0_withdraw_gives_away_a_later_grant(
    aredis: AsyncRedis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = ScriptCalls(monkeypatch)
    settings = {"lease_ms": 5000, "poll_ms": 500}
    c1, c2 = AsyncRedis.from_url(redis_url), AsyncRedis.from_url(redis_url)
    try:
        lock = FifoLock(c1, "late-by-call", **settings)
        nxt = FifoLock(c2, "late-by-call", **settings)
        await lock.release(await lock.acquire(timeout=5))  # scripts loaded, eviction checked
        # 1. The first acquire of token v gets no reply: the server is paused.
        await aredis.execute_command("CLIENT", "PAUSE", "1500", "ALL")
        mark = calls.mark()
        with pytest.raises(LockError):
            await lock.acquire(timeout=0.1, token="v")  # outcome unknown: ticket 0
        await asyncio.sleep(1.6)  # the pause ends; the pending withdrawal is done
        copies = calls.since(mark, mentioning="v")
        # Expected: v's acquire (call A) and its withdrawal (v, ticket 0, call A).
        assert len(copies) >= 2, f"script calls naming v: {[c.args for c in copies]}"
        # 2. The caller retries with the same token, and holds the lock.
        lease_v = await lock.acquire(timeout=5, token="v")
        waits = asyncio.create_task(nxt.acquire(timeout=15, token="n"))
        await until(lambda: aredis.zscore(nxt.keys.key("queue"), "n"), "n is queued")
        # 3. The first call's copies (its acquire, its withdrawal) arrive late.
        for copy in copies:
            with contextlib.suppress(Exception):
                await copy.replay(aredis)
        held_by = await aredis.hget(lock.keys.key("lease"), "token")
        done, _ = await asyncio.wait({waits}, timeout=1.0)
        try:
            assert not lease_v.lost
            assert held_by == b"v", (
                f"after late copies of v's first call the lock is held by {held_by!r}, "
                "while v's later grant still believes it holds it"
            )
            assert not done, "n was granted while v still held the lock: two holders"
        finally:
            with contextlib.suppress(LeaseLost):
                await lock.release(lease_v)
            lease_n = await waits
            await nxt.release(lease_n)
    finally:
        await c1.aclose()
        await c2.aclose()
