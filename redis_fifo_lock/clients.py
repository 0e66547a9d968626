"""One async Redis client per event loop and process: ``LoopClients``.

A ``redis.asyncio`` client's connections belong to the event loop that opened
them. A client cached in a global outlives its loop, and the next loop that
uses it fails with "RuntimeError: Event loop is closed" - which is exactly what
``async_to_sync`` (Django, Celery, management commands) produces, since it runs
each call on a new loop. ``LoopClients`` keeps one client (plain, Redis Cluster
or found through Sentinel) per running loop in the loop's ``LoopContext``,
builds a new one after ``fork()``, and closes each client when its loop closes.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import SSLConnection, parse_url
from redis.asyncio.sentinel import Sentinel

from .connection import check_options, check_url, masked_kwargs, masked_url, node_address
from .loops import close_client, contexts, loop_context
from .protocol import CALL_TIMEOUT_S, AsyncClient
from .waiting import check_pool_size

SSL_OPTIONS = frozenset(
    name for name in inspect.signature(SSLConnection.__init__).parameters if name.startswith("ssl_")
)
"""The ``ssl_*`` keyword arguments that ``redis.asyncio``'s ``SSLConnection`` takes
(they vary with the redis-py version; the sync client takes a few more)."""
CLUSTER_OPTIONS = frozenset(inspect.signature(RedisCluster.__init__).parameters) - {"self"}
"""The keyword arguments ``redis.asyncio``'s ``RedisCluster`` takes."""
SENTINEL_SCHEME = "sentinel://"
"""How ``LoopClients.sentinel()`` spells its service as a ``url`` (not one redis-py reads)."""


def wants_tls(url: str | None, kwargs: Mapping[str, Any], where: str = "LoopClients") -> bool:
    """Whether ``url`` and the connection ``kwargs`` ask for TLS: a ``rediss://``
    URL, ``ssl=True``, or any ``ssl_*`` option (an ``ssl_ca_certs`` is never
    ignored, so the password never goes out in clear by mistake).

    Args:
        url: the server's URL, or None.
        kwargs: the connection keyword arguments.
        where: what to name in error messages (str); default "LoopClients".

    Raises:
        TypeError: an ``ssl_*`` option ``redis.asyncio`` does not take (the
            message names it), or an ``ssl`` that is not a bool.
        ValueError: ``ssl=False`` together with ``rediss://`` or ``ssl_*``
            options, TLS options in the query of a URL that is not
            ``rediss://``, or TLS asked for on a unix socket.
    """
    if "ssl" in kwargs and not isinstance(kwargs["ssl"], bool):
        raise TypeError(
            f"{where}: ssl must be True or False, got {type(kwargs['ssl']).__name__}; "
            "pass ssl=True (or a rediss:// URL) for TLS"
        )
    scheme = urlsplit(url).scheme if url is not None else ""
    in_query = sorted(
        key for key, _ in parse_qsl(urlsplit(url).query if url else "") if key.startswith("ssl")
    )
    if in_query and scheme != "rediss":
        raise ValueError(
            f"{where}: TLS options in the query of a {scheme}:// URL ({', '.join(in_query)}) "
            "would not make the connection use TLS; use a rediss:// URL, or pass ssl=True "
            "and the ssl_* options as keyword arguments"
        )
    options = sorted(key for key in kwargs if key.startswith("ssl_"))
    unknown = [key for key in options if key not in SSL_OPTIONS]
    if unknown:
        raise TypeError(
            f"{where}: redis.asyncio's SSLConnection takes no {', '.join(unknown)} (only "
            f"{', '.join(sorted(SSL_OPTIONS))}); remove it from the lock's connection options"
        )
    asked = [f"{scheme}://"] if scheme == "rediss" else []
    asked += options
    if kwargs.get("ssl") is False and asked:
        raise ValueError(
            f"{where}: ssl=False contradicts {', '.join(asked)}; drop ssl=False to use TLS, "
            "or the others to connect without it"
        )
    tls = bool(asked) or kwargs.get("ssl") is True
    if tls and (scheme == "unix" or kwargs.get("unix_socket_path")):
        raise ValueError(
            f"{where}: TLS (ssl=True, rediss:// or ssl_* options) cannot be used on a unix "
            "socket; connect over TCP with a rediss:// URL, or drop the TLS options"
        )
    return tls


def lock_client_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` for a plain client (one server) that the lock builds for
    itself: on Python 3.11 and later, ``socket_timeout`` None and
    ``socket_connect_timeout`` ``protocol.CALL_TIMEOUT_S`` (5 s) unless
    ``kwargs`` set them.

    The lock bounds each of its calls itself there (``protocol.bounded``), so
    redis-py's own bound is redundant, and on Python 3.11 it costs a task and
    an event-loop iteration for every command written (redis-py 8's default
    ``socket_timeout`` is 5 s); see docs/performance.md. On Python 3.10 the
    lock does not bound its calls, so redis-py's defaults stay. A URL's query
    (``?socket_timeout=2``) still wins, as ``from_url`` applies it last.
    Cluster and Sentinel clients keep redis-py's defaults: their discovery
    moves on from a node or sentinel that does not answer only when redis-py's
    own timeout ends the wait for it.
    """
    result = dict(kwargs)
    if sys.version_info >= (3, 11):
        result.setdefault("socket_timeout", None)
        result.setdefault("socket_connect_timeout", CALL_TIMEOUT_S)
    return result


def tls_kwargs(url: str | None, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` with TLS made explicit for ``Redis.from_url(url)`` (or ``Redis()``
    when ``url`` is None), ``RedisCluster`` and Sentinel master pools: ``ssl=True``
    when ``wants_tls``, and on a ``redis://`` URL (whose pool takes no ``ssl``)
    ``connection_class=SSLConnection`` instead.

    Raises:
        TypeError, ValueError: as ``wants_tls``.
    """
    result = dict(kwargs)
    if not wants_tls(url, kwargs):
        return result
    result["ssl"] = True
    if url is not None and urlsplit(url).scheme in ("redis", "rediss"):
        del result["ssl"]
        result.setdefault("connection_class", SSLConnection)
    return result


class LoopClients:
    """Builds and caches one async Redis client per running event loop.

    Args:
        url: a ``redis://``, ``rediss://`` or ``unix://`` URL; None to build the
            client from ``connection_kwargs`` alone.
        factory: instead of ``url``, a callable returning a new client
            (``redis.asyncio.Redis`` or ``RedisCluster``); it is called once per
            loop and process, on that loop. ``cluster()`` and ``sentinel()``
            build the usual factories.
        **connection_kwargs: passed to ``Redis.from_url`` (or ``Redis``), e.g.
            ``password``, ``db``, ``ssl``, ``socket_timeout``, ``max_connections``.
            TLS is used with a ``rediss://`` URL, ``ssl=True`` or any ``ssl_*``
            option (``ssl_ca_certs``, ``ssl_cert_reqs``...), also on a
            ``redis://`` URL. On Python 3.11 and later ``socket_timeout``
            defaults to None and ``socket_connect_timeout`` to 5 s: the lock
            bounds each of its calls itself (see ``lock_client_kwargs``), but a
            command of your own sent on ``client()`` is then unbounded unless
            you pass a ``socket_timeout``.

    Raises:
        TypeError: ``factory`` given together with ``url`` or connection kwargs,
            none of the three given, ``url`` not a str, ``factory`` not
            callable, an ``ssl_*`` option ``redis.asyncio`` does not take, or a
            connection option (keyword or URL query parameter) no redis-py
            connection takes (see ``redis_fifo_lock.connection.check_options``).
        ValueError: ``url`` is not a ``redis://``, ``rediss://`` or ``unix://``
            URL redis-py can parse (see ``redis_fifo_lock.connection.check_url``),
            ``ssl=False`` with other TLS options, TLS on a unix socket, an
            option value redis-py refuses (``protocol`` other than 2 or 3, an
            unknown ``ssl_cert_reqs``), or ``max_connections`` below the 5 a
            lock may use on one loop (``waiting.check_pool_size``).

    ``client()`` must be called on a running loop. The clients are kept in
    each loop's ``LoopContext`` (``redis_fifo_lock.loops``), per loop and
    process: a forked child never uses its parent's connections. Each client
    is closed when its loop closes, and with it the Sentinel connections it
    was discovered through.

    Each ``LoopClients`` has clients of its own, and a loop that never closes
    (the portal's, an ASGI server's) keeps them open: make one per server and
    share it, not one per lock. ``LockServer.server(url, **kwargs).clients()``
    returns the process's shared one for a configuration, as ``SyncFifoLock``
    does for a URL.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        factory: Callable[[], AsyncClient] | None = None,
        **connection_kwargs: Any,
    ) -> None:
        if factory is not None and (url is not None or connection_kwargs):
            raise TypeError("LoopClients: pass either factory or a URL / connection kwargs")
        if factory is not None and not callable(factory):
            raise TypeError(
                f"LoopClients: factory must be callable, got {type(factory).__name__}; "
                "pass a URL as the first argument"
            )
        if factory is None and url is None and not connection_kwargs:
            raise TypeError(
                "LoopClients() needs a Redis URL (e.g. 'redis://localhost:6379/0'), "
                "connection kwargs (host=..., port=...) or a factory"
            )
        self.url = None if url is None else check_url(url, "url")
        self.connection_kwargs = connection_kwargs
        self._build_kwargs = (
            tls_kwargs(url, lock_client_kwargs(connection_kwargs)) if factory is None else {}
        )
        self.is_cluster = False
        """True when built by ``cluster()``: the clients are ``RedisCluster``."""
        self._factory = factory or self._plain
        self._options_known = factory is None
        if factory is None:
            check_options(self._plain, url, connection_kwargs, "LoopClients")
            check_pool_size("LoopClients", self._plain())

    @classmethod
    def cluster(
        cls,
        url: str | None = None,
        *,
        nodes: Sequence[tuple[str, int]] = (),
        **connection_kwargs: Any,
    ) -> LoopClients:
        """Clients for Redis Cluster: one ``redis.asyncio.cluster.RedisCluster``
        per loop, discovering the cluster from ``url`` (``redis://host:port`` of
        any node) and/or ``nodes`` (``(host, port)`` pairs).

        Args:
            url: a node's URL (str), or None.
            nodes: more startup nodes; default none.
            **connection_kwargs: other ``RedisCluster`` arguments (``password``,
                ``ssl``, ``socket_timeout``...); ``ssl_*`` options imply ``ssl=True``.

        Raises:
            TypeError: neither ``url`` nor ``nodes`` given, ``url`` not a str, an
                option ``RedisCluster`` does not take (``db`` among them) or an
                ``ssl_*`` option ``redis.asyncio`` does not take.
            ValueError: ``url`` is not a ``redis://`` or ``rediss://`` URL with a
                host and database 0 (see ``connection.node_address``), or
                ``ssl=False`` with other TLS options.
        """
        addresses = [(str(host), int(port)) for host, port in nodes]
        if url is None and not addresses:
            raise TypeError("LoopClients.cluster() needs a node URL or nodes")
        if url is not None:
            node_address(url, "url")
        unknown = sorted(set(connection_kwargs) - CLUSTER_OPTIONS)
        if unknown or connection_kwargs.get("db"):
            raise TypeError(
                "LoopClients.cluster(): Redis Cluster clients take no "
                f"{', '.join(unknown or ['db'])}; remove it from the lock's connection options"
            )
        tls = wants_tls(url, connection_kwargs, "LoopClients.cluster()")

        def build() -> AsyncClient:
            kwargs = dict(connection_kwargs, ssl=True) if tls else dict(connection_kwargs)
            if addresses:
                kwargs["startup_nodes"] = [ClusterNode(host, port) for host, port in addresses]
            if url is not None:
                return RedisCluster.from_url(url, **kwargs)
            return RedisCluster(**kwargs)

        clients = cls(factory=build)
        clients.url = url
        clients.connection_kwargs = connection_kwargs
        clients.is_cluster = True
        clients._options_known = True
        return clients

    @classmethod
    def sentinel(
        cls,
        sentinels: Sequence[tuple[str, int]],
        service_name: str,
        *,
        sentinel_kwargs: dict[str, Any] | None = None,
        **connection_kwargs: Any,
    ) -> LoopClients:
        """Clients for the master of ``service_name``, found through Sentinel.

        Args:
            sentinels: the sentinels' ``(host, port)`` addresses.
            service_name: the master's name in the sentinels' configuration.
            sentinel_kwargs: connection options for the sentinels themselves
                (e.g. their ``password``, ``ssl``); default None (none).
            **connection_kwargs: connection options for the master (``password``,
                ``db``, ``ssl``, ``socket_timeout``...).

        In both, ``ssl_*`` options imply ``ssl=True`` (TLS).

        Raises:
            TypeError: an ``ssl_*`` option ``redis.asyncio`` does not take.
            ValueError: ``ssl=False`` with ``ssl_*`` options.

        Each loop gets its own ``redis.asyncio.sentinel.Sentinel`` and master
        client. After a failover the client reconnects to the new master; see
        docs/sentinel-cluster.md for what that means for held leases.
        """
        addresses = [(str(host), int(port)) for host, port in sentinels]
        master_kwargs = dict(connection_kwargs)
        if wants_tls(None, master_kwargs, "LoopClients.sentinel() (master)"):
            master_kwargs["ssl"] = True
        own_kwargs = None if sentinel_kwargs is None else dict(sentinel_kwargs)
        if own_kwargs is not None and wants_tls(None, own_kwargs, "sentinel_kwargs"):
            own_kwargs["ssl"] = True

        def build() -> AsyncClient:
            manager = Sentinel(  # type: ignore[no-untyped-call]
                addresses, sentinel_kwargs=own_kwargs, **master_kwargs
            )
            master: Redis = manager.master_for(service_name)
            return master

        clients = cls(factory=build)
        clients.url = f"{SENTINEL_SCHEME}{service_name}"
        clients.connection_kwargs = connection_kwargs
        clients._options_known = True
        return clients

    def __repr__(self) -> str:
        where = masked_url(self.url) if self.url else masked_kwargs(self.connection_kwargs)
        return f"<LoopClients {where!r} loops={len(self)}>"

    def __len__(self) -> int:
        """How many loops of this process have a live client (for tests)."""
        return sum(1 for context in contexts().values() if self in context.clients)

    def options(self) -> Mapping[str, Any] | None:
        """The options the clients are built with, the URL's query included
        (as redis-py's ``from_url`` reads them); None with a ``factory``,
        whose clients' options are not known before one is made."""
        if not self._options_known:
            return None
        options = dict(self.connection_kwargs)
        if self.url is not None and not self.url.startswith(SENTINEL_SCHEME):
            options.update(parse_url(self.url))
        return options

    def client(self) -> AsyncClient:
        """The client for the running event loop, created on first use.

        Raises:
            RuntimeError: when called with no running event loop.
        """
        clients = loop_context().clients
        client = clients.get(self)
        if client is None:
            client = clients[self] = self._factory()
        return client

    def _plain(self) -> Redis:
        if self.url is not None:
            return Redis.from_url(self.url, **self._build_kwargs)
        return Redis(**self._build_kwargs)

    async def aclose(self) -> None:
        """Close the running loop's client now (it is rebuilt on next use)."""
        client = loop_context().clients.pop(self, None)
        if client is not None:
            await close_client(client)
