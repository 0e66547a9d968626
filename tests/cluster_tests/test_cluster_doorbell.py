"""The doorbell on Redis Cluster when its node dies, and without pub/sub at all.

A process's doorbell is one ``ClusterPubSub`` connection, to the master that
owned the first watched channel's slot. When that master is killed and its
replica takes over, waiters must still be granted (by polling at least), and
the doorbell must subscribe again on a live node so hand-offs are immediate
again. A client with no asyncio pub/sub (``RedisCluster`` before redis-py 8.0)
must work by polling, with one warning.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import pytest
from redis import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from redis_fifo_lock import FifoLock, Lease, RedisUnavailable
from redis_fifo_lock.testing import PrivateRedis
from tests.cluster_tests.conftest import LocalCluster, needs_cluster_pubsub
from tests.support.polling import until

pytestmark = pytest.mark.cluster

LEASE_MS = 10_000
POLL_MS = 5_000
"""Long: a hand-off well within this can only have been rung on the doorbell."""
RUNG_S = 1.0


def role(node: PrivateRedis) -> str | None:
    """``role`` from INFO replication, or None if the node cannot be reached."""
    try:
        with Redis(host=node.host, port=node.port, decode_responses=True) as client:
            return str(client.info("replication")["role"])
    except RedisError:
        return None


def subscribers(nodes: list[PrivateRedis], pattern: str) -> list[str]:
    """Channels matching ``pattern`` subscribed on any of ``nodes`` (as each
    node reports its own connections)."""
    found = []
    for node in nodes:
        with Redis(host=node.host, port=node.port, decode_responses=True) as client:
            found += client.pubsub_channels(pattern)
    return found


def pubsub_clients(nodes: list[PrivateRedis]) -> set[tuple[int, int]]:
    """(port, client id) of every connection subscribed to a channel on ``nodes``."""
    found = set()
    for node in nodes:
        with Redis(host=node.host, port=node.port) as client:
            for info in client.client_list(_type="pubsub"):
                if int(info["sub"]) > 0:
                    found.add((node.port, int(info["id"])))
    return found


def in_sync(master: PrivateRedis, replica: PrivateRedis) -> bool:
    """Whether ``replica`` has everything ``master`` wrote so far."""
    with Redis(host=master.host, port=master.port, decode_responses=True) as client:
        written = int(client.info("replication")["master_repl_offset"])
    with Redis(host=replica.host, port=replica.port, decode_responses=True) as client:
        return int(client.info("replication")["slave_repl_offset"]) >= written


async def released(lock: FifoLock, lease: Lease) -> None:
    """Release, retrying while the cluster is failing over."""
    while True:
        try:
            await lock.release(lease)
            return
        except RedisUnavailable:
            await asyncio.sleep(0.1)


@pytest.fixture
async def two_clients(
    replicated_cluster: LocalCluster,
) -> AsyncIterator[tuple[RedisCluster, RedisCluster]]:
    """A holder's and a waiter's client (so the waiter has a doorbell of its own)."""
    holder = RedisCluster.from_url(replicated_cluster.url)
    waiter = RedisCluster.from_url(replicated_cluster.url)
    try:
        yield holder, waiter
    finally:
        await holder.aclose()
        await waiter.aclose()


@needs_cluster_pubsub
async def test_the_doorbell_subscribes_again_after_its_master_fails_over(
    replicated_cluster: LocalCluster, two_clients: tuple[RedisCluster, RedisCluster]
) -> None:
    holder_client, waiter_client = two_clients
    settings = {"lease_ms": LEASE_MS, "poll_ms": POLL_MS}
    holder_lock = FifoLock(holder_client, "failover", **settings)
    waiter_lock = FifoLock(waiter_client, "failover", **settings)
    lease = await holder_lock.acquire()
    waiting = []
    for count in range(1, 4):  # one by one, so they are granted in this order
        waiting.append(asyncio.create_task(waiter_lock.acquire()))
        await until(lambda n=count: _waiting(holder_lock, n), f"{count} waiter(s) queued")
    # The doorbell's connection goes to the master of the lock's slot.
    slot = await holder_client.cluster_keyslot(holder_lock.keys.key("lease"))
    owner = holder_client.get_node_from_key(holder_lock.keys.key("lease"))
    index = next(i for i, node in enumerate(replicated_cluster.nodes) if node.port == owner.port)
    master, replica = replicated_cluster.nodes[index], replicated_cluster.replicas[index]
    pattern = f"{waiter_lock.keys.doorbell}:*"
    await until(
        lambda: asyncio.to_thread(lambda: len(subscribers([master], pattern)) == 1),
        f"the doorbell is subscribed on the master of slot {slot}",
    )
    await until(lambda: asyncio.to_thread(in_sync, master, replica), "the replica has the queue")

    replicated_cluster.kill(master)
    killed_at = time.monotonic()
    await until(lambda: asyncio.to_thread(lambda: role(replica) == "master"), "failover")
    failed_over_s = time.monotonic() - killed_at
    alive = [
        node
        for node in (*replicated_cluster.nodes, *replicated_cluster.replicas)
        if node is not master
    ]
    # Waiters are still served: the first grant comes by poll or doorbell.
    await released(holder_lock, lease)
    first = await asyncio.wait_for(waiting[0], POLL_MS / 1000 + 5)
    assert first.fence > lease.fence
    # The doorbell subscribed again on a live node...
    await until(
        lambda: asyncio.to_thread(lambda: len(subscribers(alive, pattern)) == 1),
        "the doorbell is subscribed on a live node",
    )
    resubscribed_s = time.monotonic() - killed_at
    # ... and the next hand-offs are rung at once, not found by a poll.
    previous = first
    for task in waiting[1:]:
        released_at = time.monotonic()
        await waiter_lock.release(previous)
        previous = await asyncio.wait_for(task, POLL_MS / 1000 + 5)
        latency_s = time.monotonic() - released_at
        assert latency_s < RUNG_S, (latency_s, failed_over_s, resubscribed_s)
    await waiter_lock.release(previous)
    print(f"failover {failed_over_s:.2f} s; doorbell back {resubscribed_s:.2f} s after the kill")


@needs_cluster_pubsub
async def test_the_doorbell_subscribes_again_when_its_connection_is_killed(
    redis_cluster: LocalCluster,
) -> None:
    holder_client = RedisCluster.from_url(redis_cluster.url)
    waiter_client = RedisCluster.from_url(redis_cluster.url)
    try:
        settings = {"lease_ms": LEASE_MS, "poll_ms": POLL_MS}
        holder_lock = FifoLock(holder_client, "killed-bell", **settings)
        waiter_lock = FifoLock(waiter_client, "killed-bell", **settings)
        lease = await holder_lock.acquire()
        waiting = asyncio.create_task(waiter_lock.acquire())
        await until(lambda: _waiting(holder_lock, 1), "the waiter is queued")
        nodes = list(redis_cluster.nodes)
        # Queued before its doorbell is subscribed: the subscription follows.
        await until(
            lambda: asyncio.to_thread(
                lambda: len(subscribers(nodes, f"{waiter_lock.keys.doorbell}:*")) == 1
            ),
            "the waiter's doorbell is subscribed",
        )
        killed = pubsub_clients(nodes)
        for node in nodes:
            with Redis(host=node.host, port=node.port) as client:
                client.client_kill_filter(_type="pubsub")
        await until(
            lambda: asyncio.to_thread(lambda: bool(pubsub_clients(nodes) - killed)),
            "the doorbell is subscribed again",
        )
        released_at = time.monotonic()
        await holder_lock.release(lease)
        next_lease = await asyncio.wait_for(waiting, POLL_MS / 1000 + 5)
        assert time.monotonic() - released_at < RUNG_S
        await waiter_lock.release(next_lease)
    finally:
        await holder_client.aclose()
        await waiter_client.aclose()


def name_on(client: RedisCluster, master: PrivateRedis, prefix: str) -> str:
    """A lock name whose keys live on ``master``."""
    for i in range(1000):
        name = f"{prefix}-{i}"
        node = client.get_node_from_key(FifoLock(client, name).keys.key("lease"))
        if node.port == master.port:
            return name
    raise AssertionError(f"no name found for the master on port {master.port}")


@needs_cluster_pubsub
async def test_the_doorbell_moves_to_a_live_node_when_its_node_dies_for_good(
    replicated_cluster: LocalCluster, two_clients: tuple[RedisCluster, RedisCluster]
) -> None:
    # The doorbell's node X dies with no replica to replace it, and the
    # cluster keeps serving the other slots. The waiter waits on lock "lives"
    # (on master Y) and on lock "dies" (on X, watched first, so the doorbell
    # went to X, and a new one would go there again): its doorbell must move to
    # another node, or every hand-off of "lives" would wait for a poll.
    holder_client, waiter_client = two_clients
    nodes = replicated_cluster.nodes
    dead, dead_replica, live = nodes[0], replicated_cluster.replicas[0], nodes[1]
    for node in (*nodes, *replicated_cluster.replicas):
        with Redis(host=node.host, port=node.port) as client:
            client.config_set("cluster-require-full-coverage", "no")
    settings = {"lease_ms": LEASE_MS, "poll_ms": POLL_MS}
    await holder_client.initialize()  # loads the slot map name_on() reads
    dies = name_on(holder_client, dead, "dies")
    lives = name_on(holder_client, live, "lives")
    holder_dies = FifoLock(holder_client, dies, **settings)
    holder_lives = FifoLock(holder_client, lives, **settings)
    waiter_dies = FifoLock(waiter_client, dies, **settings)
    waiter_lives = FifoLock(waiter_client, lives, **settings)
    _held = await holder_dies.acquire()  # kept: a dropped lease is released
    lease = await holder_lives.acquire()
    stuck = asyncio.create_task(waiter_dies.acquire())
    await until(lambda: _waiting(holder_dies, 1), "a waiter is queued on the dying master")
    # The SUBSCRIBE travels on its own connection: the queue entry may be seen
    # before it is.
    await until(
        lambda: asyncio.to_thread(
            lambda: len(subscribers([dead], f"{waiter_dies.keys.doorbell}:*")) == 1
        ),
        "the doorbell is subscribed on the dying master",
    )
    waiting = []
    for count in range(1, 3):
        waiting.append(asyncio.create_task(waiter_lives.acquire()))
        await until(lambda n=count: _waiting(holder_lives, n), f"{count} waiter(s) queued")
    pattern = f"{waiter_lives.keys.doorbell}:*"
    await until(  # riding on the same connection
        lambda: asyncio.to_thread(lambda: len(subscribers([dead], pattern)) == 1),
        "the second doorbell channel is subscribed on the dying master",
    )

    replicated_cluster.kill(dead_replica)
    replicated_cluster.kill(dead)
    killed_at = time.monotonic()
    alive = [
        node for node in (*nodes, *replicated_cluster.replicas) if node not in (dead, dead_replica)
    ]
    await until(
        lambda: asyncio.to_thread(lambda: len(subscribers(alive, pattern)) == 1),
        "the doorbell is subscribed on a live node",
    )
    resubscribed_s = time.monotonic() - killed_at
    releasing, previous = holder_lives, lease
    for task in waiting:
        released_at = time.monotonic()
        await releasing.release(previous)
        releasing, previous = waiter_lives, await asyncio.wait_for(task, POLL_MS / 1000 + 5)
        latency_s = time.monotonic() - released_at
        assert latency_s < RUNG_S, (latency_s, resubscribed_s)
    await waiter_lives.release(previous)
    stuck.cancel()
    await asyncio.gather(stuck, return_exceptions=True)
    print(f"doorbell moved {resubscribed_s:.2f} s after its node died")


class PubSubLessCluster(RedisCluster):
    """A ``RedisCluster`` as redis-py 5.0-7.x ship it: no asyncio ``pubsub()``."""

    pubsub = None  # type: ignore[assignment]


async def test_a_cluster_client_without_pubsub_works_by_polling_with_one_warning(
    redis_cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    client = PubSubLessCluster.from_url(redis_cluster.url)
    try:
        lock = FifoLock(client, "no-pubsub", lease_ms=2000, poll_ms=200)
        with caplog.at_level(logging.WARNING, "redis_fifo_lock"):
            for _ in range(2):
                lease = await lock.acquire()
                waiting = asyncio.create_task(lock.acquire())
                await until(lambda: _waiting(lock, 1), "the second request is queued")
                await lock.release(lease)
                await lock.release(await asyncio.wait_for(waiting, 5))
    finally:
        await client.aclose()
    warnings = [r.getMessage() for r in caplog.records if "has no pubsub()" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "PubSubLessCluster" in warnings[0]
    assert not [r for r in caplog.records if "doorbell unavailable" in r.getMessage()]


async def _waiting(lock: FifoLock, count: int) -> bool:
    return (await lock.status()).waiting == count
