"""Where the locks live: ``LockServer``, and the one ``LoopClients`` per server.

A ``LockServer`` is one Redis server, the master of a Sentinel service, or a
Redis Cluster, with its connection options (credentials, TLS, timeouts). The
Celery and Django integrations only translate their own settings into one;
every rule about a topology is the core's (``LoopClients`` and its
``cluster()`` and ``sentinel()`` check what they are given when the server is
made, so a bad setting fails there, not at the first acquire).
``LockServer.clients()`` returns the process's ``LoopClients`` for it: the
same object for equal servers, so a process holds at most one client per
event loop per server. ``SyncFifoLock`` built from a URL takes its clients
from here too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from redis.asyncio.connection import parse_url

from . import native
from .clients import LoopClients
from .connection import masked_kwargs, masked_url, node_address
from .settings import Spelling

Topology = Literal["server", "sentinel", "cluster"]
"""How the locks' server is reached: one server, a Sentinel master, a Redis Cluster."""


@dataclass(frozen=True)
class LockServer:
    """Where the locks live. Make one with ``server``, ``sentinel`` or ``cluster``.

    Attributes:
        topology: "server", "sentinel" or "cluster" (``Topology``).
        urls: the server's URL ("server"), the nodes' URLs ("cluster", the
            first one's credentials apply to all), or empty ("sentinel").
        kwargs: ``redis.asyncio`` connection options of the server, the master
            or every node (``password``, ``db``, ``ssl_*``, ``socket_timeout``
            in seconds...); a URL's own values win over them.
        sentinels: (host, port) of each sentinel ("sentinel" only).
        service_name: the master's name in the sentinels' configuration
            ("sentinel" only).
        sentinel_kwargs: connection options of the sentinels themselves, or
            None ("sentinel" only).

    ``repr`` and ``describe()`` show no secret. Equal servers share their
    clients (``clients()``).
    """

    topology: Topology
    urls: tuple[str, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    sentinels: tuple[tuple[str, int], ...] = ()
    service_name: str = ""
    sentinel_kwargs: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.clients()  # checks every option, and shares the clients of equal servers

    def __repr__(self) -> str:
        sentinel_kwargs = (
            None if self.sentinel_kwargs is None else masked_kwargs(self.sentinel_kwargs)
        )
        return (
            f"LockServer({self.topology!r}, urls={[masked_url(url) for url in self.urls]!r}, "
            f"kwargs={masked_kwargs(self.kwargs)!r}, sentinels={self.sentinels!r}, "
            f"service_name={self.service_name!r}, sentinel_kwargs={sentinel_kwargs!r})"
        )

    @classmethod
    def server(cls, url: str, **kwargs: Any) -> LockServer:
        """One server at ``url`` (``redis://``, ``rediss://`` or ``unix://``) with
        the connection options ``kwargs``.

        Raises:
            TypeError, ValueError: as ``LoopClients(url, **kwargs)``.
        """
        return cls("server", (url,), kwargs)

    @classmethod
    def cluster(cls, urls: Sequence[str], **kwargs: Any) -> LockServer:
        """A Redis Cluster reached through the nodes at ``urls`` (at least one;
        the cluster client discovers the others), with the connection options
        ``kwargs`` of every node.

        Raises:
            TypeError, ValueError: no URL, or as ``connection.node_address`` and
                ``LoopClients.cluster``.
        """
        if not urls:
            raise ValueError("a Redis Cluster lock server needs at least one node URL")
        return cls("cluster", tuple(urls), kwargs)

    @classmethod
    def sentinel(
        cls,
        sentinels: Sequence[tuple[str, int]],
        service_name: str,
        *,
        sentinel_kwargs: Mapping[str, Any] | None = None,
        spell: Spelling = str,
        **kwargs: Any,
    ) -> LockServer:
        """The master of ``service_name``, as the ``sentinels`` ((host, port)
        pairs) report it, with the connection options ``kwargs`` of the master
        and ``sentinel_kwargs`` of the sentinels.

        ``spell`` (default: the name as is) says how the caller spells the
        option ``sentinel_kwargs`` in messages, e.g. ``OPTIONS['SENTINEL_KWARGS']``.

        Raises:
            ValueError: no sentinel, or an empty ``service_name``.
            TypeError: ``sentinel_kwargs`` is neither a mapping nor None (only
                its type is shown: it may hold a password).
            TypeError, ValueError: as ``LoopClients.sentinel``.
        """
        if sentinel_kwargs is not None and not isinstance(sentinel_kwargs, Mapping):
            raise TypeError(
                f"{spell('sentinel_kwargs')} must be a dict or None, got "
                f"{type(sentinel_kwargs).__name__}"
            )
        addresses = tuple((str(host), int(port)) for host, port in sentinels)
        if not addresses or not service_name:
            raise ValueError(
                "a Sentinel lock server needs the sentinels' (host, port) addresses and the "
                f"service name, got {addresses!r} and {service_name!r}"
            )
        own = None if sentinel_kwargs is None else dict(sentinel_kwargs)
        return cls("sentinel", (), kwargs, addresses, service_name, own)

    def describe(self) -> str:
        """Where the locks live, for messages (passwords shown as ``***``)."""
        if self.topology == "sentinel":
            where = ", ".join(f"{host}:{port}" for host, port in self.sentinels)
            return f"master {self.service_name!r} of the sentinels {where}"
        urls = ", ".join(masked_url(url) for url in self.urls)
        return f"Redis Cluster {urls}" if self.topology == "cluster" else urls

    def place(self) -> tuple[object, ...]:
        """Where the lock keys are, as configured: equal for two servers that
        reach the same keys whatever their other options (timeouts, pools).

        ``("server", host, port, db)``, ``("unix", path, db)``,
        ``("sentinel", service_name, db, sentinels)`` or ``("cluster", nodes)``;
        the database from the URL, else the ``db`` option, else 0. Host names
        are compared as written (``localhost`` is not ``127.0.0.1``).
        """
        db = int(self.kwargs.get("db") or 0)
        if self.topology == "sentinel":
            return ("sentinel", self.service_name, db, tuple(sorted(self.sentinels)))
        if self.topology == "cluster":
            nodes = sorted(node_address(url, "a Redis Cluster node's URL") for url in self.urls)
            return ("cluster", tuple(nodes))
        parsed = parse_url(self.urls[0])
        db = int(parsed.get("db", db))
        if "path" in parsed:
            return ("unix", parsed["path"], db)
        return ("server", parsed.get("host", "localhost"), int(parsed.get("port", 6379)), db)

    def key(self) -> str:
        """A string equal for equal servers, whatever the order of the options
        (the dataclass holds dicts, so it cannot be hashed)."""
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

    def clients(self) -> LoopClients:
        """This process's ``LoopClients`` for the server: the same object for
        every equal ``LockServer``, for the whole process (its clients are
        keyed by event loop and process id, so it stays valid after ``fork()``).
        Thread-safe; nothing is ever closed here (each client closes with its loop).

        Raises:
            TypeError, ValueError: as ``LoopClients`` and its ``cluster`` and
                ``sentinel``, for options they refuse.
        """
        key = self.key()
        with _guard:
            clients = _shared.get(key)
            if clients is None:
                clients = _shared[key] = self._new_clients()
            return clients

    def _new_clients(self) -> LoopClients:
        if self.topology == "sentinel":
            return LoopClients.sentinel(
                self.sentinels,
                self.service_name,
                sentinel_kwargs=self.sentinel_kwargs,
                **self.kwargs,
            )
        if self.topology == "cluster":
            first, *others = self.urls
            nodes = [node_address(url, "a Redis Cluster node's URL") for url in others]
            return LoopClients.cluster(first, nodes=nodes, **self.kwargs)
        return LoopClients(self.urls[0], **self.kwargs)


_shared: dict[str, LoopClients] = {}
"""The process's ``LoopClients``, one per distinct configuration (``key()``): it
grows with the servers and options configured, never with locks or names. Its
keys hold the options as given, secrets included; they are never shown."""
_guard = native.lock()


def _after_fork_in_child() -> None:
    # A thread of the parent may have held the guard at the moment of the fork;
    # that thread does not exist in the child. The LoopClients themselves drop
    # the parent's clients on their own (they key by process id).
    global _guard
    _guard = native.lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
