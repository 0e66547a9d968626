"""The eviction-policy check: re-done every few minutes, per lock, loud when denied."""

from __future__ import annotations

import asyncio
import logging

import pytest
from redis import Redis as SyncRedis
from redis.asyncio import Redis

from redis_fifo_lock import FifoLock, RedisUnavailable
from redis_fifo_lock.testing import PrivateRedisFactory

FAST = {"lease_ms": 600, "poll_ms": 100}


async def use(client: Redis, name: str) -> None:
    lock = FifoLock(client, name, **FAST)
    async with lock.hold(timeout=5):
        pass


def warned_locks(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The lock names of the eviction warnings logged so far, in order."""
    return [
        str(record.args[0])  # type: ignore[index]
        for record in caplog.records
        if record.levelno == logging.WARNING and "maxmemory-policy" in record.getMessage()
    ]


async def test_each_lock_first_used_on_an_evicting_server_is_named(
    fresh_redis_server: PrivateRedisFactory, caplog: pytest.LogCaptureFixture
) -> None:
    server = fresh_redis_server(["--maxmemory-policy", "allkeys-lru"])
    client = Redis.from_url(server.url)
    with caplog.at_level(logging.WARNING, "redis_fifo_lock"):
        for name in ("first", "second", "first", "third", "second"):
            await use(client, name)
    await client.aclose()

    assert warned_locks(caplog) == ["first", "second", "third"]


async def test_a_policy_changed_later_is_reported_after_the_recheck_interval(
    fresh_redis_server: PrivateRedisFactory,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from redis_fifo_lock import eviction

    monkeypatch.setattr(eviction, "RECHECK_S", 0.3)
    server = fresh_redis_server(["--maxmemory-policy", "noeviction"])
    admin = SyncRedis.from_url(server.url)
    client = Redis.from_url(server.url)
    with caplog.at_level(logging.WARNING, "redis_fifo_lock"):
        await use(client, "before")
        admin.config_set("maxmemory-policy", "volatile-lru")
        await use(client, "within-interval")  # not re-checked yet
        await asyncio.sleep(0.4)
        await use(client, "after")
        await use(client, "before")  # first use since the policy became unsafe
        await use(client, "after")
        admin.config_set("maxmemory-policy", "noeviction")
        await asyncio.sleep(0.4)
        await use(client, "safe-again")
    await client.aclose()
    admin.close()

    assert warned_locks(caplog) == ["after", "before"]
    assert "'volatile-lru'" in caplog.records[-1].getMessage()


async def test_a_denied_config_get_is_one_warning_per_server(
    fresh_redis_server: PrivateRedisFactory, caplog: pytest.LogCaptureFixture
) -> None:
    server = fresh_redis_server(["--maxmemory-policy", "allkeys-lru"])
    admin = SyncRedis.from_url(server.url)
    admin.execute_command(
        "ACL", "SETUSER", "locker", "on", ">locker-pw", "~*", "&*", "+@all", "-config"
    )
    url = server.url.replace("redis://", "redis://locker:locker-pw@")
    with caplog.at_level(logging.DEBUG, "redis_fifo_lock"):
        for name in ("one", "two"):
            client = Redis.from_url(url)  # a new client (and hub) each time
            await use(client, name)
            await client.aclose()
    admin.close()

    about = [r for r in caplog.records if "eviction policy" in r.getMessage()]
    assert [r.levelno for r in about] == [logging.WARNING]
    message = about[0].getMessage()
    assert "CONFIG GET" in message and "could not be checked" in message
    assert "locker-pw" not in message


async def test_a_database_the_server_lacks_is_not_taken_for_a_refused_config_get(
    fresh_redis_server: PrivateRedisFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Every call fails there ("DB index is out of range", when the connection
    selects its database): the lock raises that, and says nothing about
    CONFIG GET being refused, which it is not."""
    server = fresh_redis_server()
    client = Redis.from_url(server.url.rsplit("/", 1)[0] + "/99")
    with caplog.at_level(logging.DEBUG, "redis_fifo_lock"), pytest.raises(RedisUnavailable):
        await use(client, "nowhere")
    await client.aclose()

    assert not [r for r in caplog.records if "CONFIG GET" in r.getMessage()]
