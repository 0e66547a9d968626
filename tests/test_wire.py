"""How the lock's keys, arguments and channels reach Redis (``protocol.wired``).

The lock encodes a script call's keys and arguments itself, in UTF-8, since
redis-py's general encoder costs several times as much per argument; and it
subscribes to its doorbell channels in UTF-8 too. So a name means the same keys
and channels whatever encoding a client uses for its other commands, and a ring
reaches its waiter on a client that does not use UTF-8.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis._parsers.encoders import Encoder
from redis.asyncio import Redis

from redis_fifo_lock import FifoLock
from tests.support.polling import until


async def test_redis_py_gets_the_script_calls_already_encoded(
    redis_url: str, aredis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = FifoLock(aredis, "invoices")
    await lock.release(await lock.acquire())  # scripts loaded, hub and doorbell set up
    encoded: list[Any] = []
    original = Encoder.encode

    def spy(self: Encoder, value: Any) -> Any:
        if not isinstance(value, bytes):
            encoded.append(value)
        return original(self, value)

    monkeypatch.setattr(Encoder, "encode", spy)
    await lock.release(await lock.acquire())

    # Two script calls, each with the script's SHA and its key count left to
    # redis-py; keys, tokens, call ids, floors and integers arrive as bytes.
    assert len(encoded) <= 4, encoded


async def test_a_latin1_client_uses_the_same_keys_and_gets_its_rings(
    redis_url: str, aredis: Redis
) -> None:
    holder_client = Redis.from_url(redis_url, encoding="latin-1")
    waiter_client = Redis.from_url(redis_url, encoding="latin-1")
    try:
        # Two clients, two hubs: the grant to the waiter is rung, not handed
        # over in the release's reply, and no poll comes within the test.
        holder = FifoLock(holder_client, "café")
        waiter = FifoLock(waiter_client, "café")
        lease = await holder.acquire()
        assert await aredis.exists("fifolock:{café}:lease".encode()) == 1
        waiting = asyncio.create_task(waiter.acquire())
        await until(lambda: aredis.zcard("fifolock:{café}:queue".encode()), "the waiter queued")
        await holder.release(lease)
        granted = await asyncio.wait_for(waiting, timeout=10)
        assert granted.fence > lease.fence
        await waiter.release(granted)
    finally:
        await holder_client.aclose()
        await waiter_client.aclose()
