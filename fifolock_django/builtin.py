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
(``SYNC_ONLY_OPTIONS``). A ``connection_class`` that speaks TLS (a subclass of
redis-py's ``SSLConnection``) makes the lock use TLS too. This module does not need django-redis.

Django's backend speaks to one server (or a primary and its replicas) only: it
has no Sentinel or Redis Cluster support, and neither has the lock on it. For
those, use ``fifolock_django.cache.RedisCache`` (django-redis) in its Sentinel
form or with ``"FIFOLOCK_CLUSTER": True``; ``connection_settings`` refuses a
Sentinel ``pool_class`` and a ``FIFOLOCK_CLUSTER`` option with a message saying so.
"""

from __future__ import annotations

import re
from typing import Any

from django.core.cache.backends.redis import RedisCache as BuiltinRedisCache
from django.core.exceptions import ImproperlyConfigured

from redis_fifo_lock import LockServer

from .connection import check_location, configured_server, lock_kwargs
from .lock import FifoLockMixin, cache_alias, options_setting

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
    location: str | list[str], options: dict[str, Any], setting: str = "OPTIONS"
) -> LockServer:
    """Translate a built-in Redis cache's ``LOCATION`` and ``OPTIONS`` into the
    ``LockServer`` of one server.

    Args:
        location: the cache's ``LOCATION``: a URL, several separated by ``,``
            or ``;``, or a list of URLs; the first is used (Django writes there).
        options: the cache's ``OPTIONS`` dict: redis-py pool kwargs such as
            ``db``, ``username``, ``password``, ``socket_timeout`` (seconds),
            ``max_connections``, ``ssl_cert_reqs``.
        setting: how messages spell ``options`` (str, default ``"OPTIONS"``;
            the backend gives ``"CACHES['<alias>']['OPTIONS']"``).

    Returns:
        the first URL's server, with ``options`` less ``SYNC_ONLY_OPTIONS`` as
        connection kwargs. As with Django, a db or password in the URL wins.
        TLS as the cache: a ``rediss://`` URL, ``ssl_*`` options or a
        ``connection_class`` that is an ``SSLConnection``.

    Raises:
        ImproperlyConfigured: for options the core's ``LockServer`` refuses
            (TLS options it cannot follow...), a ``socket_timeout`` or
            ``socket_connect_timeout`` that is no number of seconds above 0
            (naming it: see ``connection.check_seconds``), an empty ``LOCATION``, a Sentinel
            ``pool_class`` or a ``FIFOLOCK_CLUSTER`` option: Django's backend
            supports neither Sentinel nor Redis Cluster (the message names
            the django-redis backend, which does).
    """
    servers = re.split("[;,]", location) if isinstance(location, str) else list(location)
    url = servers[0].strip() if servers else ""
    if not url:
        raise ImproperlyConfigured("a cache with fifo_lock() needs a Redis URL in LOCATION")
    pool_class = options.get("pool_class")
    if pool_class is not None and "sentinel" in _class_name(pool_class).lower():
        raise ImproperlyConfigured(
            f"Django's built-in Redis backend does not support Sentinel (OPTIONS['pool_class'] "
            f"is {_class_name(pool_class)}); use BACKEND 'fifolock_django.cache.RedisCache' "
            "(django-redis) with its SentinelClient, SENTINELS and SentinelConnectionFactory "
            "options"
        )
    if "FIFOLOCK_CLUSTER" in options:
        raise ImproperlyConfigured(
            "Django's built-in Redis backend does not support Redis Cluster, and passes "
            "OPTIONS['FIFOLOCK_CLUSTER'] on to redis-py; use BACKEND "
            "'fifolock_django.cache.RedisCache' (django-redis) with OPTIONS "
            "{'FIFOLOCK_CLUSTER': True}"
        )
    kwargs = lock_kwargs(options, setting, SYNC_ONLY_OPTIONS)
    return configured_server(LockServer.server, url, **kwargs)


class RedisCache(FifoLockMixin, BuiltinRedisCache):
    """Django's built-in ``RedisCache`` plus ``fifo_lock()`` (see ``FifoLockMixin``).

    Args:
        server: the cache's ``LOCATION`` (str or list of str).
        params: the rest of its ``CACHES`` entry (``OPTIONS``, ``KEY_PREFIX``...).

    Raises:
        ImproperlyConfigured: ``LOCATION`` is not a ``redis://``, ``rediss://``
            or ``unix://`` URL (or a list of them); see ``check_location``.
    """

    def __init__(self, server: str | list[str], params: dict[str, Any]) -> None:
        check_location(server)
        super().__init__(server, params)
        # Settings only (Django's own attributes for them are private and untyped).
        self.fifo_lock_location = server
        self.fifo_lock_options: dict[str, Any] = params.get("OPTIONS", {})
        self.fifo_lock_setting = options_setting(cache_alias(server, params))

    def fifo_lock_connection(self) -> LockServer:
        """Where the locks connect (one server), from ``LOCATION`` and ``OPTIONS``.

        Raises:
            ImproperlyConfigured: see ``connection_settings``.
        """
        return connection_settings(
            self.fifo_lock_location, self.fifo_lock_options, self.fifo_lock_setting
        )
