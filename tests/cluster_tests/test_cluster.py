"""The core lock on a real Redis Cluster of three masters (``RedisCluster`` clients).

The same properties as ``tests/test_lock.py`` checks on one server: FIFO order
across processes, mutual exclusion over holds spanning many polls, a killed
holder replaced within one lease with a higher fence, hand-off by the doorbell
(ClusterPubSub), plus what is particular to a cluster: locks spread over every
shard, scripts missing from a node's cache, CONFIG GET answered per node.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest
from redis import Redis
from redis.asyncio.cluster import RedisCluster
from redis.cluster import RedisCluster as SyncRedisCluster

from redis_fifo_lock import FifoLock
from tests.cluster_tests.conftest import LocalCluster, needs_cluster_pubsub
from tests.support.polling import until
from tests.support.processes import killed_holder_replaced, never_overlap, served_in_arrival_order

pytestmark = pytest.mark.cluster


def connection(cluster: LocalCluster) -> list[str]:
    """The contender's arguments to reach the cluster."""
    return ["--cluster", "--url", cluster.url]


async def test_waiting_processes_are_served_in_arrival_order(
    acluster: RedisCluster, redis_cluster: LocalCluster, tmp_path: Path
) -> None:
    gate = FifoLock(acluster, "fifo", lease_ms=5000, poll_ms=500)
    await served_in_arrival_order(gate, connection(redis_cluster), tmp_path / "record", 8)


async def test_processes_never_overlap_while_holds_span_many_polls(
    redis_cluster: LocalCluster, tmp_path: Path
) -> None:
    await never_overlap(connection(redis_cluster), tmp_path / "record", poll_ms=100)


async def test_a_killed_holder_is_replaced_within_one_lease_with_a_higher_fence(
    redis_cluster: LocalCluster, tmp_path: Path
) -> None:
    await killed_holder_replaced(connection(redis_cluster), tmp_path / "record")


@needs_cluster_pubsub
async def test_hand_off_is_rung_on_the_doorbell_well_before_a_poll(
    acluster: RedisCluster, redis_cluster: LocalCluster
) -> None:
    # The waiter has its own client (so its own hub and ClusterPubSub) and
    # polls every 10 s: only the doorbell can wake it within the bound below.
    waiter_client = RedisCluster.from_url(redis_cluster.url)
    try:
        settings = {"lease_ms": 30_000, "poll_ms": 10_000}
        holder_lock = FifoLock(acluster, "handoff", **settings)
        waiter_lock = FifoLock(waiter_client, "handoff", **settings)
        lease = await holder_lock.acquire()
        waiting = asyncio.create_task(waiter_lock.acquire(token="waiter"))
        queue = holder_lock.keys.key("queue")

        async def queued() -> bool:
            return await acluster.zscore(queue, "waiter") is not None

        await until(queued, "the waiter is queued")
        released_at = time.monotonic()
        await holder_lock.release(lease)
        next_lease = await asyncio.wait_for(waiting, 5)
        latency_ms = (time.monotonic() - released_at) * 1000
        assert next_lease.fence > lease.fence
        assert latency_ms < 500, latency_ms  # poll_ms is 10_000
        await waiter_lock.release(next_lease)
    finally:
        await waiter_client.aclose()


async def test_many_lock_names_spread_over_every_shard(
    acluster: RedisCluster, redis_cluster: LocalCluster
) -> None:
    names = [f"shard-{i}" for i in range(30)]
    locks = [FifoLock(acluster, name, lease_ms=5000, poll_ms=500) for name in names]
    leases = await asyncio.gather(*(lock.acquire() for lock in locks))
    # Ask each lock's lease key's master, as CLUSTER KEYSLOT and CLUSTER
    # NODES name it, directly (a plain client, no redirection) for the key.
    owners: dict[str, str] = {}
    for lock in locks:
        lease_key = lock.keys.key("lease")
        slot = await acluster.cluster_keyslot(lease_key)
        slots = [await acluster.cluster_keyslot(key) for key in lock.keys.all]
        assert slots == [slot] * len(lock.keys.all)
        owners[lock.name] = owner_of(redis_cluster, slot)
        host, port = owners[lock.name].split(":")
        with Redis(host=host, port=int(port)) as node:
            assert node.exists(lease_key) == 1
    assert len(set(owners.values())) >= 2, owners
    # Contend on every name at once: a second request each, served in turn.
    rivals = [asyncio.create_task(lock.acquire()) for lock in locks]
    await asyncio.gather(*(lock.release(lease) for lock, lease in zip(locks, leases, strict=True)))
    seconds = await asyncio.wait_for(asyncio.gather(*rivals), 5)
    assert all(second.fence > first.fence for first, second in zip(leases, seconds, strict=True))
    await asyncio.gather(*(lock.release(lease) for lock, lease in zip(locks, seconds, strict=True)))


def owner_of(cluster: LocalCluster, slot: int) -> str:
    """``host:port`` of the master serving ``slot``, read from CLUSTER NODES."""
    node = cluster.nodes[0]
    with Redis(host=node.host, port=node.port, decode_responses=True) as client:
        nodes = client.execute_command("CLUSTER NODES")
    for address, info in nodes.items():
        if "master" not in info["flags"]:
            continue
        for span in info["slots"]:
            low, high = (int(span[0]), int(span[-1]))
            if low <= slot <= high:
                return str(address).split("@")[0]
    raise AssertionError(f"no master serves slot {slot}: {nodes}")


async def test_scripts_missing_from_the_node_cache_are_evaluated_on_the_owner(
    acluster: RedisCluster,
) -> None:
    lock = FifoLock(acluster, "noscript", lease_ms=5000, poll_ms=500)
    first = await lock.acquire()
    await lock.release(first)
    await acluster.execute_command("SCRIPT FLUSH", target_nodes=RedisCluster.PRIMARIES)
    lease = await lock.acquire()
    assert lease.fence > first.fence
    await lock.release(lease)


async def test_an_evicting_policy_on_any_master_is_warned_about(
    redis_cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    last = redis_cluster.nodes[-1]
    client = RedisCluster.from_url(redis_cluster.url)
    with Redis(host=last.host, port=last.port) as node:
        node.config_set("maxmemory-policy", "allkeys-lru")
        try:
            with caplog.at_level(logging.WARNING, "redis_fifo_lock"):
                lock = FifoLock(client, "evict", lease_ms=5000, poll_ms=500)
                await lock.release(await lock.acquire())
        finally:
            node.config_set("maxmemory-policy", "noeviction")
            await client.aclose()
    warnings = [r.getMessage() for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    assert len(warnings) == 1 and "'allkeys-lru'" in warnings[0], warnings


def test_a_synchronous_cluster_client_is_refused(redis_cluster: LocalCluster) -> None:
    client = SyncRedisCluster.from_url(redis_cluster.url)
    try:
        with pytest.raises(TypeError, match="synchronous RedisCluster; use SyncFifoLock"):
            FifoLock(client, "sync")  # type: ignore[arg-type]
    finally:
        client.close()
