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
in the process). TLS comes as for the cache: a ``rediss://`` URL, the ``ssl_*``
pool kwargs, or a ``connection_class`` that is redis-py's ``SSLConnection``.
``close()`` - which Django calls after every request - leaves those clients alone.

Sentinel: a cache in django-redis's Sentinel form locks on the master of its
service, found through the same sentinels::

    "LOCATION": "redis://mymaster/0",         # the service name, and the db
    "OPTIONS": {
        "CLIENT_CLASS": "django_redis.client.SentinelClient",
        "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
        "SENTINELS": [("sentinel-1", 26379), ("sentinel-2", 26379)],
        "SENTINEL_KWARGS": {"password": "..."},   # optional: the sentinels' own
    }

(``DJANGO_REDIS_CONNECTION_FACTORY`` may name the factory instead.)

Redis Cluster: django-redis has no cluster client, so say it with
``"FIFOLOCK_CLUSTER": True`` in ``OPTIONS`` (implied when ``REDIS_CLIENT_CLASS``
is redis-py's ``RedisCluster``); every ``LOCATION`` URL is then a node to
discover the cluster from. See ``connection_settings``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string
from django_redis.cache import RedisCache as DjangoRedisCache  # type: ignore[import-untyped]
from django_redis.pool import SentinelConnectionFactory  # type: ignore[import-untyped]
from redis.asyncio.connection import SSLConnection, parse_url
from redis.cluster import RedisCluster

from redis_fifo_lock import LockServer
from redis_fifo_lock.connection import masked_url

from .connection import (
    check_location,
    check_seconds,
    check_timeouts,
    configured_server,
    lock_kwargs,
)
from .lock import FifoLockMixin, cache_alias, options_setting

SYNC_ONLY_POOL_KWARGS = frozenset(
    {"connection_class", "parser_class", "retry", "redis_connect_func"}
)
"""``CONNECTION_POOL_KWARGS`` that only fit redis-py's sync client; the lock's
asyncio clients ignore them (a TLS ``connection_class`` still makes the lock use TLS)."""

CLUSTER_OPTION = "FIFOLOCK_CLUSTER"
"""``OPTIONS`` key (bool): the cache's server is a Redis Cluster. Default: whether
``REDIS_CLIENT_CLASS`` is (a subclass of) ``redis.cluster.RedisCluster``."""

SENTINEL_FACTORY = "django_redis.pool.SentinelConnectionFactory"
"""The django-redis connection factory that makes a cache use Sentinel."""

DEFAULT_FACTORY = "django_redis.pool.ConnectionFactory"
"""django-redis's connection factory when neither ``OPTIONS['CONNECTION_FACTORY']``
nor ``DJANGO_REDIS_CONNECTION_FACTORY`` names one."""

_SENTINEL_HINTS = ("SENTINELS", "CLIENT_CLASS", "CONNECTION_POOL_CLASS")


def _imported(option: str, value: object) -> object:
    """``value`` imported if it is a dotted path (as django-redis does).

    Raises:
        ImproperlyConfigured: the path cannot be imported; names ``option``.
    """
    if not isinstance(value, str):
        return value
    try:
        return import_string(value)
    except ImportError as exc:
        raise ImproperlyConfigured(f"{option} {value!r} cannot be imported: {exc}") from exc


def _is_subclass(value: object, base: type) -> bool:
    return isinstance(value, type) and issubclass(value, base)


def _uses_sentinel(options: dict[str, Any]) -> bool:
    """Whether django-redis reaches this cache through Sentinel: its connection
    factory is (a subclass of) ``SentinelConnectionFactory``.

    Raises:
        ImproperlyConfigured: the factory cannot be imported, or ``OPTIONS``
            asks for Sentinel (``SENTINELS``, a Sentinel ``CLIENT_CLASS`` or
            ``CONNECTION_POOL_CLASS``) with another factory, a set-up that
            django-redis itself cannot use.
    """
    if options.get("CONNECTION_FACTORY"):
        where, path = "OPTIONS['CONNECTION_FACTORY']", options["CONNECTION_FACTORY"]
    else:
        where = "DJANGO_REDIS_CONNECTION_FACTORY"
        path = getattr(settings, where, DEFAULT_FACTORY)
    if _is_subclass(_imported(where, path), SentinelConnectionFactory):
        return True
    for option in _SENTINEL_HINTS:
        value = options.get(option)
        name = value if isinstance(value, str) else getattr(value, "__name__", "")
        if (option == "SENTINELS" and value) or "sentinel" in name.lower():
            raise ImproperlyConfigured(
                f"OPTIONS[{option!r}] asks for Sentinel, but the cache's connection factory "
                f"({where} = {path!r}) does not use it, so django-redis cannot connect; set "
                f"OPTIONS['CONNECTION_FACTORY'] (or DJANGO_REDIS_CONNECTION_FACTORY) to "
                f"{SENTINEL_FACTORY!r}"
            )
    return False


def _uses_cluster(options: dict[str, Any]) -> bool:
    """``OPTIONS['FIFOLOCK_CLUSTER']``, by default whether ``REDIS_CLIENT_CLASS``
    is a ``RedisCluster``.

    Raises:
        ImproperlyConfigured: ``FIFOLOCK_CLUSTER`` is not a bool, or
            ``REDIS_CLIENT_CLASS`` cannot be imported.
    """
    flag = options.get(CLUSTER_OPTION)
    if flag is None:
        client_class = options.get("REDIS_CLIENT_CLASS", "redis.client.Redis")
        return _is_subclass(_imported("OPTIONS['REDIS_CLIENT_CLASS']", client_class), RedisCluster)
    if not isinstance(flag, bool):
        raise ImproperlyConfigured(
            f"OPTIONS[{CLUSTER_OPTION!r}] must be True or False, got {flag!r}"
        )
    return flag


def _base_kwargs(options: dict[str, Any], setting: str = "OPTIONS") -> dict[str, Any]:
    """The connection kwargs that ``OPTIONS`` gives every topology, with
    ``ssl=True`` when the pool's ``connection_class`` speaks TLS. As in
    django-redis, a ``CONNECTION_POOL_KWARGS`` value wins over ``USERNAME``,
    ``PASSWORD`` and the socket timeouts of ``OPTIONS`` (which fill in for a
    value the pool's kwargs leave out or set to None), so the lock logs in
    as the cache does.

    ``setting`` (str) is how messages spell ``OPTIONS``.

    Raises:
        ImproperlyConfigured: a ``connection_class`` that is no class (see
            ``fifolock_django.connection.lock_kwargs``), or a ``SOCKET_TIMEOUT``,
            ``SOCKET_CONNECT_TIMEOUT`` or pool ``socket_timeout``/
            ``socket_connect_timeout`` that is no number of seconds above 0
            (see ``fifolock_django.connection.check_seconds``).
    """
    kwargs = lock_kwargs(
        options.get("CONNECTION_POOL_KWARGS", {}),
        f"{setting}['CONNECTION_POOL_KWARGS']",
        SYNC_ONLY_POOL_KWARGS,
    )
    for option, kwarg in (
        ("USERNAME", "username"),
        ("PASSWORD", "password"),
        ("SOCKET_TIMEOUT", "socket_timeout"),
        ("SOCKET_CONNECT_TIMEOUT", "socket_connect_timeout"),
    ):
        value = options.get(option)
        if kwarg.startswith("socket_") and value is not None:
            # django-redis takes 0 or False for no timeout; as everywhere
            # else, the lock wants None for that.
            check_seconds(f"{setting}[{option!r}]", value)
        if value and kwargs.get(kwarg) is None:  # django-redis ignores a false value
            kwargs[kwarg] = value
    return kwargs


def _url_kwargs(url: str) -> dict[str, Any]:
    """What a ``redis://`` or ``rediss://`` URL says besides its address: db,
    credentials, query options, and ``ssl=True`` for ``rediss``.

    Raises:
        ImproperlyConfigured: another scheme, or a query value redis-py refuses.
    """
    if urlsplit(url).scheme not in ("redis", "rediss"):
        raise ImproperlyConfigured(
            f"LOCATION {masked_url(url)!r} must be a redis:// or rediss:// URL here"
        )
    try:
        kwargs: dict[str, Any] = dict(parse_url(url))
    except ValueError as exc:
        raise ImproperlyConfigured(f"LOCATION {masked_url(url)!r}: {exc}") from exc
    kwargs.pop("host", None)
    kwargs.pop("port", None)
    if kwargs.pop("connection_class", None) is SSLConnection:
        kwargs["ssl"] = True
    return kwargs


def _sentinel_connection(
    url: str, options: dict[str, Any], kwargs: dict[str, Any], setting: str = "OPTIONS"
) -> LockServer:
    """The master of the service named by ``url``'s host, as django-redis's
    ``SentinelConnectionFactory`` finds it (the URL's own values win).
    ``setting`` (str) is how messages spell ``OPTIONS``."""
    sentinels: Any = options.get("SENTINELS")
    pairs = (
        isinstance(sentinels, (list, tuple))
        and bool(sentinels)
        and all(isinstance(pair, (list, tuple)) and len(pair) == 2 for pair in sentinels)
    )
    if not pairs:
        raise ImproperlyConfigured(
            f"OPTIONS['SENTINELS'] must list the sentinels as (host, port) pairs, got {sentinels!r}"
        )
    sentinel_kwargs = options.get("SENTINEL_KWARGS")
    if isinstance(sentinel_kwargs, dict):
        check_timeouts(sentinel_kwargs, f"{setting}['SENTINEL_KWARGS']")
    service_name = urlsplit(url).hostname
    if not service_name:
        raise ImproperlyConfigured(
            f"LOCATION {masked_url(url)!r} must name the Sentinel service as its host "
            "(redis://<service name>/<db>)"
        )
    from_url = _url_kwargs(url)
    is_master = str(from_url.pop("is_master", "1")).lower()
    if is_master in ("0", "false", "no", "f", "n"):
        raise ImproperlyConfigured(
            f"LOCATION {masked_url(url)!r} asks for replicas (is_master={is_master}), but "
            "locks are taken on the master: put a master URL first"
        )
    return configured_server(
        LockServer.sentinel,
        sentinels,
        service_name,
        sentinel_kwargs=sentinel_kwargs,
        spell=lambda option: f"OPTIONS[{option.upper()!r}]",
        **{**kwargs, **from_url},
    )


def connection_settings(
    location: str | list[str], options: dict[str, Any], setting: str = "OPTIONS"
) -> LockServer:
    """Translate a django-redis ``LOCATION`` and ``OPTIONS`` into a ``LockServer``.

    Args:
        location: the cache's ``LOCATION``: a URL, several comma-separated, or a
            list of URLs.
        options: the cache's ``OPTIONS`` dict.
        setting: how messages spell ``options`` (str, default ``"OPTIONS"``;
            the backend gives ``"CACHES['<alias>']['OPTIONS']"``).

    Returns:
        - Sentinel (the connection factory, from ``OPTIONS['CONNECTION_FACTORY']``
          or ``DJANGO_REDIS_CONNECTION_FACTORY``, is ``SentinelConnectionFactory``):
          the master of the service named by the first URL's host, found
          through ``SENTINELS`` with ``SENTINEL_KWARGS``.
        - ``OPTIONS['FIFOLOCK_CLUSTER']`` true (default: ``REDIS_CLIENT_CLASS``
          is a ``RedisCluster``): the cluster, discovered from any URL.
        - Otherwise the first URL's server (django-redis writes there).

        The connection kwargs are ``USERNAME``, ``PASSWORD``, ``SOCKET_TIMEOUT``,
        ``SOCKET_CONNECT_TIMEOUT`` (seconds) and the ``CONNECTION_POOL_KWARGS``
        an asyncio client accepts; a URL's own values (db, password) win, as in
        django-redis.

    Raises:
        ImproperlyConfigured: naming the setting, for an empty ``LOCATION``; a
            socket timeout that is no number of seconds above 0 (see
            ``connection.check_seconds``); a Sentinel set-up without
            ``SENTINELS``, with a replica URL first, or asked for by ``OPTIONS``
            without the Sentinel factory (which django-redis cannot use either);
            Sentinel and cluster together; or anything the core's
            ``LockServer`` refuses (a cluster URL with a database other than 0,
            options a cluster client does not take, TLS options redis-py cannot
            follow...), which is the ``__cause__``.
    """
    servers = location.split(",") if isinstance(location, str) else list(location)
    urls = [server.strip() for server in servers if server.strip()]
    if not urls:
        raise ImproperlyConfigured("a cache with fifo_lock() needs a Redis URL in LOCATION")
    kwargs = _base_kwargs(options, setting)
    sentinel = _uses_sentinel(options)
    cluster = _uses_cluster(options)
    if sentinel and cluster:
        raise ImproperlyConfigured(
            f"a cache cannot use both Sentinel and Redis Cluster: drop OPTIONS[{CLUSTER_OPTION!r}] "
            "(or REDIS_CLIENT_CLASS) or the Sentinel connection factory"
        )
    if sentinel:
        return _sentinel_connection(urls[0], options, kwargs, setting)
    if cluster:
        return configured_server(LockServer.cluster, urls, **kwargs)
    return configured_server(LockServer.server, urls[0], **kwargs)


class RedisCache(FifoLockMixin, DjangoRedisCache):  # type: ignore[misc]  # django-redis is untyped
    """django-redis's ``RedisCache`` plus ``fifo_lock()`` (see ``FifoLockMixin``).

    Args:
        server: the cache's ``LOCATION`` (str or list of str).
        params: the rest of its ``CACHES`` entry (``OPTIONS``, ``KEY_PREFIX``...).

    Raises:
        ImproperlyConfigured: ``LOCATION`` is not a ``redis://``, ``rediss://``
            or ``unix://`` URL (or a list of them); see ``check_location``.

    ``IGNORE_EXCEPTIONS`` (and ``DJANGO_REDIS_IGNORE_EXCEPTIONS``) apply to the
    cache methods only; the lock always raises.
    """

    def __init__(self, server: str | list[str], params: dict[str, Any]) -> None:
        check_location(server)
        # mypy sees BaseCache's __init__(params) here: django-redis is untyped.
        super().__init__(server, params)  # type: ignore[call-arg, arg-type]
        self.fifo_lock_setting = options_setting(cache_alias(server, params))

    def fifo_lock_connection(self) -> LockServer:
        """Where the locks connect, from ``LOCATION`` and ``OPTIONS``.

        Raises:
            ImproperlyConfigured: see ``connection_settings``.
        """
        return connection_settings(
            self._server, self._params.get("OPTIONS", {}), self.fifo_lock_setting
        )
