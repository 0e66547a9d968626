"""The ``replicas`` setting: grants and renewals count once replicas acknowledged them.

Against a lone server (no replica can acknowledge) and a master with one
replica, both real servers; what it buys across a Sentinel failover is in
``tests/sentinel_tests/test_failover.py``.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from redis import Redis as SyncRedis
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from redis_fifo_lock import (
    FifoLock,
    LeaseLost,
    LockSettings,
    LockTimeout,
    LockUsageError,
    LoopClients,
    NotReplicated,
    SyncFifoLock,
)
from redis_fifo_lock import lock as lock_module
from redis_fifo_lock.protocol import PROTOCOL, LockKeys
from redis_fifo_lock.settings import MAX_REPLICAS
from redis_fifo_lock.testing import PrivateRedis, PrivateRedisFactory
from tests.support.polling import until, until_sync


@dataclass
class Pair:
    """A master and its replica, with an async client on the master."""

    master: PrivateRedis
    replica: PrivateRedis
    client: Redis

    def detach_replica(self) -> None:
        """Make the replica a master of its own: the master has no replica left."""
        with SyncRedis.from_url(self.replica.url) as replica:
            replica.replicaof("NO", "ONE")
        with SyncRedis.from_url(self.master.url) as master:
            until_sync(
                lambda: int(master.info("replication")["connected_slaves"]) == 0,
                "the master has no replica",
            )


@pytest.fixture
async def pair(fresh_redis_server: PrivateRedisFactory) -> AsyncIterator[Pair]:
    """A fresh master with one replica in sync."""
    master = fresh_redis_server(["--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"])
    replica = fresh_redis_server(["--replicaof", master.host, str(master.port)])
    with SyncRedis.from_url(replica.url) as sync:
        until_sync(
            lambda: sync.info("replication").get("master_link_status") == "up",
            "the replica is in sync",
        )
    with SyncRedis.from_url(master.url) as sync:
        # The master counts the replica for WAIT only once it has acknowledged.
        sync.set("fifolock-test:replica-ready", 1)  # WAIT counts only after a real ack
        until_sync(lambda: int(sync.wait(1, 100)) == 1, "the master counts its replica")
    client = Redis.from_url(master.url)
    try:
        yield Pair(master, replica, client)
    finally:
        await client.aclose()


def test_the_setting_is_validated_with_its_name_and_unit() -> None:
    assert LockSettings().replicas == 0
    assert LockSettings(lease_ms=60_000).ack_wait_ms == 1000
    assert LockSettings(lease_ms=2000, poll_ms=500).ack_wait_ms == 200
    assert LockSettings(lease_ms=3000, poll_ms=500, replica_wait_ms=1000).ack_wait_ms == 1000
    with pytest.raises(ValueError, match="replicas must be 0 or more"):
        LockSettings(replicas=-1)
    with pytest.raises(ValueError, match=r"replicas must be a whole number \(int\)"):
        LockSettings(replicas=True)
    for huge in (MAX_REPLICAS + 1, 2**63, 10**30):
        with pytest.raises(ValueError, match=f"replicas must be at most {MAX_REPLICAS}"):
            LockSettings(replicas=huge)
    assert LockSettings(replicas=MAX_REPLICAS).replicas == MAX_REPLICAS
    with pytest.raises(ValueError, match="replica_wait_ms must be a whole number of milli"):
        LockSettings(replicas=1, replica_wait_ms=0.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"replica_wait_ms \(1001\) must be at most a third"):
        LockSettings(lease_ms=3000, poll_ms=500, replicas=1, replica_wait_ms=1001)


async def test_a_lock_with_replicas_on_redis_cluster_is_refused_at_construction() -> None:
    cluster = RedisCluster(host="127.0.0.1", port=1)  # never connects
    with pytest.raises(
        ValueError, match="'jobs': replicas is 1, but the lock is on a Redis Cluster"
    ):
        FifoLock(cluster, "jobs", replicas=1)
    assert FifoLock(cluster, "jobs").settings.replicas == 0


async def test_loop_clients_for_a_cluster_are_refused_at_construction() -> None:
    clients = LoopClients.cluster("redis://127.0.0.1:1")  # never connects
    with pytest.raises(
        ValueError, match="'jobs': replicas is 2, but the lock is on a Redis Cluster"
    ):
        FifoLock(clients, "jobs", replicas=2)
    with pytest.raises(
        ValueError, match="'jobs': replicas is 2, but the lock is on a Redis Cluster"
    ):
        SyncFifoLock(clients, "jobs", replicas=2)


async def test_a_cluster_client_from_a_factory_is_refused_before_any_io() -> None:
    # LoopClients(factory=...) hides the client type until the first call.
    protocol = PROTOCOL.acknowledged(1, 10)
    assert PROTOCOL.acknowledged(1, 10) is protocol and PROTOCOL.acknowledged(0, 10) is PROTOCOL
    cluster = RedisCluster(host="127.0.0.1", port=1)  # never connects
    with pytest.raises(LockUsageError, match="replicas=1 is not supported on Redis Cluster"):
        settings = LockSettings(lease_ms=1000, poll_ms=500)
        await protocol.renew(cluster, LockKeys("jobs"), "token", 1, settings)


async def test_without_replicas_no_wait_is_sent(aredis: Redis) -> None:
    lock = FifoLock(aredis, "plain", lease_ms=300, poll_ms=100)
    await aredis.config_resetstat()
    lease = await lock.acquire()
    await asyncio.sleep(0.25)  # two renewals
    await lock.release(lease)
    assert "cmdstat_wait" not in await aredis.info("commandstats")


async def test_a_grant_no_replica_acknowledged_is_given_back_and_raises(aredis: Redis) -> None:
    lock = FifoLock(aredis, "alone", lease_ms=3000, poll_ms=500, replicas=1, replica_wait_ms=50)
    started = time.monotonic()
    with pytest.raises(NotReplicated) as caught:
        await lock.acquire(timeout=5)
    assert time.monotonic() - started < 2
    assert (caught.value.replicas, caught.value.acknowledged) == (1, 0)
    message = str(caught.value)
    assert re.search(r"grant of fence \d+ was acknowledged by 0 of the 1 replica", message)
    assert caught.value.name == "alone"
    status = await lock.status()
    assert (status.held, status.waiting) == (False, 0) and status.last_fence > 0


@pytest.mark.parametrize("timeout", [0, 0.1])
async def test_a_short_timeout_still_waits_for_the_acknowledgement(
    aredis: Redis, timeout: float
) -> None:
    # One try includes the wait for replicas: a timeout shorter than that wait
    # must not pass off "no replica acknowledged" as a busy lock.
    lock = FifoLock(aredis, "alone-now", lease_ms=30_000, poll_ms=500, replicas=1)
    assert lock.settings.ack_wait_ms == 1000
    with pytest.raises(NotReplicated) as caught:
        await lock.acquire(timeout=timeout)
    assert (caught.value.replicas, caught.value.acknowledged) == (1, 0)
    status = await lock.status()
    assert (status.held, status.waiting) == (False, 0)


async def test_a_zero_timeout_kills_floor_without_ack_wait(aredis: Redis) -> None:
    """MUTANT floor-without-ack-wait: one try of an acquire gets the plain
    ``ATTEMPT_FLOOR_S``, shorter than its wait for replicas (the bug before the
    test above): "no replica acknowledged" came out as a ``LockTimeout``."""
    lock = FifoLock(aredis, "alone-mutant", lease_ms=30_000, poll_ms=500, replicas=1)
    lock._attempt_floor_s = lock_module.ATTEMPT_FLOOR_S
    with pytest.raises(LockTimeout, match="holder fence None"):
        await lock.acquire(timeout=0)


async def test_acknowledged_grants_and_renewals_keep_the_lock_past_many_leases(
    pair: Pair,
) -> None:
    lock = FifoLock(
        pair.client, "acked", lease_ms=900, poll_ms=300, replicas=1, replica_wait_ms=300
    )
    lease = await lock.acquire(timeout=5)
    await asyncio.sleep(2.7)  # three leases, kept by acknowledged renewals
    assert not lease.lost
    replica = Redis.from_url(pair.replica.url)
    try:
        assert int(await replica.hget(lock.keys.key("lease"), "fence") or 0) == lease.fence
        assert await replica.pttl(lock.keys.key("lease")) > 0
    finally:
        await replica.aclose()
    await lock.release(lease)
    stats = await pair.client.info("commandstats")
    assert stats["cmdstat_wait"]["calls"] >= 4  # the grant and the renewals


async def test_a_renewal_no_replica_acknowledged_counts_as_failed_and_the_lease_is_lost(
    pair: Pair,
) -> None:
    lock = FifoLock(
        pair.client, "unacked", lease_ms=1500, poll_ms=500, replicas=1, replica_wait_ms=300
    )
    lease = await lock.acquire(timeout=5)
    await asyncio.to_thread(pair.detach_replica)
    detached = time.monotonic()
    await asyncio.wait_for(lease.wait_lost(), 5)
    # Lost when the last acknowledged renewal ran out: within one lease.
    assert time.monotonic() - detached < 1.5 + 0.3
    assert "acknowledged by 0 of the 1 replica(s)" in (lease.lost_reason or "")
    # The master itself renewed the key: only the holder knows it cannot be sure,
    # and says so at release (which still frees the lock).
    assert await pair.client.exists(lock.keys.key("lease"))
    with pytest.raises(LeaseLost, match="given up for lost while held"):
        await lock.release(lease)
    assert not (await lock.status()).held


async def test_hold_raises_on_exit_when_the_lease_was_lost_though_the_master_kept_it(
    pair: Pair,
) -> None:
    lock = FifoLock(
        pair.client, "hold-unacked", lease_ms=1500, poll_ms=500, replicas=1, replica_wait_ms=300
    )

    async def hold_until_lost() -> None:
        async with lock.hold(timeout=5) as lease:
            await asyncio.to_thread(pair.detach_replica)
            await asyncio.wait_for(lease.wait_lost(), 5)
            assert await pair.client.exists(lock.keys.key("lease"))

    with pytest.raises(LeaseLost):
        await hold_until_lost()


async def test_a_handed_off_grant_no_replica_acknowledged_is_given_back_and_raises(
    pair: Pair,
) -> None:
    settings = {"lease_ms": 3000, "poll_ms": 500, "replicas": 1, "replica_wait_ms": 500}
    first = FifoLock(pair.client, "handoff", **settings)
    lease = await first.acquire(timeout=5)
    second_client = Redis.from_url(pair.master.url)
    try:
        second = FifoLock(second_client, "handoff", **settings)
        waiting = asyncio.create_task(second.acquire(timeout=5, token="second"))

        async def queued() -> bool:
            return await pair.client.zscore(first.keys.key("queue"), "second") is not None

        await until(queued, "the second request is queued")
        await asyncio.to_thread(pair.detach_replica)
        await first.release(lease)  # grants to "second" on the master alone
        with pytest.raises(NotReplicated, match=r"grant of fence \d+") as caught:
            await waiting
        handed_off = int(re.findall(r"fence (\d+)", str(caught.value))[0])
        assert handed_off > lease.fence
    finally:
        await second_client.aclose()
    status = await first.status()
    assert (status.held, status.waiting, status.last_fence) == (False, 0, handed_off)


def test_the_sync_lock_passes_replicas_through(redis_url: str) -> None:
    # A lone server has no replica to acknowledge: the setting must reach the
    # core (NotReplicated), not be dropped on the way (a plain grant).
    lock = SyncFifoLock(redis_url, "sync-alone", lease_ms=3000, poll_ms=500, replicas=1)
    assert lock.settings.replicas == 1
    with pytest.raises(NotReplicated):
        lock.acquire(timeout=5)
    assert not lock.status().held
