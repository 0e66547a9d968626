"""``CacheFifoLock``: what ``cache.fifo_lock()`` returns, for sync and async code.

A Django cache backend instance lives in one thread or async context (Django
makes one per thread and per async task), so it must not own Redis clients for
the lock: an asyncio client belongs to one event loop, and a sync view, an async
view and ``async_to_sync`` each run on a different one. The lock therefore
takes its connections from ``shared_clients()``: one ``LoopClients`` per
connection configuration for the whole process, which builds one client per
running loop (and after ``fork()``) and closes it when that loop closes. Sync
code goes through ``SyncFifoLock``, whose portal loop gets its client from the
same ``LoopClients``.

Nothing here speaks the lock protocol: the object only chooses between the
core's ``SyncFifoLock.hold`` and ``FifoLock.hold``.
"""

from __future__ import annotations

import asyncio
import threading
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

from django.core.cache import InvalidCacheBackendError, caches
from django.core.cache.backends.base import BaseCache
from django.core.exceptions import ImproperlyConfigured

from redis_fifo_lock import FifoLock, Lease, LockSettings, LockUsageError, LoopClients, SyncFifoLock
from redis_fifo_lock.lock import check_timeout
from redis_fifo_lock.settings import check_name

from .conf import SETTING, fifolock_settings

_registry: dict[tuple[str, str], LoopClients] = {}
_registry_guard = threading.Lock()


def shared_clients(url: str, **connection_kwargs: Any) -> LoopClients:
    """The process-wide ``LoopClients`` for one connection configuration.

    Args:
        url: ``redis://``, ``rediss://`` or ``unix://`` URL (str), with the
            database and credentials it carries.
        **connection_kwargs: extra ``redis.asyncio`` connection options
            (``password``, ``socket_timeout`` in seconds, ``max_connections``...).

    Every cache backend instance (one per thread or async context) with the
    same settings gets the same object, so a process holds at most one client
    per event loop per configuration. Nothing is ever closed here: each client
    is closed by its loop's ``close()``; the sync portal's lives as long as the
    process.
    """
    key = (url, repr(sorted(connection_kwargs.items())))
    with _registry_guard:
        clients = _registry.get(key)
        if clients is None:
            clients = _registry[key] = LoopClients(url, **connection_kwargs)
        return clients


class CacheFifoLock:
    """A FIFO lock on the cache's Redis server, usable as ``with`` or ``async with``.

    Made by ``cache.fifo_lock(name, timeout)``; entering it waits for the lock
    (in arrival order) and yields the core's ``Lease`` (``.fence``, ``.lost``);
    leaving it releases the lock::

        with cache.fifo_lock("invoices", timeout=10) as lease: ...        # sync
        async with cache.fifo_lock("invoices", timeout=10) as lease: ...  # async

    Args:
        clients: where connections come from (see ``shared_clients``).
        name: the lock name given to the core (str), i.e. the cache key
            (``cache.make_key(name)``), already validated.
        timeout: seconds (float) to wait on entry; None waits forever, 0 tries
            once.
        settings: ``lease_ms``, ``poll_ms``, ``max_hold_ms`` (int milliseconds).

    Entering raises ``LockTimeout`` (a ``TimeoutError``; ``.waited`` in seconds,
    ``.holder_fence``) when ``timeout`` runs out, and ``RedisUnavailable`` when
    Redis cannot be reached - whatever the cache's ``IGNORE_EXCEPTIONS`` says: a
    lock never fails open. Leaving raises ``LeaseLost`` when the lease was lost
    while the block ran. One object serves one ``with`` at a time; entering it
    again while held raises ``LockUsageError``. Sync ``with`` in a thread that
    runs an event loop raises ``LockUsageError`` (it would block the loop): use
    ``async with`` there.
    """

    def __init__(
        self, clients: LoopClients, name: str, timeout: float | None, settings: LockSettings
    ) -> None:
        self.name = check_name(name)
        self.timeout = check_timeout(timeout)
        self.settings = settings
        self.clients = clients
        self._held: AbstractContextManager[Lease] | AbstractAsyncContextManager[Lease] | None = None

    def __repr__(self) -> str:
        return f"<CacheFifoLock {self.name!r} timeout={self.timeout} {self.settings}>"

    def sync_lock(self) -> SyncFifoLock:
        """The core's ``SyncFifoLock`` for this lock (for ``acquire``/``status``...)."""
        settings = self.settings
        return SyncFifoLock(
            self.clients,
            self.name,
            lease_ms=settings.lease_ms,
            poll_ms=settings.poll_ms,
            max_hold_ms=settings.max_hold_ms,
        )

    def async_lock(self) -> FifoLock:
        """The core's ``FifoLock`` for this lock on the running event loop's client.

        Raises:
            RuntimeError: when no event loop is running in this thread.
        """
        settings = self.settings
        return FifoLock(
            self.clients.client(),
            self.name,
            lease_ms=settings.lease_ms,
            poll_ms=settings.poll_ms,
            max_hold_ms=settings.max_hold_ms,
        )

    def _claim(self, how: str) -> None:
        if self._held is not None:
            raise LockUsageError(
                self.name,
                f"this cache.fifo_lock() object is already entered; {how} needs a "
                "fresh cache.fifo_lock(...) call",
            )

    def __enter__(self) -> Lease:
        self._claim("each `with`")
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise LockUsageError(
                self.name,
                "`with cache.fifo_lock(...)` was used in a thread running an event loop, "
                "where waiting would block every task on it; use "
                "`async with cache.fifo_lock(...)` in async code",
            )
        hold = self.sync_lock().hold(self.timeout)
        lease = hold.__enter__()
        self._held = hold
        return lease

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        hold, self._held = self._held, None
        if not isinstance(hold, AbstractContextManager):
            raise LockUsageError(self.name, "__exit__ without a matching `with` entry")
        return hold.__exit__(exc_type, exc, traceback)

    async def __aenter__(self) -> Lease:
        self._claim("each `async with`")
        hold = self.async_lock().hold(self.timeout)
        lease = await hold.__aenter__()
        self._held = hold
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        hold, self._held = self._held, None
        if not isinstance(hold, AbstractAsyncContextManager):
            raise LockUsageError(self.name, "__aexit__ without a matching `async with` entry")
        return await hold.__aexit__(exc_type, exc, traceback)


@runtime_checkable
class SupportsFifoLock(Protocol):
    """A cache backend with ``fifo_lock()``, such as ``fifolock_django.cache.RedisCache``."""

    def fifo_lock(
        self,
        name: str,
        timeout: float | None = None,
        *,
        version: int | None = None,
        lease_ms: int | None = None,
        poll_ms: int | None = None,
        max_hold_ms: int | None = None,
    ) -> CacheFifoLock:
        """See ``fifolock_django.cache.RedisCache.fifo_lock``."""
        ...


def cache_lock(
    cache: BaseCache,
    clients: LoopClients,
    name: str,
    timeout: float | None = None,
    *,
    version: int | None = None,
    lease_ms: int | None = None,
    poll_ms: int | None = None,
    max_hold_ms: int | None = None,
) -> CacheFifoLock:
    """Build the ``CacheFifoLock`` that a backend's ``fifo_lock()`` returns.

    The lock name given to the core is ``cache.make_key(name, version)`` (so
    the cache's ``KEY_PREFIX``, ``VERSION`` and ``KEY_FUNCTION`` apply);
    ``lease_ms``/``poll_ms``/``max_hold_ms`` (int milliseconds) default to
    ``FIFOLOCK``, read now. Nothing touches Redis here.

    Raises:
        ValueError: for a bad ``name``, ``timeout`` or timing argument (the
            message names it).
        ImproperlyConfigured: when ``FIFOLOCK`` is invalid, or the cache's key
            function turns a valid ``name`` into an invalid lock name (e.g. a
            ``KEY_PREFIX`` containing ``{`` or ``}``).
    """
    check_name(name)
    key = str(cache.make_key(name, version=version))
    try:
        check_name(key)
    except ValueError as exc:
        raise ImproperlyConfigured(
            f"cache.fifo_lock({name!r}): the cache's KEY_PREFIX, VERSION or KEY_FUNCTION "
            f"make the lock name {key!r}, which the lock refuses ({exc}); change KEY_PREFIX "
            "(or KEY_FUNCTION) in the cache's CACHES entry"
        ) from exc
    defaults = fifolock_settings().lock
    settings = LockSettings(
        lease_ms=defaults.lease_ms if lease_ms is None else lease_ms,
        poll_ms=defaults.poll_ms if poll_ms is None else poll_ms,
        max_hold_ms=defaults.max_hold_ms if max_hold_ms is None else max_hold_ms,
    )
    return CacheFifoLock(clients, key, timeout, settings)


def lock_cache(alias: str | None = None) -> SupportsFifoLock:
    """The cache ``alias`` (default: ``FIFOLOCK['CACHE']``, read now), checked to
    have ``fifo_lock()``.

    Raises:
        ImproperlyConfigured: when ``alias`` is not in ``CACHES`` or its backend
            has no ``fifo_lock()``; the message names the setting to change.
    """
    if alias is None:
        alias = fifolock_settings().cache
    try:
        cache = caches[alias]
    except (InvalidCacheBackendError, ImproperlyConfigured) as exc:
        raise ImproperlyConfigured(
            f"the FIFO lock cache {alias!r} (from {SETTING}['CACHE'] or the caller) "
            f"is unusable: {exc}"
        ) from exc
    if not isinstance(cache, SupportsFifoLock):
        raise ImproperlyConfigured(
            f"cache {alias!r} ({type(cache).__module__}.{type(cache).__qualname__}) has no "
            f"fifo_lock(); set CACHES[{alias!r}]['BACKEND'] to "
            f"'fifolock_django.cache.RedisCache' or {SETTING}['CACHE'] to a cache that uses it"
        )
    return cache
