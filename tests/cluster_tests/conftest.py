"""A real local Redis Cluster of three masters on loopback, for the cluster tests.

The session fixture ``redis_cluster`` starts three private ``redis-server``
processes (the binary of :func:`redis_fifo_lock.testing.find_redis_server`)
in cluster mode, joins them and spreads the 16384 slots over them with
``redis-cli --cluster create`` when ``redis-cli`` is on PATH, else from Python
(CLUSTER ADDSLOTS and CLUSTER MEET), and waits until every node reports
``cluster_state:ok``. When cluster mode cannot be started (no server binary,
a server built without cluster support, ...) every test that uses it is
skipped, with the reason.

The fixture ``replicated_cluster`` starts a cluster of its own for one test,
three masters with one replica each and a node timeout of one second, so a
test can kill a master (``LocalCluster.kill``) and see its replica take over
within a few seconds.
"""

from __future__ import annotations

import gc
import os
import shutil
import signal
import subprocess
import tempfile
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
from redis import Redis
from redis.asyncio.cluster import RedisCluster

from redis_fifo_lock.testing import PrivateRedis, private_redis_server
from tests.support.polling import until_sync

MASTERS = 3
SLOTS = 16384


@pytest.fixture(autouse=True)
def _dropped_nodes_collected() -> Iterator[None]:
    """After each test (and its event loop), collect the cluster nodes redis-py
    dropped, quietly.

    When a node leaves the topology (killed here, or a failover), redis-py's
    asyncio ``RedisCluster`` removes it from its node cache and closes the
    connections it can close then; the others stay open on the removed node,
    which the client's ``aclose()`` no longer reaches (seen with redis-py 8.1:
    ``Unclosed ClusterNode`` for nodes these tests killed). Collected later, in
    whichever test is running, their ``ResourceWarning`` failed that test
    instead (a Django Sentinel test, in CI).
    """
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


needs_cluster_pubsub = pytest.mark.skipif(
    not hasattr(RedisCluster, "pubsub"),
    reason="this redis-py's asyncio RedisCluster has no pub/sub (added in 8.0): no doorbell",
)
"""Marks a test about the doorbell on Redis Cluster."""


@dataclass(frozen=True)
class LocalCluster:
    """The running cluster: its masters (``nodes``, as started), their replicas
    (``replicas[i]`` replicates ``nodes[i]``; none by default), and the URL of
    one node."""

    nodes: tuple[PrivateRedis, ...]
    replicas: tuple[PrivateRedis, ...] = ()

    @property
    def url(self) -> str:
        """A ``redis://`` URL of one node; cluster clients discover the rest."""
        return f"redis://{self.nodes[0].host}:{self.nodes[0].port}"

    def kill(self, node: PrivateRedis) -> None:
        """SIGKILL ``node``'s server, like a crash (reaped when the fixture ends)."""
        os.kill(node.pid, signal.SIGKILL)


START_ATTEMPTS = 5


def _start_node(
    stack: ExitStack, root: Path, index: int, node_timeout_ms: int = 5000
) -> PrivateRedis:
    attempt = 0
    while True:
        datadir = root / f"n{index}-{attempt}"
        datadir.mkdir()
        args = [
            # A replica's first full sync at once (Redis 7 waits 5 s for more replicas).
            "--repl-diskless-sync-delay",
            "0",
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            str(datadir / "nodes.conf"),
            "--cluster-node-timeout",
            str(node_timeout_ms),
            "--appendonly",
            "no",
        ]
        try:
            return stack.enter_context(private_redis_server(extra_args=args, datadir=datadir))
        except RuntimeError:
            # The cluster bus listens on port + 10000, which the choice of a free
            # port does not check: another server may hold it. Try another port.
            attempt += 1
            if attempt == START_ATTEMPTS:
                raise


def _join(nodes: tuple[PrivateRedis, ...]) -> None:
    """Give each node a third of the slots and introduce the nodes to each other."""
    redis_cli = shutil.which("redis-cli")
    if redis_cli is not None:
        addresses = [f"{node.host}:{node.port}" for node in nodes]
        subprocess.run(
            [redis_cli, "--cluster", "create", *addresses, "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=30,
        )
        return
    bounds = [SLOTS * i // len(nodes) for i in range(len(nodes) + 1)]
    for i, node in enumerate(nodes):
        with Redis(host=node.host, port=node.port) as client:
            # ADDSLOTS, not ADDSLOTSRANGE: the latter is Redis 7.0+ only.
            client.execute_command("CLUSTER ADDSLOTS", *range(bounds[i], bounds[i + 1]))
    with Redis(host=nodes[0].host, port=nodes[0].port) as first:
        for node in nodes[1:]:
            first.execute_command("CLUSTER MEET", node.host, node.port)


def _cluster_ok(node: PrivateRedis, known: int = MASTERS) -> bool:
    """Whether ``node`` sees ``known`` nodes and every slot served."""
    with Redis(host=node.host, port=node.port, decode_responses=True) as client:
        info = client.execute_command("CLUSTER INFO")
    return info.get("cluster_state") == "ok" and int(info.get("cluster_known_nodes", 0)) == known


def _replicate(replica: PrivateRedis, master: PrivateRedis) -> None:
    """Make ``replica`` (an empty node that knows ``master``) replicate it."""
    with Redis(host=master.host, port=master.port, decode_responses=True) as client:
        master_id = client.execute_command("CLUSTER MYID")
    with Redis(host=replica.host, port=replica.port) as client:
        client.execute_command("CLUSTER REPLICATE", master_id)


def _replica_synced(replica: PrivateRedis) -> bool:
    with Redis(host=replica.host, port=replica.port, decode_responses=True) as client:
        return client.info("replication").get("master_link_status") == "up"


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """A running three-master cluster on 127.0.0.1, stopped when the session ends.

    Skips the requesting tests when cluster mode cannot be started.
    """
    with ExitStack() as stack:
        root = Path(tempfile.mkdtemp(prefix="fifoclu-", dir="/tmp"))
        stack.callback(shutil.rmtree, root, ignore_errors=True)
        try:
            nodes = tuple(_start_node(stack, root, i) for i in range(MASTERS))
            _join(nodes)
            for node in nodes:
                until_sync(lambda node=node: _cluster_ok(node), f"node {node.port} reports ok")
        except (RuntimeError, ImportError, OSError, subprocess.SubprocessError) as exc:
            pytest.skip(f"cannot start a local Redis Cluster: {exc}")
        except AssertionError as exc:
            pytest.skip(f"the local Redis Cluster never reached cluster_state:ok: {exc}")
        yield LocalCluster(nodes)


@pytest.fixture
async def acluster(redis_cluster: LocalCluster) -> AsyncIterator[RedisCluster]:
    """An asyncio ``RedisCluster`` client on the local cluster, all masters flushed."""
    client = RedisCluster.from_url(redis_cluster.url)
    try:
        await client.flushall(target_nodes=RedisCluster.PRIMARIES)
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def replicated_cluster() -> Iterator[LocalCluster]:
    """A cluster of its own: three masters with one replica each, node timeout
    1000 ms (a killed master is replaced by its replica within seconds); stopped
    at the end of the test. Skips the test when no server can be started."""
    with ExitStack() as stack:
        root = Path(tempfile.mkdtemp(prefix="fifoclr-", dir="/tmp"))
        stack.callback(shutil.rmtree, root, ignore_errors=True)
        try:
            servers = [_start_node(stack, root, i, node_timeout_ms=1000) for i in range(6)]
            masters, replicas = tuple(servers[:MASTERS]), tuple(servers[MASTERS:])
            bounds = [SLOTS * i // MASTERS for i in range(MASTERS + 1)]
            for i, node in enumerate(masters):
                with Redis(host=node.host, port=node.port) as client:
                    client.execute_command("CLUSTER ADDSLOTS", *range(bounds[i], bounds[i + 1]))
            with Redis(host=masters[0].host, port=masters[0].port) as first:
                for node in servers[1:]:
                    first.execute_command("CLUSTER MEET", node.host, node.port)
            for node in servers:
                until_sync(lambda node=node: _cluster_ok(node, 6), f"node {node.port} sees 6")
            for replica, master in zip(replicas, masters, strict=True):
                _replicate(replica, master)
            for replica in replicas:
                until_sync(lambda r=replica: _replica_synced(r), f"replica {replica.port} syncs")
        except (RuntimeError, ImportError, OSError, subprocess.SubprocessError) as exc:
            pytest.skip(f"cannot start a local Redis Cluster with replicas: {exc}")
        # (A cluster that starts but never gets ready fails the test: the
        # session's own cluster got ready, so this one should too.)
        yield LocalCluster(masters, replicas)
