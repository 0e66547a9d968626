"""A django-redis cache backend with a FIFO lock: ``fifolock_django.cache.RedisCache``.

Use it in place of ``django_redis.cache.RedisCache``; every cache method works
as before, and ``cache.fifo_lock(name, timeout)`` is added::

    CACHES = {
        "default": {
            "BACKEND": "fifolock_django.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:6379/1",
            "OPTIONS": {"PASSWORD": "..."},
        }
    }

The lock connects to the first server of ``LOCATION`` (the primary, where
django-redis writes) with the cache's ``USERNAME``, ``PASSWORD``,
``SOCKET_TIMEOUT``, ``SOCKET_CONNECT_TIMEOUT`` and ``CONNECTION_POOL_KWARGS``
(less the sync-only ones in ``SYNC_ONLY_POOL_KWARGS``), over its own
``redis.asyncio`` clients (one per event loop, shared by every backend instance
in the process). ``close()`` -
which Django calls after every request - leaves those clients alone.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.functional import cached_property
from django_redis.cache import RedisCache as DjangoRedisCache  # type: ignore[import-untyped]

from redis_fifo_lock import LoopClients

from .lock import CacheFifoLock, cache_lock, shared_clients

SYNC_ONLY_POOL_KWARGS = frozenset(
    {"connection_class", "parser_class", "retry", "redis_connect_func"}
)
"""``CONNECTION_POOL_KWARGS`` that only fit redis-py's sync client; the lock's
asyncio clients ignore them."""


def connection_settings(
    location: str | list[str], options: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """Translate a django-redis ``LOCATION`` and ``OPTIONS`` into (url, kwargs)
    for ``redis.asyncio.Redis.from_url``.

    Args:
        location: the cache's ``LOCATION``: a URL, several comma-separated, or a
            list of URLs; the first is used.
        options: the cache's ``OPTIONS`` dict.

    Raises:
        ImproperlyConfigured: for an empty ``LOCATION`` or a Sentinel setup
            (``SENTINELS``), which the lock does not support yet.
    """
    servers = location.split(",") if isinstance(location, str) else list(location)
    url = servers[0].strip() if servers else ""
    if not url:
        raise ImproperlyConfigured("a cache with fifo_lock() needs a Redis URL in LOCATION")
    if options.get("SENTINELS"):
        raise ImproperlyConfigured(
            "fifo_lock() does not support django-redis Sentinel caches (OPTIONS['SENTINELS']); "
            "give the locks a cache whose LOCATION is the primary's redis:// URL"
        )
    kwargs: dict[str, Any] = {
        key: value
        for key, value in options.get("CONNECTION_POOL_KWARGS", {}).items()
        if key not in SYNC_ONLY_POOL_KWARGS
    }
    for option, kwarg in (
        ("USERNAME", "username"),
        ("PASSWORD", "password"),
        ("SOCKET_TIMEOUT", "socket_timeout"),
        ("SOCKET_CONNECT_TIMEOUT", "socket_connect_timeout"),
    ):
        if options.get(option):
            kwargs[kwarg] = options[option]
    return url, kwargs


class RedisCache(DjangoRedisCache):  # type: ignore[misc]  # django-redis is untyped
    """django-redis's ``RedisCache`` plus ``fifo_lock()``.

    Args:
        server: the cache's ``LOCATION`` (str or list of str).
        params: the rest of its ``CACHES`` entry (``OPTIONS``, ``KEY_PREFIX``...).
    """

    @cached_property
    def fifo_lock_clients(self) -> LoopClients:
        """The process-wide connection source of this cache's locks (``LoopClients``).

        Raises:
            ImproperlyConfigured: see ``connection_settings``.
        """
        url, kwargs = connection_settings(self._server, self._params.get("OPTIONS", {}))
        return shared_clients(url, **kwargs)

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
        """A FIFO lock named by the cache key of ``name``, for ``with`` or ``async with``.

        Args:
            name: what the lock guards (str, no ``{``/``}``). The Redis lock name
                is ``self.make_key(name, version)``, so locks of caches with
                different ``KEY_PREFIX`` or ``VERSION`` never collide; keys look
                like ``fifolock:{<prefix>:<version>:<name>}:queue``.
            timeout: seconds (float) to wait when entering; None (default)
                waits forever, 0 tries once.
            version: cache key version (int); default the cache's ``VERSION``.
            lease_ms, poll_ms, max_hold_ms: int milliseconds overriding
                ``FIFOLOCK['LEASE_MS']``, ``['POLL_MS']``, ``['MAX_HOLD_MS']``.

        Returns:
            a ``CacheFifoLock``; entering it yields the ``Lease``. See there for
            what entering and leaving raise (``LockTimeout``, ``LeaseLost``,
            ``RedisUnavailable`` - never swallowed, even with
            ``IGNORE_EXCEPTIONS``).

        Raises:
            ValueError: for a bad ``name``, ``timeout`` or timing argument.
            ImproperlyConfigured: for an invalid ``FIFOLOCK``, a ``KEY_PREFIX``
                that makes an invalid lock name, or an unsupported ``LOCATION``.
        """
        return cache_lock(
            self,
            self.fifo_lock_clients,
            name,
            timeout,
            version=version,
            lease_ms=lease_ms,
            poll_ms=poll_ms,
            max_hold_ms=max_hold_ms,
        )
