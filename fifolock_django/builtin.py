"""Django's built-in Redis cache backend with a FIFO lock: ``fifolock_django.builtin.RedisCache``.

Use it in place of ``django.core.cache.backends.redis.RedisCache``; every cache
method works as before, and ``cache.fifo_lock(name, timeout)`` is added::

    CACHES = {
        "default": {
            "BACKEND": "fifolock_django.builtin.RedisCache",
            "LOCATION": ["rediss://primary:6380/2", "rediss://replica:6380/2"],
            "OPTIONS": {"password": "...", "ssl_cert_reqs": "required"},
        }
    }

Django's backend passes ``OPTIONS`` (less ``serializer``, ``pool_class`` and
``parser_class``) to redis-py's connection pool as keyword arguments, and
writes to the first server of ``LOCATION``; the lock does the same with its
``redis.asyncio`` clients (one per event loop, shared by every backend instance
in the process), minus the options that only fit the sync client
(``SYNC_ONLY_OPTIONS``). This module does not need django-redis.
"""

from __future__ import annotations

import re
from typing import Any

from django.core.cache.backends.redis import RedisCache as BuiltinRedisCache
from django.core.exceptions import ImproperlyConfigured

from .lock import FifoLockMixin

SYNC_ONLY_OPTIONS = frozenset(
    {
        "serializer",
        "pool_class",
        "parser_class",
        "connection_class",
        "retry",
        "redis_connect_func",
    }
)
"""``OPTIONS`` of Django's Redis backend that the lock's asyncio clients do not
take: Django's own (``serializer``, ``pool_class``, ``parser_class``) and
sync-only redis-py pool kwargs."""


def _class_name(value: object) -> str:
    if isinstance(value, str):
        return value
    return getattr(value, "__qualname__", type(value).__qualname__)


def connection_settings(
    location: str | list[str], options: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """Translate a built-in Redis cache's ``LOCATION`` and ``OPTIONS`` into
    (url, kwargs) for ``redis.asyncio.Redis.from_url``.

    Args:
        location: the cache's ``LOCATION``: a URL, several separated by ``,``
            or ``;``, or a list of URLs; the first is used (Django writes there).
        options: the cache's ``OPTIONS`` dict: redis-py pool kwargs such as
            ``db``, ``username``, ``password``, ``socket_timeout`` (seconds),
            ``max_connections``, ``ssl_cert_reqs``.

    Returns:
        the URL (str) and the connection kwargs (dict): ``options`` less
        ``SYNC_ONLY_OPTIONS``. As with Django, a db or password in the URL wins.

    Raises:
        ImproperlyConfigured: for an empty ``LOCATION``, or a Sentinel
            ``pool_class``, which the lock does not support.
    """
    servers = re.split("[;,]", location) if isinstance(location, str) else list(location)
    url = servers[0].strip() if servers else ""
    if not url:
        raise ImproperlyConfigured("a cache with fifo_lock() needs a Redis URL in LOCATION")
    pool_class = options.get("pool_class")
    if pool_class is not None and "sentinel" in _class_name(pool_class).lower():
        raise ImproperlyConfigured(
            f"fifo_lock() does not support a Sentinel pool_class ({_class_name(pool_class)}); "
            "give the locks a cache of their own whose LOCATION is the primary's redis:// "
            "or rediss:// URL"
        )
    kwargs = {key: value for key, value in options.items() if key not in SYNC_ONLY_OPTIONS}
    return url, kwargs


class RedisCache(FifoLockMixin, BuiltinRedisCache):
    """Django's built-in ``RedisCache`` plus ``fifo_lock()`` (see ``FifoLockMixin``).

    Args:
        server: the cache's ``LOCATION`` (str or list of str).
        params: the rest of its ``CACHES`` entry (``OPTIONS``, ``KEY_PREFIX``...).
    """

    def __init__(self, server: str | list[str], params: dict[str, Any]) -> None:
        super().__init__(server, params)
        # Settings only (Django's own attributes for them are private and untyped).
        self.fifo_lock_location = server
        self.fifo_lock_options: dict[str, Any] = params.get("OPTIONS", {})

    def fifo_lock_connection(self) -> tuple[str, dict[str, Any]]:
        """(url, kwargs) of the lock's connections, from ``LOCATION`` and ``OPTIONS``.

        Raises:
            ImproperlyConfigured: see ``connection_settings``.
        """
        return connection_settings(self.fifo_lock_location, self.fifo_lock_options)
