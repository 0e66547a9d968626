"""A real local Redis Cluster of three masters on loopback, for the cluster tests.

The session fixture ``redis_cluster`` starts three private ``redis-server``
processes (the binary of :func:`redis_fifo_lock.testing.find_redis_server`)
in cluster mode, joins them and spreads the 16384 slots over them with
``redis-cli --cluster create`` when ``redis-cli`` is on PATH, else from Python
(CLUSTER ADDSLOTS and CLUSTER MEET), and waits until every node reports
``cluster_state:ok``. When cluster mode cannot be started (no server binary,
a server built without cluster support, ...) every test that uses it is
skipped, with the reason.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
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


@dataclass(frozen=True)
class LocalCluster:
    """The running cluster: its nodes, and the URL of one of them."""

    nodes: tuple[PrivateRedis, ...]

    @property
    def url(self) -> str:
        """A ``redis://`` URL of one node; cluster clients discover the rest."""
        return f"redis://{self.nodes[0].host}:{self.nodes[0].port}"


def _start_node(stack: ExitStack, root: Path, index: int) -> PrivateRedis:
    datadir = root / f"n{index}"
    datadir.mkdir()
    args = [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        str(datadir / "nodes.conf"),
        "--cluster-node-timeout",
        "5000",
        "--appendonly",
        "no",
    ]
    return stack.enter_context(private_redis_server(extra_args=args, datadir=datadir))


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


def _cluster_ok(node: PrivateRedis) -> bool:
    """Whether ``node`` sees all masters and every slot served."""
    with Redis(host=node.host, port=node.port, decode_responses=True) as client:
        info = client.execute_command("CLUSTER INFO")
    return info.get("cluster_state") == "ok" and int(info.get("cluster_known_nodes", 0)) == MASTERS


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
