"""The cast of a failover test: one renewing holder, queued waiters, a shared record.

Every participant has its own client from ``Sentinel.master_for`` (so its own
connections, doorbell and session, like a separate process) and writes to one
:class:`tests.support.record.Record`. The holder writes its exit line as soon
as its lease is lost (``lease.wait_lost()``), so the record shows exactly when
it stopped counting itself inside the critical section.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from redis_fifo_lock import FifoLock, Lease, LeaseLost, NotReplicated, RedisUnavailable
from redis_fifo_lock.holds import Hold
from redis_fifo_lock.testing import PrivateRedis
from tests.sentinel_tests.conftest import close_master_client, master_client
from tests.support.polling import until
from tests.support.record import Record
from tests.support.sentinel import PrivateSentinelSetup, replica_synced

NAME = "failover"
RETRY_S = 0.2
"""Pause before a participant retries a call that Redis could not serve."""
FAILOVER_WAIT_S = 60.0
"""Longest wait, in seconds, for each step of a failover. A jump of the wall
clock (this VM paused and its clock set right on resume) puts the sentinels in
TILT mode for 30 s, in which they neither promote nor demote; demoting the old
master waits 8 s more after that. A CI run's failover stalled so."""

CLIENT_OPTIONS: dict[str, object] = {
    "socket_timeout": 1.0,
    "socket_connect_timeout": 1.0,
    "sentinel_kwargs": {"socket_timeout": 1.0, "socket_connect_timeout": 1.0},
}


@dataclass
class Scene:
    """The participants' shared state: set-up, lock settings, record, error counts."""

    setup: PrivateSentinelSetup
    record: Record
    settings: dict[str, int]
    errors: Counter[str] = field(default_factory=Counter)
    stop_holder: asyncio.Event = field(default_factory=asyncio.Event)

    @asynccontextmanager
    async def lock(self) -> AsyncIterator[FifoLock]:
        """A lock on a client of its own, closed afterwards."""
        client = await master_client(self.setup, **CLIENT_OPTIONS)
        try:
            yield FifoLock(client, NAME, **self.settings)
        finally:
            await close_master_client(client)

    async def acquire(self, lock: FifoLock, token: str, deadline: float) -> Lease:
        """Acquire, retrying with the same token while Redis cannot serve it."""
        while True:
            try:
                return await lock.acquire(
                    timeout=max(0.0, deadline - time.monotonic()), token=token
                )
            except NotReplicated:
                self.errors["acquire: not replicated"] += 1
            except RedisUnavailable:
                self.errors["acquire: unavailable"] += 1
            await asyncio.sleep(RETRY_S)

    async def release(self, lock: FifoLock, lease: Lease) -> None:
        """Release, retrying while Redis cannot be reached; a lost lease is counted."""
        deadline = time.monotonic() + 10
        while True:
            try:
                await lock.release(lease)
                self.record.released(lease, "ok")
                return
            except LeaseLost:
                self.errors["release: lease lost"] += 1
                self.record.released(lease, "leaselost")
                return
            except RedisUnavailable:
                self.errors["release: unavailable"] += 1
                if time.monotonic() > deadline:
                    return  # the lease expires on its own
            await asyncio.sleep(RETRY_S)

    async def hold_until_stopped(self, lock: FifoLock, granted: asyncio.Event) -> Lease:
        """The holder: hold (renewing) until ``stop_holder`` is set or the lease is lost."""
        lease = await self.acquire(lock, "holder", time.monotonic() + 10)
        self.record.enter(lease, "holder")
        granted.set()
        lost = asyncio.ensure_future(lease.wait_lost())
        stopped = asyncio.ensure_future(self.stop_holder.wait())
        await asyncio.wait({lost, stopped}, return_when=asyncio.FIRST_COMPLETED)
        lost.cancel()
        stopped.cancel()
        if lease.lost:
            self.record.lost(lease)
        self.record.exit(lease)
        await self.release(lock, lease)
        return lease

    async def take_turn(self, lock: FifoLock, who: str, deadline: float) -> Lease:
        """A waiter: wait for the lock, hold it 50 ms, release."""
        lease = await self.acquire(lock, f"{who}-{secrets.token_hex(4)}", deadline)
        self.record.enter(lease, who)
        await asyncio.sleep(0.05)
        self.record.exit(lease)
        await self.release(lock, lease)
        return lease


async def queue_length(client: Redis | RedisCluster) -> int:
    """How many requests wait for the scene's lock."""
    return int(await client.zcard(FifoLock(client, NAME).keys.key("queue")))


async def wait_for_new_master(setup: PrivateSentinelSetup, old: tuple[str, int]) -> float:
    """Wait until the sentinels name a master other than ``old``; returns when (monotonic)."""

    async def moved() -> bool:
        return await asyncio.to_thread(setup.master_address) != old

    await until(moved, "the sentinels promoted the replica", FAILOVER_WAIT_S)
    return time.monotonic()


async def wait_for_replica(server: PrivateRedis) -> None:
    """Wait until ``server`` is a replica in sync with its master."""

    async def check() -> bool:
        return await asyncio.to_thread(replica_synced, server)

    await until(check, f"the server on port {server.port} is a replica in sync", FAILOVER_WAIT_S)


def overlaps(holds: list[Hold]) -> list[str]:
    """Every pair of holds that were inside at once, lost leases included.

    Stricter than ``violations()``, which excuses a hold whose lease was lost:
    here a lost holder must have left (learnt of the loss) before the next entered.
    """
    found = []
    for before, after in itertools.pairwise(holds):
        if before.exited_ns is None or before.exited_ns >= after.entered_ns:
            found.append(
                f"fence {after.fence} ({after.who}) entered while fence {before.fence} "
                f"({before.who}, lost={before.lost}) was inside"
            )
    return found
