"""Bounded state: lock names cost nothing once idle, stay small when hot, and
their fences never go backwards.

Issue 11, item 6. Every key of a name expires once the name has been idle (no
holder, no waiter) for ``max(2 * lease_ms, 10_000)`` ms; one process keeps one
liveness session per client and loop, not one per wait; and fences rise
strictly per name even after its keys expired or were flushed (fence =
``max(previous + 1, server clock in µs)``, below 2**53).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from benchmarks.keyspace import measure, name_footprint
from redis_fifo_lock import FifoLock, LockUsageError
from redis_fifo_lock.waiting import hub_for

pytestmark = pytest.mark.timeout(120)

SETTINGS = {"lease_ms": 1000, "poll_ms": 500}
IDLE_WINDOW_S = max(2 * SETTINGS["lease_ms"], 10_000) / 1000
"""How long a name with lease_ms 1000 may keep keys once idle (the contract's window)."""
SLACK_S = 5.0
MAX_FENCE = 2**53


def persistent_keys(client: Redis, sample: int = 200) -> list[str]:
    """Up to ``sample`` lock keys that have no TTL (they would never expire)."""
    found = []
    for key in client.scan_iter(match="fifolock:*", count=1000):
        if client.pttl(key) == -1:
            found.append(key.decode() if isinstance(key, bytes) else str(key))
            if len(found) >= sample:
                break
    return found


async def test_two_thousand_names_used_once_leave_no_key_within_a_minute_and_fences_still_rise(
    redis: Redis, aredis: AsyncRedis
) -> None:
    fences: dict[str, int] = {}
    for n in range(2000):
        lock = FifoLock(aredis, f"invoice-{n}", **SETTINGS)
        lease = await lock.acquire(timeout=5)
        await lock.release(lease)
        if n % 400 == 0:
            fences[lock.name] = lease.fence
    idle_since = time.monotonic()
    left = int(redis.dbsize())
    while left and time.monotonic() - idle_since < 60:
        if time.monotonic() - idle_since > IDLE_WINDOW_S + SLACK_S:
            # Past the window, a key without a TTL can never go: no need to wait on.
            never = persistent_keys(redis)
            assert never == [], (
                f"{left} keys of 2,000 idle names are left {IDLE_WINDOW_S + SLACK_S:g} s after "
                f"their last use, and keys like {never[:4]} have no TTL at all"
            )
        time.sleep(0.5)  # noqa: ASYNC251 - Redis expires keys by its own clock; nothing to await
        left = int(redis.dbsize())
    assert left == 0, f"{left} keys of 2,000 names used once are left after 60 s"
    for name, before in fences.items():
        lock = FifoLock(aredis, name, **SETTINGS)
        lease = await lock.acquire(timeout=5)
        await lock.release(lease)
        assert before < lease.fence < MAX_FENCE, (
            f"{name}: fence {lease.fence} after its keys expired, {before} before"
        )


async def test_five_thousand_acquires_of_one_name_from_fresh_lock_objects_keep_it_small(
    redis: Redis, aredis: AsyncRedis
) -> None:
    name = "hot"
    for _ in range(5000):
        lock = FifoLock(aredis, name, **SETTINGS)  # fresh objects, one client and loop
        lease = await lock.acquire(timeout=5)
        await lock.release(lease)
    alive = lock.keys.key("alive")
    raw_kind = redis.type(alive)
    kind = raw_kind.decode() if isinstance(raw_kind, bytes) else str(raw_kind)
    sessions = {"zset": redis.zcard, "hash": redis.hlen, "set": redis.scard}.get(kind)
    count = 0 if kind == "none" or sessions is None else int(sessions(alive))
    assert count <= 5, f"the name's liveness record holds {count} sessions after 5,000 acquires"
    # Right after the uses, not after some time: the record of ended requests
    # keeps only those their process still speaks of, not all of recent ones.
    keys, size = name_footprint(redis, name)
    assert size < 20_000, f"5,000 uses of one name left {keys} keys, {size} bytes"


async def test_requests_timing_out_behind_a_long_hold_leave_no_records(
    redis: Redis, aredis: AsyncRedis
) -> None:
    name = "held-long"
    holder = FifoLock(aredis, name, **SETTINGS)
    lease = await holder.acquire(timeout=5)
    for _ in range(1000):
        with pytest.raises(TimeoutError):
            await FifoLock(aredis, name, **SETTINGS).acquire(timeout=0)
    keys, size = name_footprint(redis, name)
    assert lease.lost is False
    await holder.release(lease)
    assert size < 20_000, f"1,000 timed-out requests behind one hold left {keys} keys, {size} bytes"


async def test_a_late_copy_of_an_acquire_whose_record_is_gone_changes_nothing(
    redis: Redis, aredis: AsyncRedis
) -> None:
    """The record of a request goes once its process's floor passes it; a copy
    of its acquire arriving after that (a re-send held up in the network) is
    still refused, and queues nothing."""
    lock = FifoLock(aredis, "late-floor", **SETTINGS)
    lease = await lock.acquire(timeout=5, token="once")
    await lock.release(lease)
    for _ in range(3):  # the floor moves past the first request
        await lock.release(await lock.acquire(timeout=5))
    finished = [m.decode() for m in redis.zrange(lock.keys.key("finished"), 0, -1)]
    assert not [m for m in finished if m.startswith(lease.call + " ")], finished
    session = hub_for(aredis).session_for(lock.settings)
    with pytest.raises(LockUsageError, match="already ended"):
        await lock._protocol.acquire(
            aredis, lock.keys, "once", session, lock.settings, call=lease.call, floor=lease.call
        )
    status = await lock.status()
    assert (status.held, status.waiting) == (False, 0)


async def test_fences_keep_rising_after_flushall(redis: Redis, aredis: AsyncRedis) -> None:
    lock = FifoLock(aredis, "flushed", **SETTINGS)
    for _ in range(3):
        lease = await lock.acquire(timeout=5)
        await lock.release(lease)
    before = lease.fence
    redis.flushall()  # as Django's cache.clear() on a shared server does
    lease = await lock.acquire(timeout=5)
    await lock.release(lease)
    assert before < lease.fence < MAX_FENCE, (
        f"the first fence after FLUSHALL is {lease.fence}; the last one before was {before}"
    )


def test_a_name_costs_bytes_while_held_and_none_after_its_idle_window(
    redis: Redis, redis_url: str
) -> None:
    figures = measure(redis_url, waiters=10, lease_ms=1000, idle_timeout_s=IDLE_WINDOW_S + 10)
    print(f"bytes per lock name: {figures}")
    assert figures["held_bytes"] > 0
    assert (figures["idle_keys"], figures["idle_bytes"]) == (0, 0), (
        f"{figures['idle_keys']} keys ({figures['idle_bytes']} B) of a name are left "
        f"{figures['idle_window_s']:g} s after its last use; live it took "
        f"{figures['held_bytes']} B, right after release {figures['released_bytes']} B"
    )


def test_a_process_using_a_new_event_loop_per_call_keeps_one_record_of_its_own(
    redis: Redis, redis_url: str
) -> None:
    """Calls ids and floors are per process, not per event loop: 300 uses of a
    name, each in an ``asyncio.run`` of its own (a new hub and session every
    time, as with ``async_to_sync`` per request), leave a couple of entries in
    the record of ended requests, not two per loop (whose first script would
    also make Redis scan all of them)."""

    async def use() -> None:
        client = AsyncRedis.from_url(redis_url)
        try:
            lock = FifoLock(client, "loop-per-call", **SETTINGS)
            await lock.release(await lock.acquire(timeout=5))
        finally:
            await client.aclose()

    for _ in range(300):
        asyncio.run(use())
    entries = int(redis.zcard("fifolock:{loop-per-call}:finished"))
    assert entries <= 4, f"300 event loops of one process left {entries} entries"


async def test_losses_stay_from_floors_for_keep_ms_and_go_after(
    redis: Redis, aredis: AsyncRedis
) -> None:
    """A loss is recorded by another script than its holder's (here: evictions),
    while a floor the holder's process sent before the grant may still be on
    its way; so no floor sweeps it for keep_ms. After that it goes with the
    process's next floor, as any record: 100 losses of a process that never
    releases them (as one that dropped its leases) leave no records."""
    lock = FifoLock(aredis, "untold-losses", **SETTINGS)
    protocol, keys, settings = lock._protocol, lock.keys, lock.settings
    session = "untold-session"

    def call(n: int) -> str:
        return f"proc/{n:012x}"

    def losses() -> list[str]:
        records = [m.decode() for m in redis.zrange(keys.key("finished"), 0, -1)]
        return [m for m in records if m.startswith("proc/") and m.split(" ")[1] == "2"]

    async def floor(n: int) -> None:
        """A request of the process, granted and released: its floor passes 1..n-1."""
        grant, _, _, _ = await protocol.acquire(
            aredis, keys, f"r{n}", session, settings, call=call(n), floor=call(n)
        )
        assert grant is not None
        await protocol.release(
            aredis, keys, f"r{n}", grant.fence, settings.keep_ms, call(n), session, call(n)
        )

    for n in range(1, 101):
        grant, _, _, _ = await protocol.acquire(
            aredis, keys, f"w{n}", session, settings, call=call(n), floor=call(n)
        )
        assert grant is not None
        assert await lock.force_release(grant.fence) == grant.fence
    await floor(101)
    assert len(losses()) == 100, "a floor swept losses recorded a moment ago"
    # The time under test passes; another process keeps the name in use.
    swept_after = time.monotonic() + settings.keep_ms / 1000 + 0.5
    while time.monotonic() < swept_after:
        await lock.release(await lock.acquire(timeout=5))
        await asyncio.sleep(0.5)
    await floor(102)
    assert losses() == [], f"{len(losses())} losses left past keep_ms"
