"""Where a cache's FIFO locks connect (``LockConnection``), and the clients for it.

Each lock backend translates its own ``LOCATION`` and ``OPTIONS`` into a
``LockConnection`` (see ``fifolock_django.cache`` and ``fifolock_django.builtin``):
one Redis server, the master of a Sentinel service, or a Redis Cluster.
``shared_clients`` turns it into the ``LoopClients`` the locks use, one per
configuration for the whole process. Nothing here reads Django settings.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured
from redis.asyncio.connection import AbstractConnection as AsyncAbstractConnection
from redis.asyncio.connection import SSLConnection as AsyncSSLConnection
from redis.connection import AbstractConnection, SSLConnection

from redis_fifo_lock import LoopClients
from redis_fifo_lock.clients import wants_tls
from redis_fifo_lock.connection import check_url, masked_kwargs, masked_url

Topology = Literal["server", "sentinel", "cluster"]
"""How the lock server is reached: one server, a Sentinel master, a Redis Cluster."""

DEFAULT_PORT = 6379
"""Port of a cluster node whose URL names none."""


def shown_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, for messages (the core's
    ``masked_url``)."""
    return masked_url(url)


def check_location(location: object) -> None:
    """Check a cache's ``LOCATION`` when its backend is built: one URL, several
    separated by ``,`` or ``;``, or a list of URLs, each ``redis://``,
    ``rediss://`` or ``unix://`` (the core's ``check_url``).

    Raises:
        ImproperlyConfigured: naming ``LOCATION``, whose ``__cause__`` is the
            core's ``TypeError`` (not a str or list of str) or ``ValueError``
            (another scheme). The message never shows a password.
    """
    try:
        urls: Sequence[object] = (
            location
            if isinstance(location, (list, tuple))
            else re.split("[;,]", check_url(location, "LOCATION"))
        )
        for url in urls:
            if url != "":
                check_url(url.strip() if isinstance(url, str) else url, "LOCATION")
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(f"a cache with fifo_lock(): {exc}") from exc


def speaks_tls(setting: str, connection_class: object) -> bool:
    """Whether the redis-py ``connection_class`` a cache is configured with speaks
    TLS (a subclass of ``SSLConnection``, sync or asyncio), so the lock must too.

    Args:
        setting: where it was set, for the message (e.g. ``"OPTIONS"``).
        connection_class: the configured value.

    Raises:
        ImproperlyConfigured: naming ``setting``, for a value that is no redis-py
            connection class (such as a dotted path, which redis-py does not import).
    """
    if isinstance(connection_class, type):
        if issubclass(connection_class, (SSLConnection, AsyncSSLConnection)):
            return True
        if issubclass(connection_class, (AbstractConnection, AsyncAbstractConnection)):
            return False
    raise ImproperlyConfigured(
        f"{setting}['connection_class'] is {connection_class!r}, not a redis-py connection "
        "class, so the FIFO lock cannot tell whether it must use TLS; give the class itself "
        "(redis.connection.SSLConnection for TLS), or use a rediss:// LOCATION instead"
    )


def lock_kwargs(
    url: str | None, options: Mapping[str, Any], setting: str, sync_only: frozenset[str]
) -> dict[str, Any]:
    """The lock's ``redis.asyncio`` connection kwargs from a cache's pool kwargs.

    Args:
        url: the server's URL, or None (for the checks only).
        options: redis-py pool kwargs (``OPTIONS`` of Django's backend,
            ``CONNECTION_POOL_KWARGS`` of django-redis').
        setting: how the user spells ``options``, for messages.
        sync_only: keys to leave out (they only fit the sync client).

    Returns:
        ``options`` less ``sync_only``, with ``ssl=True`` when their
        ``connection_class`` speaks TLS: the lock then uses TLS too.

    Raises:
        ImproperlyConfigured: naming ``setting``, for a ``connection_class``
            that is not a class, an ``ssl_*`` option ``redis.asyncio`` does not
            take, or contradicting TLS options (see ``LoopClients``).
    """
    kwargs = {key: value for key, value in options.items() if key not in sync_only}
    if "connection_class" in options and speaks_tls(setting, options["connection_class"]):
        kwargs["ssl"] = True
    try:
        wants_tls(url, kwargs, setting)
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(str(exc)) from exc
    return kwargs


@dataclass(frozen=True)
class LockConnection:
    """Where a cache's locks connect. Build it with ``server``, ``sentinel`` or ``cluster``.

    Attributes:
        topology: "server", "sentinel" or "cluster" (``Topology``).
        urls: the server's URL ("server"), the nodes' URLs ("cluster", the
            first one carries the credentials), or empty ("sentinel").
        kwargs: ``redis.asyncio`` connection options of the server, the master
            or every node (``password``, ``db``, ``socket_timeout`` in
            seconds...); a URL's own values win over them.
        sentinels: (host, port) of each sentinel ("sentinel" only).
        service_name: the master's name in the sentinels' configuration
            ("sentinel" only).
        sentinel_kwargs: connection options for the sentinels themselves, or
            None ("sentinel" only; see ``LoopClients.sentinel``).
    """

    topology: Topology
    urls: tuple[str, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    sentinels: tuple[tuple[str, int], ...] = ()
    service_name: str = ""
    sentinel_kwargs: dict[str, Any] | None = None

    def __repr__(self) -> str:
        sentinel_kwargs = (
            None if self.sentinel_kwargs is None else masked_kwargs(self.sentinel_kwargs)
        )
        return (
            f"LockConnection({self.topology!r}, urls={[masked_url(url) for url in self.urls]!r}, "
            f"kwargs={masked_kwargs(self.kwargs)!r}, sentinels={self.sentinels!r}, "
            f"service_name={self.service_name!r}, sentinel_kwargs={sentinel_kwargs!r})"
        )

    @classmethod
    def server(cls, url: str, **kwargs: Any) -> LockConnection:
        """One server at ``url`` (``redis://``, ``rediss://`` or ``unix://``)."""
        return cls("server", (url,), kwargs)

    @classmethod
    def cluster(cls, urls: Sequence[str], **kwargs: Any) -> LockConnection:
        """A Redis Cluster reached through the nodes at ``urls`` (``redis://`` or
        ``rediss://``, at least one; the cluster client discovers the others)."""
        return cls("cluster", tuple(urls), kwargs)

    @classmethod
    def sentinel(
        cls,
        sentinels: Sequence[tuple[str, int]],
        service_name: str,
        *,
        sentinel_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> LockConnection:
        """The master of ``service_name``, as the ``sentinels`` (host, port) report it."""
        addresses = tuple((str(host), int(port)) for host, port in sentinels)
        return cls("sentinel", (), kwargs, addresses, service_name, sentinel_kwargs)

    def describe(self) -> str:
        """Where the locks connect, for messages (passwords shown as ``***``)."""
        if self.topology == "sentinel":
            where = ", ".join(f"{host}:{port}" for host, port in self.sentinels)
            return f"master {self.service_name!r} of the sentinels {where}"
        urls = ", ".join(shown_url(url) for url in self.urls)
        return f"Redis Cluster {urls}" if self.topology == "cluster" else urls

    def key(self) -> str:
        """A string equal for equal configurations (the dataclass holds dicts, so
        it cannot be hashed), whatever the order of the options."""
        given = self.sentinel_kwargs
        sentinel_kwargs = None if given is None else sorted(given.items())
        return repr(
            (
                self.topology,
                self.urls,
                sorted(self.kwargs.items()),
                self.sentinels,
                self.service_name,
                sentinel_kwargs,
            )
        )

    def loop_clients(self) -> LoopClients:
        """A new ``LoopClients`` for this connection (use ``shared_clients`` instead,
        which makes one per configuration and process)."""
        if self.topology == "sentinel":
            return LoopClients.sentinel(
                self.sentinels,
                self.service_name,
                sentinel_kwargs=self.sentinel_kwargs,
                **self.kwargs,
            )
        if self.topology == "cluster":
            first, *others = self.urls
            nodes = [node_address(url) for url in others]
            return LoopClients.cluster(first, nodes=nodes, **self.kwargs)
        return LoopClients(self.urls[0], **self.kwargs)


def node_address(url: str) -> tuple[str, int]:
    """(host, port) of a ``redis://`` or ``rediss://`` node URL; port 6379 if none.

    Raises:
        ValueError: the URL names no host or has a malformed port.
    """
    parts = urlsplit(url)
    if not parts.hostname:
        raise ValueError(f"{shown_url(url)!r} names no host")
    return parts.hostname, parts.port or DEFAULT_PORT


_registry: dict[str, LoopClients] = {}
_registry_guard = threading.Lock()


def shared_clients(connection: LockConnection) -> LoopClients:
    """The process-wide ``LoopClients`` for one connection configuration.

    Args:
        connection: where the locks connect (``LockConnection``).

    Returns:
        the same ``LoopClients`` for equal configurations, for the whole process.

    Every cache backend instance (one per thread or async context) with the
    same settings gets the same object, so a process holds at most one client
    per event loop per configuration. The ``LoopClients`` keys its clients by
    running loop and process id, so the entries of this registry stay valid
    after ``fork()``. Nothing is ever closed here: each client is closed by its
    loop's ``close()``; the sync portal's lives as long as the process.
    """
    key = connection.key()
    with _registry_guard:
        clients = _registry.get(key)
        if clients is None:
            clients = _registry[key] = connection.loop_clients()
        return clients
