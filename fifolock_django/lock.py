"""``CacheFifoLock``: what ``cache.fifo_lock()`` returns, for sync and async code.

A Django cache backend instance lives in one thread or async context (Django
makes one per thread and per async task), so it must not own Redis clients for
the lock: an asyncio client belongs to one event loop, and a sync view, an async
view and ``async_to_sync`` each run on a different one. The lock therefore
takes its connections from the core's ``LockServer.clients()``: one
``LoopClients`` per server configuration for the whole process, which builds one client per
running loop and process id (so a forked child never shares its parent's
sockets) and closes it when that loop closes. Sync code goes through
``SyncFifoLock``, whose portal loop gets its client from the same
``LoopClients``. The backend keeps nothing: ``FifoLockMixin`` looks the
``LoopClients`` up again from the cache's settings at every ``fifo_lock()``.

Nothing here speaks the lock protocol: the object only chooses between the
core's ``SyncFifoLock`` and ``FifoLock``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from django.conf import settings as django_settings
from django.core.cache import InvalidCacheBackendError, caches
from django.core.cache.backends.base import BaseCache
from django.core.exceptions import ImproperlyConfigured

from redis_fifo_lock import (
    FifoLock,
    Lease,
    LockOptions,
    LockServer,
    LockSettings,
    LockStatus,
    LockUsageError,
    LoopClients,
    SyncFifoLock,
)
from redis_fifo_lock.lock import check_timeout
from redis_fifo_lock.metrics import lock_labels
from redis_fifo_lock.settings import MAX_NAME_BYTES, check_name, check_namespace, shown_value

from .conf import SETTING, fifolock_settings, setting_name

if TYPE_CHECKING:
    from typing_extensions import Unpack

LOCK_BACKENDS = {
    "django_redis.cache.RedisCache": "fifolock_django.cache.RedisCache",
    "django.core.cache.backends.redis.RedisCache": "fifolock_django.builtin.RedisCache",
}
"""The Redis cache backends this package extends, mapped to the backend to use
instead (dotted paths): django-redis's and Django's built-in one."""


def suggested_backend(backend: str) -> str:
    """The FIFO lock backend(s) to use instead of ``backend`` (a dotted path), quoted,
    for error messages: the matching one for a known Redis backend, else both."""
    if backend in LOCK_BACKENDS:
        return repr(LOCK_BACKENDS[backend])
    return " or ".join(f"{ours!r} (for {theirs})" for theirs, ours in LOCK_BACKENDS.items())


def cache_alias(location: object, params: Mapping[str, Any]) -> str | None:
    """The alias in ``settings.CACHES`` of the entry a backend was built from, for
    messages: the one whose ``LOCATION`` is ``location`` and whose other keys
    (less ``BACKEND``) are ``params``, as Django's cache handler splits it.

    Returns:
        the alias (str), or None when no entry or several match (a backend
        built by hand, or two identical entries).
    """
    found = []
    for alias, config in django_settings.CACHES.items():
        rest = {key: value for key, value in config.items() if key not in ("BACKEND", "LOCATION")}
        if config.get("LOCATION", "") == location and rest == params:
            found.append(alias)
    return found[0] if len(found) == 1 else None


def options_setting(alias: str | None) -> str:
    """How messages spell the ``OPTIONS`` of the cache ``alias`` (str, or None
    when unknown): ``CACHES['default']['OPTIONS']``, or just ``OPTIONS``."""
    return "OPTIONS" if alias is None else f"CACHES[{alias!r}]['OPTIONS']"


def _no_running_loop(name: str, what: str) -> None:
    """Raise ``LockUsageError`` if this thread runs an event loop (``what`` would
    block it); sync code is fine."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise LockUsageError(
        name,
        f"{what} was used in a thread running an event loop, where waiting would block "
        "every task on it; use `async with cache.fifo_lock(...)` or the a-prefixed "
        "methods (aacquire, arelease, astatus) in async code",
    )


class CacheFifoLock:
    """A FIFO lock on the cache's Redis server, usable as ``with`` or ``async with``.

    Made by ``cache.fifo_lock(name, timeout)``; entering it waits for the lock
    (in arrival order) and yields the core's ``Lease`` (``.fence``, ``.lost``);
    leaving it releases the lock::

        with cache.fifo_lock("invoices", timeout=10) as lease: ...        # sync
        async with cache.fifo_lock("invoices", timeout=10) as lease: ...  # async

    For acquire and release in different places, ``acquire()``/``release()``
    (sync) and their twins ``aacquire()``/``arelease()`` (async) take and give
    back a ``Lease``; a lease may be released by either twin, from another
    thread or another event loop than the one that acquired it. ``status()``
    and ``astatus()`` read the lock without joining the queue.

    Args:
        clients: where connections come from (``LockServer.clients()``).
        name: the lock name given to the core (str), i.e. the cache key
            (``cache.make_key(name)``), already validated.
        timeout: seconds (float) to wait on entry; None waits forever, 0 tries
            once.
        settings: the lock's ``LockSettings`` (``lease_ms``, ``poll_ms``,
            ``max_hold_ms``, ``replicas``, ``replica_wait_ms``), given whole to
            the core's lock.
        namespace: put in front of the lock's keys (str, default "": none), the
            cache's ``KEY_PREFIX`` (see ``namespace_of``).
        name_template: the label of the lock's OpenTelemetry metrics and spans
            (str, or None, default: "(untemplated)"), see ``fifo_lock``.

    Raises:
        ValueError: for a bad ``name``, ``timeout``, ``namespace`` or
            ``name_template``.

    Entering raises ``LockTimeout`` (a ``TimeoutError``; ``.waited`` in seconds,
    ``.holder_fence``) when ``timeout`` runs out, and ``RedisUnavailable`` when
    Redis cannot be reached - whatever the cache's ``IGNORE_EXCEPTIONS`` says: a
    lock never fails open. With ``replicas`` above 0, entering raises
    ``NotReplicated`` (a ``RedisUnavailable``) when too few replicas
    acknowledged the grant in time. Leaving raises ``LeaseLost`` when the lease was lost
    while the block ran. One object may be shared, as a ``threading.Lock``
    is: each thread (``with``) or asyncio task (``async with``) that enters it
    waits for a lease of its own, which its own exit releases; entering it
    again from the same thread or task while inside raises
    ``LockUsageError``. A block left by another task than the one that
    entered it (an async generator closed elsewhere, ``wait_for``'s own task)
    releases the object's one hold; while several tasks hold the object, that
    raises ``LockUsageError`` instead, since it cannot say whose lease to
    release. The sync forms (``with``,
    ``acquire``, ``release``, ``status``) in a thread that runs an event loop
    raise ``LockUsageError`` (they would block the loop): use the async ones.

    Where the lease is renewed: in the background on the event loop that
    acquired it - the process's portal loop for the sync forms, the running
    loop for the async ones. A lease acquired by ``aacquire()`` inside an
    ``async_to_sync`` call whose loop then closes moves to the portal loop,
    which renews it until it is released.
    """

    def __init__(
        self,
        clients: LoopClients,
        name: str,
        timeout: float | None,
        settings: LockSettings,
        namespace: str = "",
        name_template: str | None = None,
    ) -> None:
        self.name = check_name(name)
        self.namespace = check_namespace(namespace)
        self.labels = lock_labels(name, name_template, "django")
        self.timeout = check_timeout(timeout)
        self.settings = settings
        self.clients = clients
        # The holds of the threads and tasks inside a with block of this object,
        # by thread id or task: one entry per block entered and not yet left.
        self._holds: dict[
            object, AbstractContextManager[Lease] | AbstractAsyncContextManager[Lease]
        ] = {}

    def __repr__(self) -> str:
        return f"<CacheFifoLock {self.name!r} timeout={self.timeout} {self.settings}>"

    def sync_lock(self) -> SyncFifoLock:
        """The core's ``SyncFifoLock`` for this lock (runs on the portal loop)."""
        return SyncFifoLock(self.clients, self.name, **self._core_options())

    def async_lock(self) -> FifoLock:
        """The core's ``FifoLock`` for this lock; each call uses the running event
        loop's client (awaiting one with no running loop raises ``RuntimeError``).
        """
        return FifoLock(self.clients, self.name, **self._core_options())

    def _core_options(self) -> dict[str, Any]:
        """The keyword arguments both core locks take from this one."""
        return {
            "settings": self.settings,
            "namespace": self.namespace,
            "name_template": self.labels.name_template,
            "integration": self.labels.integration,
        }

    # --- acquire and release in different places --------------------------------------

    def acquire(self) -> Lease:
        """Block until granted (at most ``timeout`` seconds) and return the ``Lease``.

        The lease is renewed by the process's portal loop until ``release()`` or
        ``arelease()``, whichever thread or loop calls it.

        Raises:
            LockTimeout: (a ``TimeoutError``) ``timeout`` ran out; nothing is
                left queued.
            RedisUnavailable: Redis could not be reached.
            LockUsageError: called in a thread running an event loop.
        """
        _no_running_loop(self.name, "cache.fifo_lock(...).acquire()")
        return self.sync_lock().acquire(self.timeout)

    async def aacquire(self) -> Lease:
        """The async twin of ``acquire()``: wait on the running loop, which renews
        the lease until it is released (or, if it closes first, until then, and
        the portal loop after that).

        Raises:
            LockTimeout: (a ``TimeoutError``) ``timeout`` ran out.
            RedisUnavailable: Redis could not be reached.
        """
        return await self.async_lock().acquire(self.timeout)

    def release(self, lease: Lease) -> None:
        """Release ``lease`` (from any thread without a running loop) and hand the
        lock to the next waiter. Releasing twice is a no-op.

        Raises:
            LeaseLost: the lease had expired or been taken before this release.
            RedisUnavailable: Redis could not be reached; retry the release.
            LockUsageError: ``lease`` is another lock's, or this thread runs an
                event loop.
        """
        _no_running_loop(self.name, "cache.fifo_lock(...).release()")
        self.sync_lock().release(lease)

    async def arelease(self, lease: Lease) -> None:
        """The async twin of ``release()``; works on any loop, also when the loop
        that acquired ``lease`` has closed.

        Raises:
            LeaseLost: the lease had expired or been taken before this release.
            RedisUnavailable: Redis could not be reached; retry the release.
            LockUsageError: ``lease`` is another lock's.
        """
        await self.async_lock().release(lease)

    def status(self) -> LockStatus:
        """A snapshot of the lock (``held``, ``fence``, ``waiting``,
        ``holder_fence``, ``lease_left_ms``...), without joining the queue.

        Raises:
            RedisUnavailable: Redis could not be reached.
            LockUsageError: called in a thread running an event loop.
        """
        _no_running_loop(self.name, "cache.fifo_lock(...).status()")
        return self.sync_lock().status()

    async def astatus(self) -> LockStatus:
        """The async twin of ``status()``.

        Raises:
            RedisUnavailable: Redis could not be reached.
        """
        return await self.async_lock().status()

    # --- with / async with ------------------------------------------------------------

    def _claim(self, inside: object, how: str) -> None:
        if inside in self._holds:
            raise LockUsageError(
                self.name,
                f"this cache.fifo_lock() object is already entered by this {how}; "
                "a nested block needs a fresh cache.fifo_lock(...) call",
            )

    def __enter__(self) -> Lease:
        _no_running_loop(self.name, "`with cache.fifo_lock(...)`")
        inside = threading.get_ident()
        self._claim(inside, "thread")
        hold = self.sync_lock().hold(self.timeout)
        lease = hold.__enter__()
        self._holds[inside] = hold
        return lease

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        hold = self._leaving(threading.get_ident(), AbstractContextManager)
        if not isinstance(hold, AbstractContextManager):
            raise LockUsageError(self.name, "__exit__ without a matching `with` entry")
        return hold.__exit__(exc_type, exc, traceback)

    async def __aenter__(self) -> Lease:
        inside = _current_task(self.name)
        self._claim(inside, "asyncio task")
        hold = self.async_lock().hold(self.timeout)
        lease = await hold.__aenter__()
        self._holds[inside] = hold
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        hold = self._leaving(_current_task(self.name), AbstractAsyncContextManager)
        if not isinstance(hold, AbstractAsyncContextManager):
            raise LockUsageError(self.name, "__aexit__ without a matching `async with` entry")
        return await hold.__aexit__(exc_type, exc, traceback)

    def _leaving(
        self, inside: object, kind: type
    ) -> AbstractContextManager[Lease] | AbstractAsyncContextManager[Lease] | None:
        """The hold a block's exit in ``inside`` (a thread id or task) releases,
        forgotten: its own, else the object's only hold of ``kind`` (a block
        entered in another task or thread), else None.

        Raises:
            LockUsageError: ``inside`` entered nothing and several holds of
                ``kind`` are open: whose lease to release cannot be told.
        """
        hold = self._holds.pop(inside, None)
        if hold is not None:
            return hold
        others = [key for key, open_hold in self._holds.items() if isinstance(open_hold, kind)]
        if len(others) > 1:
            raise LockUsageError(
                self.name,
                f"a block of this cache.fifo_lock() object is left in another thread or task "
                f"than the one that entered it, while {len(others)} hold it: whose lease to "
                "release cannot be told; give each thread or task an object of its own",
            )
        return self._holds.pop(others[0]) if others else None


def _current_task(name: str) -> asyncio.Task[Any]:
    """The running asyncio task, which an ``async with`` block belongs to.

    Raises:
        LockUsageError: no task runs (a coroutine driven by hand).
    """
    task = asyncio.current_task()
    if task is None:
        raise LockUsageError(name, "`async with cache.fifo_lock(...)` must run in an asyncio task")
    return task


@runtime_checkable
class SupportsFifoLock(Protocol):
    """A cache backend with ``fifo_lock()``, such as ``fifolock_django.cache.RedisCache``
    or ``fifolock_django.builtin.RedisCache``."""

    def fifo_lock(
        self,
        name: str,
        timeout: float | None = None,
        *,
        version: int | None = None,
        name_template: str | None = None,
        **options: Unpack[LockOptions],
    ) -> CacheFifoLock:
        """See ``FifoLockMixin.fifo_lock``."""
        ...


class FifoLockMixin(BaseCache):
    """Adds ``fifo_lock()`` to a Redis cache backend; put it first among the bases.

    A subclass says where its locks connect by implementing
    ``fifo_lock_connection()`` from its own ``LOCATION`` and ``OPTIONS``. The
    mixin stores nothing on the backend instance (Django makes one per thread
    and async context, and closes it after every request): connections live in
    the process-wide registry of the core (``LockServer.clients``). The cache's ``close()`` is
    left as it is and never touches them - cheap, idempotent, and safe while
    other requests of the process hold locks.
    """

    def fifo_lock_connection(self) -> LockServer:
        """Where this cache's locks live (``redis_fifo_lock.LockServer``: one
        server, a Sentinel master or a Redis Cluster, with the ``redis.asyncio``
        connection kwargs).

        Raises:
            ImproperlyConfigured: when the settings cannot make a lock connection.
        """
        raise NotImplementedError(f"{type(self).__qualname__} must define fifo_lock_connection()")

    @property
    def fifo_lock_clients(self) -> LoopClients:
        """The process-wide connection source of this cache's locks (``LoopClients``),
        looked up (not stored) at every access.

        Raises:
            ImproperlyConfigured: see ``fifo_lock_connection``.
        """
        return self.fifo_lock_connection().clients()

    def fifo_lock(
        self,
        name: str,
        timeout: float | None = None,
        *,
        version: int | None = None,
        name_template: str | None = None,
        **options: Unpack[LockOptions],
    ) -> CacheFifoLock:
        """A FIFO lock named by the cache key of ``name``, for ``with`` or ``async with``.

        Args:
            name: what the lock guards (str, no ``{``/``}``). The Redis lock name
                is ``self.make_key(name, version)``, so locks of caches with
                different ``KEY_PREFIX``, ``VERSION`` or ``KEY_FUNCTION`` never
                collide. The keys also start with the ``KEY_PREFIX`` (so an
                ACL key pattern ``~<prefix>:*`` covers them):
                ``<prefix>:fifolock:{<prefix>:<version>:<name>}:queue``, or
                ``fifolock:{:<version>:<name>}:queue`` without a prefix.
            timeout: seconds (float) to wait when entering; None (default)
                waits forever, 0 tries once.
            version: cache key version (int); default the cache's ``VERSION``.
            lease_ms: int milliseconds overriding ``FIFOLOCK['LEASE_MS']``.
            poll_ms: int milliseconds overriding ``FIFOLOCK['POLL_MS']``.
            max_hold_ms: int milliseconds overriding ``FIFOLOCK['MAX_HOLD_MS']``.
            replicas: int overriding ``FIFOLOCK['REPLICAS']``: how many
                replicas must acknowledge each grant and renewal (for Sentinel
                set-ups; see ``redis_fifo_lock.LockSettings``).
            replica_wait_ms: int milliseconds overriding
                ``FIFOLOCK['REPLICA_WAIT_MS']``: how long each grant and renewal
                waits for those acknowledgements.
            name_template: the template ``name`` was filled in from (str, e.g.
                ``"invoice-{id}"``; a fixed name is its own template), recorded
                with the lock's OpenTelemetry metrics and spans
                (``redis_fifo_lock.metrics``, integration ``django``) in place
                of the name; default None: ``"(untemplated)"``.

        Returns:
            a ``CacheFifoLock``; entering it yields the ``Lease``. See there for
            what entering and leaving raise (``LockTimeout``, ``LeaseLost``,
            ``RedisUnavailable``, ``NotReplicated`` - never swallowed, even with
            ``IGNORE_EXCEPTIONS``). Nothing touches Redis until it is used.

        Raises:
            ValueError: for a bad ``name``, ``timeout``, lock option or
                ``name_template``, or ``replicas`` above 0 on a Redis Cluster cache.
            ImproperlyConfigured: for an invalid ``FIFOLOCK`` (or its
                ``REPLICAS`` above 0 on a Redis Cluster cache), a ``KEY_PREFIX``
                that makes an invalid lock name, or connection settings the
                lock cannot use (such as a Sentinel set-up without ``SENTINELS``).
        """
        return cache_lock(
            self, self.fifo_lock_connection(), name, timeout, version, options, name_template
        )


SHORT_NAME = "x"
"""A name any cache must accept: ``lock_key`` tells a prefix problem from a long name by it."""


def lock_key(cache: BaseCache, name: str, version: int | None = None) -> str:
    """The lock name the core gets for ``name`` on ``cache``: ``cache.make_key(name,
    version)`` (``KEY_PREFIX``, ``VERSION`` and ``KEY_FUNCTION`` apply), checked.

    Raises:
        ValueError: ``name`` itself is not a valid lock name, or is longer than
            this cache allows: ``MAX_NAME_BYTES`` less the bytes that
            ``KEY_PREFIX``, ``VERSION`` and ``KEY_FUNCTION`` add (the message
            says that limit).
        ImproperlyConfigured: the cache's key function turns a valid short
            name into an invalid lock name (e.g. a ``KEY_PREFIX`` with ``{``).
    """
    check_name(name)
    key = str(cache.make_key(name, version=version))
    try:
        return check_name(key)
    except ValueError as exc:
        error = exc
    try:
        check_name(str(cache.make_key(SHORT_NAME, version=version)))
    except ValueError:
        raise ImproperlyConfigured(
            f"cache.fifo_lock({shown_value(name)}): the cache's KEY_PREFIX, VERSION or "
            f"KEY_FUNCTION make lock names the lock refuses ({error}); change KEY_PREFIX "
            "(or KEY_FUNCTION) in the cache's CACHES entry"
        ) from error
    # Only the length is wrong: say how long a name may be on this cache.
    size = len(name.encode("utf-8"))
    added = len(key.encode("utf-8", "replace")) - size
    raise ValueError(
        f"cache.fifo_lock({shown_value(name)}): the name is {size} bytes long (UTF-8), and "
        f"on this cache it may be at most {MAX_NAME_BYTES - added} bytes: a lock name "
        f"holds at most {MAX_NAME_BYTES} bytes, and the cache's KEY_PREFIX and VERSION "
        f"(or KEY_FUNCTION) add {added}; use a shorter name"
    ) from None


def namespace_of(cache: BaseCache) -> str:
    """The namespace of ``cache``'s locks: its ``KEY_PREFIX`` ("" when unset), put
    in front of every lock key and channel, so that they fall under the cache's
    own key pattern.

    Raises:
        ImproperlyConfigured: ``KEY_PREFIX`` cannot be a lock namespace (braces,
            control characters, over 256 bytes); the message names it.
    """
    prefix = str(cache.key_prefix)
    try:
        return check_namespace(prefix)
    except ValueError as exc:
        raise ImproperlyConfigured(
            f"the cache's KEY_PREFIX cannot prefix FIFO lock keys ({exc}); change KEY_PREFIX "
            "in the cache's CACHES entry"
        ) from exc


def override_name(option: str) -> str:
    """How a ``fifo_lock()`` call spells a lock option: ``fifo_lock(lease_ms=...)``."""
    return f"fifo_lock({option}=...)"


def cache_lock(
    cache: BaseCache,
    server: LockServer,
    name: str,
    timeout: float | None = None,
    version: int | None = None,
    options: Mapping[str, object] | None = None,
    name_template: str | None = None,
) -> CacheFifoLock:
    """Build the ``CacheFifoLock`` that a backend's ``fifo_lock()`` returns.

    The lock name given to the core is ``lock_key(cache, name, version)``, its
    namespace ``namespace_of(cache)``, its connections ``server.clients()``.
    Each lock option of ``options`` left out or None takes its ``FIFOLOCK``
    value, read now (see ``redis_fifo_lock.LockSettings.merged``).
    ``name_template`` labels its metrics (see ``fifo_lock``). Nothing touches
    Redis here.

    Raises:
        ValueError: for a bad ``name``, ``timeout`` or lock option (the message
            names it), or ``replicas`` above 0 when ``server`` is a Redis Cluster.
        ImproperlyConfigured: when ``FIFOLOCK`` is invalid (or its ``REPLICAS``
            is above 0 and ``server`` is a Redis Cluster), the cache's
            key function turns a valid ``name`` into an invalid lock name, or
            its ``KEY_PREFIX`` cannot be a namespace.
        TypeError: an option that is not a lock option.
    """
    key = lock_key(cache, name, version)
    namespace = namespace_of(cache)
    options = options or {}
    configured = fifolock_settings().lock
    cluster = server.describe() if server.topology == "cluster" else None
    if options.get("replicas") is None:
        # The project's REPLICAS applies: a refusal is the setting's, not the call's.
        try:
            configured.merged(base_spell=setting_name, cluster=cluster)
        except ValueError as exc:
            raise ImproperlyConfigured(
                f"{exc}, or pass replicas=0 to this cache's fifo_lock() calls"
            ) from exc
    settings = configured.merged((options, override_name), base_spell=setting_name, cluster=cluster)
    return CacheFifoLock(server.clients(), key, timeout, settings, namespace, name_template)


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
        path = f"{type(cache).__module__}.{type(cache).__qualname__}"
        raise ImproperlyConfigured(
            f"cache {alias!r} ({path}) has no fifo_lock(); set CACHES[{alias!r}]['BACKEND'] "
            f"to {suggested_backend(path)} or {SETTING}['CACHE'] to a cache that uses one"
        )
    return cache


def lock_name(name: str, cache: str | None = None, *, version: int | None = None) -> str:
    """The name in Redis of the lock that ``caches[cache].fifo_lock(name)`` takes.

    Give it to code that uses the core directly, so that it takes the very
    same lock (``SyncFifoLock(url, lock_name("invoices"),
    namespace=lock_namespace())``). Celery tasks need neither: in a Django
    project ``@fifo_locked("invoices")`` already takes this lock (see
    ``fifolock_celery.under_django``).

    Args:
        name: the name given to ``fifo_lock()`` (str, no ``{``/``}``).
        cache: alias (str) in ``CACHES``; default ``FIFOLOCK['CACHE']``.
        version: cache key version (int); default the cache's ``VERSION``.

    Returns:
        the cache key of ``name`` (str), e.g. ``":1:invoices"`` with the default
        ``KEY_PREFIX`` and ``VERSION``.

    Raises:
        ValueError: for a bad ``name``.
        ImproperlyConfigured: as ``lock_cache`` and ``lock_key``.
    """
    backend = lock_cache(cache)
    if not isinstance(backend, BaseCache):
        raise ImproperlyConfigured(f"cache {cache!r} is not a Django cache backend")
    return lock_key(backend, name, version)


def lock_namespace(cache: str | None = None) -> str:
    """The namespace of the locks of ``caches[cache]``: its ``KEY_PREFIX``.

    Give it, with ``lock_name()``, to code that uses the core (``namespace=``),
    so that it takes the very same lock as ``cache.fifo_lock()``.

    Args:
        cache: alias (str) in ``CACHES``; default ``FIFOLOCK['CACHE']``.

    Returns:
        the cache's ``KEY_PREFIX`` (str), "" when it has none.

    Raises:
        ImproperlyConfigured: as ``lock_cache`` and ``namespace_of``.
    """
    backend = lock_cache(cache)
    if not isinstance(backend, BaseCache):
        raise ImproperlyConfigured(f"cache {cache!r} is not a Django cache backend")
    return namespace_of(backend)
