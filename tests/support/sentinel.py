"""A local Sentinel set-up for the tests: a master, its replicas and sentinels.

Every process is a :func:`redis_fifo_lock.testing.private_redis_server` (so on
``127.0.0.1``, a free port, without persistence). Use it as::

    with private_sentinel_setup(service_name="mymaster") as setup:
        sentinel = Sentinel(setup.sentinel_addresses)
        client = sentinel.master_for(setup.service_name)
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from redis import Redis
from redis.exceptions import RedisError

from redis_fifo_lock.testing import PrivateRedis, private_redis_server
from tests.support.polling import until_sync

# Data nodes send the first full sync at once instead of waiting for more
# replicas (Redis 7 defaults to a 5 s delay), and keep nothing on disk for it.
_DATA_NODE_ARGS = ("--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0")


@dataclass(frozen=True)
class PrivateSentinelSetup:
    """A running Sentinel set-up started by :func:`private_sentinel_setup`.

    ``master`` and ``replicas`` are the roles at start; after a failover ask
    :meth:`master_address` who is master now. All servers listen on
    ``127.0.0.1``.

    Attributes:
        service_name: Name the sentinels monitor the master under (the
            ``service_name`` of ``Sentinel.master_for``).
        master: The server that was master at start.
        replicas: The servers that were its replicas at start.
        sentinels: The sentinel processes (``redis-server --sentinel``).
        down_after_ms: Milliseconds without a valid reply after which a
            sentinel considers the master down.
        failover_timeout_ms: The sentinels' ``failover-timeout``, in ms.
    """

    service_name: str
    master: PrivateRedis
    replicas: tuple[PrivateRedis, ...]
    sentinels: tuple[PrivateRedis, ...]
    down_after_ms: int
    failover_timeout_ms: int
    _stack: ExitStack = field(repr=False, compare=False)
    _startup_timeout: int = field(repr=False, compare=False)

    @property
    def replica(self) -> PrivateRedis:
        """The first replica at start (the only one with the default ``replicas=1``)."""
        return self.replicas[0]

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every sentinel: the first argument of ``Sentinel(...)``."""
        return [(server.host, server.port) for server in self.sentinels]

    def master_address(self) -> tuple[str, int]:
        """Ask the sentinels which server is master now.

        The sentinels are asked in order (``SENTINEL GET-MASTER-ADDR-BY-NAME``)
        and the first answer is returned; during a failover sentinels may
        briefly disagree.

        Returns:
            ``(host, port)`` of the current master.

        Raises:
            RuntimeError: If no sentinel answered with an address.
        """
        for server in self.sentinels:
            try:
                with Redis(host=server.host, port=server.port, socket_timeout=2.0) as client:
                    reply = client.execute_command(
                        "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service_name
                    )
            except RedisError:
                continue
            if reply:
                host, port = reply
                return _text(host), int(port)
        raise RuntimeError(f"no sentinel knows a master for {self.service_name!r}")

    def kill(self, server: PrivateRedis) -> None:
        """Kill one server of this set-up with SIGKILL, like a crash.

        It gets no chance to flush anything to its replicas or clients. The
        process is reaped when the set-up's ``with`` block exits; use
        :meth:`restart` to bring the server back.

        Args:
            server: One of :attr:`master`, :attr:`replicas` or :attr:`sentinels`
                (or a server returned by :meth:`restart`).

        Raises:
            ProcessLookupError: If the server exited and was reaped already.
        """
        os.kill(server.pid, signal.SIGKILL)

    def restart(self, server: PrivateRedis) -> PrivateRedis:
        """Start a killed data server again, empty, as a replica of the current master.

        It keeps its port and directory; it is stopped when the set-up's
        ``with`` block exits. It returns once its replication link is up.

        Args:
            server: A killed :attr:`master` or replica (not a sentinel).

        Returns:
            The restarted server's details.

        Raises:
            RuntimeError: If it cannot be started.
            AssertionError: If its link to the master is not up within the
                set-up's ``startup_timeout``.
        """
        host, port = self.master_address()
        restarted = self._stack.enter_context(
            private_redis_server(
                extra_args=[*_DATA_NODE_ARGS, "--replicaof", host, str(port)],
                datadir=server.datadir,
                port=server.port,
                startup_timeout=self._startup_timeout,
            )
        )
        until_sync(
            functools.partial(replica_synced, restarted),
            f"the restarted server on port {server.port} is in sync",
            timeout_s=self._startup_timeout,
        )
        return restarted


def _text(value: object) -> str:
    """Decode a reply value that may be ``bytes``."""
    return value.decode() if isinstance(value, bytes) else str(value)


def replica_synced(server: PrivateRedis) -> bool:
    """Whether ``server`` is a replica whose link to its master is up (not
    when it does not answer)."""
    try:
        with Redis(
            host=server.host, port=server.port, socket_timeout=2.0, decode_responses=True
        ) as client:
            info = client.info("replication")
    except (RedisError, OSError):
        return False
    return bool(info.get("role") == "slave" and info.get("master_link_status") == "up")


def _sentinel_ready(server: PrivateRedis, service_name: str, replicas: int, peers: int) -> bool:
    """Whether the sentinel ``server`` sees the master up with all replicas and
    peers (not when it does not answer)."""
    try:
        with Redis(
            host=server.host, port=server.port, socket_timeout=2.0, decode_responses=True
        ) as client:
            state = client.sentinel_master(service_name)
    except (RedisError, OSError):
        return False
    return bool(
        state.get("flags") == "master"
        and state.get("num-slaves") == replicas
        and state.get("num-other-sentinels") == peers
    )


@contextmanager
def private_sentinel_setup(
    service_name: str = "mymaster",
    *,
    replicas: int = 1,
    sentinels: int = 3,
    down_after_ms: int = 1000,
    failover_timeout_ms: int = 3000,
    startup_timeout: int = 30,
) -> Iterator[PrivateSentinelSetup]:
    """Run a master, its replicas and a group of sentinels for a ``with`` block.

    Every process is started with :func:`private_redis_server` (so on
    ``127.0.0.1``, a free port, without persistence, the binary of
    :func:`find_redis_server`). The replicas replicate the master; each
    sentinel runs ``redis-server <its config file> --sentinel`` with the file
    written into its own directory (sentinels rewrite it) and monitors the
    master under ``service_name`` with a quorum of a majority of the
    sentinels. The block is entered only once every replica is in sync and
    every sentinel sees the master, all replicas and all other sentinels, so
    a failover can start at once. On exit every process is stopped and the
    directories removed (also on an exception).

    With the defaults a crashed master is replaced in about 2-4 s
    (``down_after_ms`` plus the election), and ``SENTINEL FAILOVER`` takes
    about a second; the master it demotes keeps serving as a master until the
    sentinels make it a replica, about 10 s later (Sentinel waits a fixed 8 s).

    Args:
        service_name: Name to monitor the master under. Default ``"mymaster"``.
        replicas: Number of replicas, at least 1 (default 1).
        sentinels: Number of sentinels, at least 1 (default 3).
        down_after_ms: The sentinels' ``down-after-milliseconds`` (default
            1000): how long the master may go without a valid reply, in ms,
            before it is considered down.
        failover_timeout_ms: The sentinels' ``failover-timeout`` in ms
            (default 3000); a sentinel does not start another failover of the
            same master within twice this time.
        startup_timeout: Seconds (default 30) to wait for each process to
            start, and again for the whole set-up to be ready.

    Yields:
        The running set-up.

    Raises:
        ValueError: If ``replicas`` or ``sentinels`` is below 1.
        RuntimeError: If no server binary is found or a process fails to start.
        AssertionError: If the set-up is not ready within ``startup_timeout``.
    """
    if replicas < 1 or sentinels < 1:
        raise ValueError(f"need replicas >= 1 and sentinels >= 1, got {replicas}, {sentinels}")
    with ExitStack() as stack:
        # Short, under /tmp: the servers' unix sockets live below it.
        root = Path(tempfile.mkdtemp(prefix="fifolock-sentinel-", dir="/tmp"))
        stack.callback(shutil.rmtree, root, ignore_errors=True)

        def start(name: str, args: Sequence[str], config: str | None = None) -> PrivateRedis:
            datadir = root / name
            datadir.mkdir()
            config_file = None
            if config is not None:
                config_file = datadir / "sentinel.conf"
                config_file.write_text(config)
            return stack.enter_context(
                private_redis_server(
                    extra_args=args,
                    datadir=datadir,
                    startup_timeout=startup_timeout,
                    config_file=config_file,
                )
            )

        master = start("master", _DATA_NODE_ARGS)
        followers = tuple(
            start(f"replica{i}", [*_DATA_NODE_ARGS, "--replicaof", master.host, str(master.port)])
            for i in range(replicas)
        )
        for follower in followers:
            until_sync(
                functools.partial(replica_synced, follower),
                f"replica on port {follower.port} is in sync",
                timeout_s=startup_timeout,
            )
        # Sentinels start after the replicas are in sync: a sentinel learns
        # of replicas from the master's INFO, which it reads at once and then
        # only every 10 s.
        config = (
            f"sentinel monitor {service_name} {master.host} {master.port} {sentinels // 2 + 1}\n"
            f"sentinel down-after-milliseconds {service_name} {down_after_ms}\n"
            f"sentinel failover-timeout {service_name} {failover_timeout_ms}\n"
            f"sentinel parallel-syncs {service_name} 1\n"
        )
        watchers = tuple(start(f"sentinel{i}", ["--sentinel"], config) for i in range(sentinels))
        for watcher in watchers:
            until_sync(
                functools.partial(_sentinel_ready, watcher, service_name, replicas, sentinels - 1),
                f"sentinel on port {watcher.port} sees the master, "
                f"{replicas} replica(s) and {sentinels - 1} other sentinel(s)",
                timeout_s=startup_timeout,
            )
        yield PrivateSentinelSetup(
            service_name=service_name,
            master=master,
            replicas=followers,
            sentinels=watchers,
            down_after_ms=down_after_ms,
            failover_timeout_ms=failover_timeout_ms,
            _stack=stack,
            _startup_timeout=startup_timeout,
        )
