"""Found by an outside attack: a forged doorbell ring that carries the waiter's call id makes
``acquire()`` return while another process holds the lock.

README ("What it guarantees"): "A doorbell ring only wakes a waiter: it then
claims its grant with a script call of its own, so a late, repeated or forged
ring can never make ``acquire`` return."

In fact a 5-field ring ``<token> <fence> <ticket> <pttl_ms> <call>`` whose call
id matches is taken without any claim (``Lock._take_granted``), when it comes
within lease_ms/6 of the acquire. The call id is no secret: it sits in the
``waiters`` hash (``HGET fifolock:{name}:waiters <token>``) and the ticket in the
queue (``ZSCORE``), both readable with exactly the rules of ``acl_rules()``
(``+hget +zscore +zrange ~fifolock:*``), as is ``+publish &fifolock:*``.
So any other user of the lock's ACL can forge a grant (here: fence 999).

Rings now carry a proof signed with a secret of the acquire call (its ring
key), and only a signed ring is taken without a claim. The forger here knows the
call id and ticket, not the ring key. (The ring key sits in the same hash: a user
who may read it may also ``DEL`` the lease key with the lock's rules, and no
lock can keep out a user allowed to write its keys; docs/security.md.)
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from redis.asyncio import Redis as AsyncRedis

from redis_fifo_lock import FifoLock, LockError
from tests.support.polling import until
from tests.support.rings import forged_ring

pytestmark = pytest.mark.timeout(60)


async def test_a_forged_ring_carrying_the_call_id_makes_acquire_return(
    aredis: AsyncRedis, redis_url: str
) -> None:
    settings = {"lease_ms": 6000, "poll_ms": 3000}
    c1, c2 = AsyncRedis.from_url(redis_url), AsyncRedis.from_url(redis_url)
    try:
        holder = FifoLock(c1, "forged-call", **settings)
        waiter = FifoLock(c2, "forged-call", **settings)
        lease_h = await holder.acquire(timeout=5)
        acquiring = asyncio.create_task(waiter.acquire(timeout=20, token="w"))
        await until(lambda: aredis.zscore(waiter.keys.key("queue"), "w"), "w is queued")

        async def doorbells() -> list[bytes]:
            return list(await aredis.pubsub_channels("*doorbell*"))

        await until(doorbells, "w's doorbell is subscribed")
        channel, ring = await forged_ring(aredis, waiter.keys, "w", 999)
        assert await aredis.publish(channel, ring) == 1
        done, _ = await asyncio.wait({acquiring}, timeout=1.0)
        try:
            assert not done, (
                f"acquire() returned {acquiring.result()!r} on a forged ring while "
                f"the holder (fence {lease_h.fence}) was inside"
            )
        finally:
            await holder.release(lease_h)
            with contextlib.suppress(LockError):
                await waiter.release(await acquiring)
    finally:
        await c1.aclose()
        await c2.aclose()
