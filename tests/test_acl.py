"""A restricted ACL user: scripts that fail leave nothing behind.

Issue 11, item 5. Redis does not roll a script back when a command inside it
fails: whatever it wrote before stays. A user whose channel permissions deny
``PUBLISH`` (``resetchannels``) makes the doorbell ring fail inside a script;
the lock must never leave a grant (or any other change) behind a script call
that failed, and when the call succeeds, the lock stays consistent: the next
waiter still gets the lock, at worst after its poll.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from urllib.parse import urlsplit

import pytest
from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from redis_fifo_lock import FifoLock, Lease, LockError
from tests.support.polling import until

pytestmark = pytest.mark.timeout(60)

USER, PASSWORD = "restricted", "s3cret-pw"
SETTINGS = {"lease_ms": 5000, "poll_ms": 250}


@pytest.fixture
def restricted_user(redis: Redis) -> Iterator[str]:
    """A user allowed every command and key but no pub/sub channel; its name."""
    redis.acl_setuser(
        USER,
        enabled=True,
        passwords=[f"+{PASSWORD}"],
        keys=["*"],
        commands=["+@all"],
        reset_channels=True,
    )
    try:
        yield USER
    finally:
        redis.acl_deluser(USER)


@pytest.fixture
async def clients(redis_url: str) -> AsyncIterator[Callable[[bool], AsyncRedis]]:
    """Makes clients of the test server: as the restricted user (True) or the default."""
    made: list[AsyncRedis] = []
    parts = urlsplit(redis_url)

    def make(restricted: bool) -> AsyncRedis:
        client = AsyncRedis(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 6379,
            username=USER if restricted else None,
            password=PASSWORD if restricted else None,
        )
        made.append(client)
        return client

    yield make
    for client in made:
        await client.aclose()


async def test_an_acquire_that_fails_on_a_denied_publish_leaves_no_grant_behind(
    restricted_user: str, aredis: AsyncRedis, clients: Callable[[bool], AsyncRedis]
) -> None:
    restricted = FifoLock(clients(True), "acl-acquire", **SETTINGS)
    try:
        lease: Lease | None = await restricted.acquire(timeout=2)
    except LockError as exc:
        lease, failure = None, exc
    if lease is None:
        held_by = await aredis.hget(restricted.keys.key("lease"), "token")
        queued = await aredis.zcard(restricted.keys.key("queue"))
        assert (held_by, queued) == (None, 0), (
            f"the acquire failed ({failure}) but left holder {held_by!r} and {queued} queued"
        )
    else:
        await restricted.release(lease)
    other = FifoLock(clients(False), "acl-acquire", **SETTINGS)
    started = time.monotonic()
    lease_o = await other.acquire(timeout=SETTINGS["lease_ms"] / 1000 + 2)
    took = time.monotonic() - started
    await other.release(lease_o)
    assert took < 1.0, f"the free lock took {took:.1f} s to get (a grant was left behind)"


async def test_a_release_by_a_user_who_may_not_publish_fails_without_effect_or_hands_on(
    restricted_user: str, aredis: AsyncRedis, clients: Callable[[bool], AsyncRedis]
) -> None:
    holder = FifoLock(clients(False), "acl-release", **SETTINGS)
    restricted = FifoLock(clients(True), "acl-release", **SETTINGS)
    nxt = FifoLock(clients(False), "acl-release", **SETTINGS)
    lease_h = await holder.acquire(timeout=2)
    # The restricted user waits (no doorbell for it: it polls) and is handed the
    # lock by the holder's release, which the default user may ring.
    getting = asyncio.create_task(restricted.acquire(timeout=10, token="r"))
    await until(lambda: _queued(aredis, restricted, "r"), "r is queued")
    await holder.release(lease_h)
    lease_r = await getting
    waiting = asyncio.create_task(nxt.acquire(timeout=15, token="n"))
    await until(lambda: _queued(aredis, nxt, "n"), "n is queued")
    released = time.monotonic()
    try:
        await restricted.release(lease_r)  # its hand-off to n would ring n's doorbell
    except LockError as exc:
        held_by = await aredis.hget(restricted.keys.key("lease"), "token")
        queued = await aredis.zscore(restricted.keys.key("queue"), "n")
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert held_by == b"r" and queued is not None, (
            f"the release failed ({exc}) yet changed the lock: holder {held_by!r}, n queued "
            f"{queued is not None}"
        )
        return
    done, _ = await asyncio.wait({waiting}, timeout=SETTINGS["poll_ms"] / 1000 + 1.0)
    assert done, "the release succeeded but the next waiter was not granted the lock"
    took = time.monotonic() - released
    await nxt.release(waiting.result())
    assert took < SETTINGS["poll_ms"] / 1000 + 1.0


async def _queued(admin: AsyncRedis, lock: FifoLock, token: str) -> bool:
    return await admin.zscore(lock.keys.key("queue"), token) is not None
