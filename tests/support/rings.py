"""Forged doorbell rings, as someone who may PUBLISH on the lock's channels would send.

The forger knows everything the lock's keys show about a queued request (its
session, acquire call and ticket: an admin client reads them here) except the
secret the request's acquire call sent (its ring key), so it signs the ring
with a key of its own. The lock must take such a ring as a hint at most.
"""

from __future__ import annotations

from redis.asyncio import Redis

from redis_fifo_lock.protocol import Grant, LockKeys, new_ring_key, ring_proof


async def forged_ring(admin: Redis, keys: LockKeys, token: str, fence: int) -> tuple[str, str]:
    """(channel, message) of a well-formed ring granting queued request ``token``
    fence ``fence`` with a 60 s lease, signed with a key the forger made up."""
    meta = (await admin.hget(keys.key("waiters"), token) or b"").decode()
    session, _lease_ms, _max_hold_ms, call = meta.split(" ")[:4]
    ticket = int(await admin.zscore(keys.key("queue"), token) or 0)
    grant = Grant(fence, ticket, 60_000, call, 0)
    proof = ring_proof(new_ring_key(), token, grant)
    message = f"{token} {fence} {ticket} 60000 {call} 0 {proof}"
    return keys.doorbell_of(session), message
