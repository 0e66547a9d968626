"""The locks under test, each behind the same tiny interface.

Every library is called, never copied: an adapter only builds the library's
lock object and calls its own ``acquire``/``release``. Unless a workload asks
for a lease (the crash workload does), each lock is built with the library's
default settings:

- ``fifolock``: ``FifoLock(client, name)`` (lease 60 s, poll 30 s);
- ``fifolock-sync``: ``SyncFifoLock(url, name)``, the same core on its portal;
- ``redis-py-async``: ``redis.asyncio.lock.Lock(client, name)`` (no expiry,
  retries every 0.1 s);
- ``redis-py``: ``redis.lock.Lock(client, name)``, likewise;
- ``python-redis-lock``: ``redis_lock.Lock(client, name)`` (no expiry, waits
  with ``BLPOP`` on a signal list);
- ``pottery``: ``Redlock(key=name, masters={client})`` on one server
  (auto-release after 10 s, retries after a random 0-0.2 s).

A yardstick (``YARDSTICKS``) is not a library: ``fifo-floor`` is the bare FIFO
hand-off of ``benchmarks/floor.py``, run only when ``--only`` names it.

One adapter object is made per contender (task or thread): several of these
libraries keep the owner's token on the lock object.

Every client a process makes reads replies with the parser its ``Connection``
names (``PARSERS``): redis-py's pure-Python parser, or hiredis's C one.
redis-py picks hiredis by itself whenever it is installed; the benchmark names
the parser on every client instead (redis-py's ``parser_class`` option), so one
installation measures both. Every library's clients come from ``Connection``,
including pottery's and python-redis-lock's (they are given a client), and our
lock's pub/sub connection (``client.pubsub()`` shares the client's pool).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import redis
import redis.asyncio
import redis.asyncio.lock
import redis.lock
from redis._parsers import (
    _AsyncHiredisParser,
    _AsyncRESP2Parser,
    _HiredisParser,
    _RESP2Parser,
)
from redis.utils import HIREDIS_AVAILABLE

from redis_fifo_lock import FifoLock, Lease, LoopClients, SyncFifoLock

Kind = Literal["async", "sync"]

Parser = Literal["python", "hiredis"]

PARSERS: tuple[Parser, ...] = ("python", "hiredis")
"""The reply parsers every library is run with: redis-py's own (pure Python)
and hiredis (C; the ``hiredis`` package must be installed)."""

_PARSER_CLASSES: dict[Parser, tuple[type[Any], type[Any]]] = {
    # (sync client's, asyncio client's). redis-py swaps its RESP2 parser for its
    # RESP3 one to match the connection's protocol (RESP3 by default in redis-py 8).
    "python": (_RESP2Parser, _AsyncRESP2Parser),
    "hiredis": (_HiredisParser, _AsyncHiredisParser),
}


def available_parsers() -> tuple[Parser, ...]:
    """The parsers that can run here: hiredis only when it is installed."""
    return PARSERS if HIREDIS_AVAILABLE else ("python",)


def async_parser_class(parser: Parser) -> type[Any]:
    """The asyncio client's reply parser class for ``parser``."""
    return _PARSER_CLASSES[parser][1]


def row_key(library: str, parser: str) -> str:
    """A result row's key: the library's for the pure-Python parser,
    ``<library>+hiredis`` for hiredis."""
    return library if parser == "python" else f"{library}+{parser}"


def split_row_key(key: str) -> tuple[str, Parser]:
    """``row_key``'s inverse: (library key, parser)."""
    library, _, parser = key.partition("+")
    return library, "hiredis" if parser == "hiredis" else "python"


@dataclass(frozen=True)
class Granted:
    """What an acquire reports: the ticket and fence, for libraries that have them."""

    ticket: int | None = None
    fence: int | None = None


class AsyncContender(Protocol):
    """One asyncio task's handle on a lock."""

    async def acquire(self) -> Granted:
        """Block until the lock is ours."""
        ...

    async def release(self) -> None:
        """Give the lock back."""
        ...


class SyncContender(Protocol):
    """One thread's handle on a lock."""

    def acquire(self) -> Granted:
        """Block until the lock is ours."""
        ...

    def release(self) -> None:
        """Give the lock back."""
        ...


class Connection:
    """Where a process's clients connect, and the clients it made (one of each kind).

    Args:
        url: the Redis URL.
        client_name: sent with ``CLIENT SETNAME`` on every connection, so the
            benchmark can count a process's connections in ``CLIENT LIST``.
        parser: which reply parser every client made here uses (``PARSERS``).
        **options: more ``Redis.from_url`` options for every client made here;
            none keeps redis-py's defaults. The idle workload needs a pool
            larger than its waiters (redis-py 8 caps it at 100) and no socket
            timeout (redis-py 8 defaults to 5 s, which ends python-redis-lock's
            blocking ``BLPOP`` waits), so that every library can wait as long as
            the workload needs.
    """

    def __init__(
        self, url: str, client_name: str, parser: Parser = "python", **options: Any
    ) -> None:
        if parser not in available_parsers():
            raise ValueError(f"reply parser {parser!r} is not available here")
        self.url = url
        self.client_name = client_name
        self.parser = parser
        self._options: dict[str, Any] = {"client_name": client_name, **options}
        self._sync_parser, self._async_parser = _PARSER_CLASSES[parser]
        self._sync: redis.Redis | None = None
        self._async: dict[asyncio.AbstractEventLoop, redis.asyncio.Redis] = {}
        self._loop_clients: LoopClients | None = None

    def sync(self) -> redis.Redis:
        """The process's synchronous client (thread-safe, shared by all threads)."""
        if self._sync is None:
            self._sync = redis.Redis.from_url(
                self.url, parser_class=self._sync_parser, **self._options
            )
        return self._sync

    def async_(self) -> redis.asyncio.Redis:
        """The asyncio client of the running loop (shared by all its tasks)."""
        loop = asyncio.get_running_loop()
        client = self._async.get(loop)
        if client is None:
            client = redis.asyncio.Redis.from_url(
                self.url, parser_class=self._async_parser, **self._options
            )
            self._async[loop] = client
        return client

    def async_fresh(self) -> redis.asyncio.Redis:
        """A new asyncio client with this connection's settings, not shared:
        the caller closes it."""
        return redis.asyncio.Redis.from_url(
            self.url, parser_class=self._async_parser, **self._options
        )

    def loop_clients(self) -> LoopClients:
        """A ``LoopClients`` for ``SyncFifoLock`` (its portal builds its own client)."""
        if self._loop_clients is None:
            self._loop_clients = LoopClients(
                self.url, parser_class=self._async_parser, **self._options
            )
        return self._loop_clients

    async def aclose(self) -> None:
        """Close the running loop's asyncio client, if one was made."""
        client = self._async.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()


# --- redis-fifo-lock -------------------------------------------------------------


def _fifo_settings(lease_ms: int | None) -> dict[str, Any]:
    # poll_ms may be at most lease_ms / 2; with a short lease, use that maximum.
    return {} if lease_ms is None else {"lease_ms": lease_ms, "poll_ms": lease_ms // 2}


def _taken(lease: Lease | None) -> Lease:
    if lease is None:
        raise RuntimeError("release() called before acquire()")
    return lease


class FifoAsync:
    """``FifoLock``: the asyncio core."""

    def __init__(self, conn: Connection, name: str, lease_ms: int | None) -> None:
        self._lock = FifoLock(conn.async_(), name, **_fifo_settings(lease_ms))
        self._lease: Lease | None = None

    async def acquire(self) -> Granted:
        """``await lock.acquire()``."""
        self._lease = await self._lock.acquire()
        return Granted(self._lease.ticket, self._lease.fence)

    async def release(self) -> None:
        """``await lock.release(lease)``."""
        lease, self._lease = _taken(self._lease), None
        await self._lock.release(lease)


class FifoSync:
    """``SyncFifoLock``: the same core, run on the process's portal thread."""

    def __init__(self, conn: Connection, name: str, lease_ms: int | None) -> None:
        self._lock = SyncFifoLock(conn.loop_clients(), name, **_fifo_settings(lease_ms))
        self._lease: Lease | None = None

    def acquire(self) -> Granted:
        """``lock.acquire()``."""
        self._lease = self._lock.acquire()
        return Granted(self._lease.ticket, self._lease.fence)

    def release(self) -> None:
        """``lock.release(lease)``."""
        lease, self._lease = _taken(self._lease), None
        self._lock.release(lease)


# --- redis-py ----------------------------------------------------------------------


class RedisPyAsync:
    """``redis.asyncio.lock.Lock`` with its defaults (``timeout`` = the lease if given)."""

    def __init__(self, conn: Connection, name: str, lease_ms: int | None) -> None:
        timeout = None if lease_ms is None else lease_ms / 1000
        self._lock = redis.asyncio.lock.Lock(conn.async_(), name, timeout=timeout)

    async def acquire(self) -> Granted:
        """``await lock.acquire()`` (blocking, no timeout)."""
        if not await self._lock.acquire():
            raise RuntimeError("redis.asyncio Lock.acquire() returned False")
        return Granted()

    async def release(self) -> None:
        """``await lock.release()``."""
        await self._lock.release()


class RedisPySync:
    """``redis.lock.Lock`` with its defaults (``timeout`` = the lease if given)."""

    def __init__(self, conn: Connection, name: str, lease_ms: int | None) -> None:
        timeout = None if lease_ms is None else lease_ms / 1000
        self._lock = redis.lock.Lock(conn.sync(), name, timeout=timeout)

    def acquire(self) -> Granted:
        """``lock.acquire()`` (blocking, no timeout)."""
        if not self._lock.acquire():
            raise RuntimeError("redis Lock.acquire() returned False")
        return Granted()

    def release(self) -> None:
        """``lock.release()``."""
        self._lock.release()


# --- python-redis-lock ---------------------------------------------------------------


class PythonRedisLock:
    """``redis_lock.Lock`` with its defaults (``expire`` = the lease if given).

    Its ``expire`` is a whole number of seconds, so a lease must be a multiple
    of 1000 ms.
    """

    def __init__(self, conn: Connection, name: str, lease_ms: int | None) -> None:
        import redis_lock  # type: ignore[import-untyped]

        if lease_ms is not None and lease_ms % 1000:
            raise ValueError(f"python-redis-lock leases are whole seconds, got {lease_ms} ms")
        expire = None if lease_ms is None else lease_ms // 1000
        self._lock = redis_lock.Lock(conn.sync(), name, expire=expire)

    def acquire(self) -> Granted:
        """``lock.acquire()`` (blocking, no timeout)."""
        if not self._lock.acquire():
            raise RuntimeError("redis_lock.Lock.acquire() returned False")
        return Granted()

    def release(self) -> None:
        """``lock.release()``."""
        self._lock.release()


# --- pottery -----------------------------------------------------------------------------


class PotteryRedlock:
    """pottery's ``Redlock`` on one master (``auto_release_time`` = the lease if given)."""

    def __init__(self, conn: Connection, name: str, lease_ms: int | None) -> None:
        from pottery import Redlock

        if lease_ms is None:
            self._lock = Redlock(key=name, masters={conn.sync()})
        else:
            self._lock = Redlock(key=name, masters={conn.sync()}, auto_release_time=lease_ms / 1000)

    def acquire(self) -> Granted:
        """``lock.acquire()`` (blocking, no timeout)."""
        if not self._lock.acquire():
            raise RuntimeError("pottery Redlock.acquire() returned False")
        return Granted()

    def release(self) -> None:
        """``lock.release()``."""
        self._lock.release()


AsyncFactory = Callable[[Connection, str, "int | None"], AsyncContender]
SyncFactory = Callable[[Connection, str, "int | None"], SyncContender]


@dataclass(frozen=True)
class Library:
    """A lock under test.

    Attributes:
        key: short id used in results and on the command line.
        label: display name, with the class that is called.
        kind: ``"async"`` (asyncio tasks) or ``"sync"`` (threads).
        ours: True for redis-fifo-lock.
        package: distribution whose version is reported.
        make_async / make_sync: build one contender's adapter (the one that
            matches ``kind``), given the process's ``Connection``, the lock
            name and the lease in ms (None: the library's default).
        hold_lease_ms: the lease to use when this library must *hold* the lock
            through a long idle-waiting window (None: the default holds it
            indefinitely or renews it).
    """

    key: str
    label: str
    kind: Kind
    ours: bool
    package: str
    make_async: AsyncFactory | None = None
    make_sync: SyncFactory | None = None
    hold_lease_ms: int | None = None

    @property
    def version(self) -> str:
        """The installed version of the library's distribution."""
        try:
            return importlib.metadata.version(self.package)
        except importlib.metadata.PackageNotFoundError:
            return "?"


LIBRARIES: tuple[Library, ...] = (
    Library("fifolock", "redis-fifo-lock FifoLock", "async", True, "redis-fifo-lock", FifoAsync),
    Library(
        "fifolock-sync",
        "redis-fifo-lock SyncFifoLock",
        "sync",
        True,
        "redis-fifo-lock",
        make_sync=FifoSync,
    ),
    Library("redis-py-async", "redis.asyncio.lock.Lock", "async", False, "redis", RedisPyAsync),
    Library("redis-py", "redis.lock.Lock", "sync", False, "redis", make_sync=RedisPySync),
    Library(
        "python-redis-lock",
        "python-redis-lock Lock",
        "sync",
        False,
        "python-redis-lock",
        make_sync=PythonRedisLock,
    ),
    Library(
        "pottery",
        "pottery Redlock (1 server)",
        "sync",
        False,
        "pottery",
        make_sync=PotteryRedlock,
        # Redlock auto-releases after 10 s by default; an idle-window holder
        # needs longer. The waiters keep the default.
        hold_lease_ms=600_000,
    ),
)


def _fifo_floor(conn: Connection, name: str, lease_ms: int | None) -> AsyncContender:
    from benchmarks.floor import FifoFloor  # it imports this module

    return FifoFloor(conn, name, lease_ms)


YARDSTICKS: tuple[Library, ...] = (
    Library(
        "fifo-floor",
        "bare FIFO hand-off (benchmarks/floor.py; no safety, a yardstick)",
        "async",
        False,
        "redis",
        _fifo_floor,
    ),
)
"""Not locks to use: run only when named with ``--only``, and only in the
workloads of ``YARDSTICK_WORKLOADS``."""

YARDSTICK_WORKLOADS = ("uncontended", "contended")
"""The workloads a yardstick can run: the others hold the lock through an idle
window, kill a holder or count keys, which a yardstick does not survive."""

BY_KEY = {library.key: library for library in (*LIBRARIES, *YARDSTICKS)}


def holder_kind(library: Library) -> Library:
    """The library that holds the lock for ``library``'s idle waiters, in the
    (synchronous) benchmark driver: the sync twin of an async library. Both
    twins use the same keys, so they exclude each other."""
    twins = {"fifolock": "fifolock-sync", "redis-py-async": "redis-py"}
    return BY_KEY[twins.get(library.key, library.key)]
