"""What the renewal's lateness warning blames: the event loop only when it was blocked.

A renewal is due a third of a lease after the grant (or the last renewal) was
sent. It can find that moment passed for two reasons: the event loop ran
nothing for that long (a blocking call in a task), or Redis answered the grant
late. Only the first is the loop's fault, and only then may the warning tell
the user to stop blocking the loop.
"""

from __future__ import annotations

import logging
import time

import pytest
from redis.asyncio import Redis

from redis_fifo_lock import FifoLock
from tests.conftest import FaultProxyFactory
from tests.support.polling import until

LEASE_MS = 3000
"""Renewals every second; a renewal more than a second late is warned about."""

BLOCKED = "event loop was blocked"


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_blocked_loop_is_named(aredis: Redis, caplog: pytest.LogCaptureFixture) -> None:
    lock = FifoLock(aredis, "blocked-loop", lease_ms=LEASE_MS, poll_ms=1000)
    with caplog.at_level(logging.WARNING, logger="redis_fifo_lock"):
        lease = await lock.acquire(timeout=5)
        # The fault under test: the loop runs nothing, and the renewal due after
        # 1 s runs 1.3 s late.
        time.sleep(2.3)  # noqa: ASYNC251
        await until(lambda: _warnings(caplog), "the late renewal's warning")
        await lock.release(lease)
    assert any(BLOCKED in message for message in _warnings(caplog)), _warnings(caplog)


async def test_a_grant_answered_late_is_not_blamed_on_the_loop(
    redis_url: str, fault_proxy: FaultProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = fault_proxy(redis_url)
    client = Redis.from_url(proxy.url)
    try:
        lock = FifoLock(client, "slow-reply", lease_ms=LEASE_MS, poll_ms=1000)
        await lock.release(await lock.acquire(timeout=5))  # scripts loaded, checks made
        with caplog.at_level(logging.WARNING, logger="redis_fifo_lock"):
            proxy.delay("down", 2300)  # Redis grants at once; its reply comes 2.3 s later
            lease = await lock.acquire(timeout=5)
            proxy.delay("down", 0)  # before the renewal, due 1.3 s ago, is sent
            await until(lambda: _warnings(caplog), "the late renewal's warning")
            await lock.release(lease)
        warnings = _warnings(caplog)
        assert not any(BLOCKED in message for message in warnings), warnings
        assert any("reply to the grant" in message for message in warnings), warnings
    finally:
        await client.aclose()
