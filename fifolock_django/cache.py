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
in the process). TLS comes with a ``rediss://`` URL and the ``ssl_*`` pool
kwargs. ``close()`` - which Django calls after every request - leaves those
clients alone. Sentinel set-ups are refused with ``ImproperlyConfigured`` (see
``connection_settings``).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django_redis.cache import RedisCache as DjangoRedisCache  # type: ignore[import-untyped]

from .lock import FifoLockMixin

SYNC_ONLY_POOL_KWARGS = frozenset(
    {"connection_class", "parser_class", "retry", "redis_connect_func"}
)
"""``CONNECTION_POOL_KWARGS`` that only fit redis-py's sync client; the lock's
asyncio clients ignore them."""

SENTINEL_OPTIONS = ("SENTINELS", "CLIENT_CLASS", "CONNECTION_FACTORY", "CONNECTION_POOL_CLASS")
"""``OPTIONS`` keys that can make a django-redis cache talk to Sentinel."""


def _sentinel_option(options: dict[str, Any]) -> str | None:
    """The first ``OPTIONS`` key that sets up Sentinel, or None."""
    for option in SENTINEL_OPTIONS:
        value = options.get(option)
        if option == "SENTINELS" and value:
            return option
        if isinstance(value, str) and "sentinel" in value.lower():
            return option
        if isinstance(value, type) and "sentinel" in value.__name__.lower():
            return option
    return None


def connection_settings(
    location: str | list[str], options: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """Translate a django-redis ``LOCATION`` and ``OPTIONS`` into (url, kwargs)
    for ``redis.asyncio.Redis.from_url``.

    Args:
        location: the cache's ``LOCATION``: a URL, several comma-separated, or a
            list of URLs; the first is used (django-redis writes there).
        options: the cache's ``OPTIONS`` dict.

    Returns:
        the URL (str) and the connection kwargs (dict): ``username``,
        ``password``, ``socket_timeout``, ``socket_connect_timeout`` (seconds)
        and the ``CONNECTION_POOL_KWARGS`` an asyncio pool accepts. A password
        in the URL wins over ``PASSWORD``, as in django-redis.

    Raises:
        ImproperlyConfigured: for an empty ``LOCATION``, or a Sentinel set-up
            (``SENTINELS``, a Sentinel ``CLIENT_CLASS``, ``CONNECTION_FACTORY``
            or ``CONNECTION_POOL_CLASS``), which the lock does not support: its
            per-event-loop clients cannot follow a failover yet.
    """
    servers = location.split(",") if isinstance(location, str) else list(location)
    url = servers[0].strip() if servers else ""
    if not url:
        raise ImproperlyConfigured("a cache with fifo_lock() needs a Redis URL in LOCATION")
    sentinel = _sentinel_option(options)
    if sentinel is not None:
        raise ImproperlyConfigured(
            f"fifo_lock() does not support django-redis Sentinel caches (OPTIONS[{sentinel!r}] "
            "sets up Sentinel); give the locks a cache of their own whose LOCATION is the "
            "primary's redis:// or rediss:// URL"
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


class RedisCache(FifoLockMixin, DjangoRedisCache):  # type: ignore[misc]  # django-redis is untyped
    """django-redis's ``RedisCache`` plus ``fifo_lock()`` (see ``FifoLockMixin``).

    Args:
        server: the cache's ``LOCATION`` (str or list of str).
        params: the rest of its ``CACHES`` entry (``OPTIONS``, ``KEY_PREFIX``...).

    ``IGNORE_EXCEPTIONS`` (and ``DJANGO_REDIS_IGNORE_EXCEPTIONS``) apply to the
    cache methods only; the lock always raises.
    """

    def fifo_lock_connection(self) -> tuple[str, dict[str, Any]]:
        """(url, kwargs) of the lock's connections, from ``LOCATION`` and ``OPTIONS``.

        Raises:
            ImproperlyConfigured: see ``connection_settings``.
        """
        return connection_settings(self._server, self._params.get("OPTIONS", {}))
