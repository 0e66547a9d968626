"""Where a Celery app's locks live: ``LockServer``, from a URL and transport options.

Three topologies, in the forms Celery users already write for the broker::

    # one server
    fifo_lock_redis_url = "redis://:secret@redis.example:6379/0"

    # the master of a Sentinel service: kombu's broker form
    fifo_lock_redis_url = "sentinel://:secret@s1:26379/0;sentinel://s2:26379"
    fifo_lock_transport_options = {"master_name": "mymaster",
                                   "sentinel_kwargs": {"password": "..."}}

    # a Redis Cluster (kombu has no cluster transport): any nodes, ";"-separated
    fifo_lock_redis_url = "redis://node1:7000;redis://node2:7000"
    fifo_lock_transport_options = {"cluster": True}

As in kombu, a ``sentinel://`` URL lists the sentinels (port 26379 when none
is given); the first one's password, user name and database are the master's.
``master_name`` names the service, ``sentinel_kwargs`` (a dict) are the
connection options of the sentinels themselves. When the locks default to a
Redis broker, the transport options default to ``broker_transport_options``,
so a Sentinel broker needs nothing more (see ``fifolock_celery.settings``).
Other keys of the transport options are ignored.

TLS, as kombu configures it for a Redis broker, for the server, the Sentinel
master or every cluster node::

    fifo_lock_redis_url = "rediss://:secret@redis.example:6380/0?ssl_cert_reqs=required"
    # or a redis:// (or sentinel://) URL with TLS options, from any of:
    broker_use_ssl = {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": "/ca.pem"}
    fifo_lock_transport_options = {"ssl_ca_certs": "/ca.pem", ...}

``ssl_*`` keys in a URL's query are read as kombu reads them
(``ssl_cert_reqs`` may be ``CERT_REQUIRED``/``required``, ``CERT_OPTIONAL``/
``optional`` or ``CERT_NONE``/``none``); ``broker_use_ssl`` applies when the
locks use the broker's URL; any ``ssl_*`` option means TLS. Unlike kombu, a
``rediss://`` URL without ``ssl_cert_reqs`` verifies the server's certificate
(redis-py's default). Sentinels that themselves speak TLS take ``ssl=True``
(and their ``ssl_*`` options) in ``sentinel_kwargs``, as in kombu.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import SplitResult, parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from kombu.utils.url import parse_ssl_cert_reqs

from redis_fifo_lock import LoopClients
from redis_fifo_lock.clients import wants_tls
from redis_fifo_lock.connection import SCHEMES, check_url, masked_kwargs, masked_url

Topology = Literal["server", "sentinel", "cluster"]
"""How the lock server is reached: one server, a Sentinel master, a Redis Cluster."""

SENTINEL_PORT = 26379
"""Port of a sentinel whose URL names none (kombu's default)."""
NODE_PORT = 6379
"""Port of a cluster node whose URL names none."""
SEPARATOR = ";"
"""Separates the URLs of several sentinels or cluster nodes (as in kombu)."""
URL_SCHEMES = (*SCHEMES, "sentinel")
"""Schemes of the lock server's URLs: the core's (one server) and ``sentinel``."""


class ServerError(ValueError):
    """A lock server setting is invalid; the message says what to change.

    ``fifolock_celery.settings`` turns it into a ``LockUsageError`` naming the
    lock and the setting.
    """


@dataclass(frozen=True)
class LockServer:
    """Where the locks of a Celery app live. Build it with ``LockServer.parse``.

    Attributes:
        url: the configured URL (str): one ``redis://``, ``rediss://`` or
            ``unix://`` URL, or several ``sentinel://`` or cluster node URLs
            separated by ``;``.
        master_name: the Sentinel service (str), for a ``sentinel://`` URL;
            else None.
        sentinel_kwargs: connection options (dict) of the sentinels, or None.
        cluster: whether ``url`` names nodes of a Redis Cluster (bool).
        ssl: the TLS options (``ssl_*`` keyword arguments of redis-py) of the
            server, the Sentinel master or the cluster nodes, gathered from the
            URL's query, ``broker_use_ssl`` and the transport options; empty
            when none was given (a ``rediss://`` URL still means TLS).
    """

    url: str
    master_name: str | None = None
    sentinel_kwargs: dict[str, Any] | None = None
    cluster: bool = False
    ssl: tuple[tuple[str, Any], ...] = field(default=(), repr=False)  # may hold ssl_password

    def __repr__(self) -> str:
        kwargs = None if self.sentinel_kwargs is None else masked_kwargs(self.sentinel_kwargs)
        return (
            f"LockServer({_shown(self.url)}, master_name={self.master_name!r}, "
            f"sentinel_kwargs={kwargs!r}, cluster={self.cluster})"
        )

    @classmethod
    def parse(
        cls,
        url: str,
        options: Mapping[str, Any] | None = None,
        use_ssl: object = None,
    ) -> LockServer:
        """Check ``url`` and the transport ``options`` and keep what the locks need.

        Args:
            url: see ``url`` above.
            options: the transport options (``master_name``, ``sentinel_kwargs``,
                ``cluster``, ``ssl_*``); other keys are ignored. None means none.
            use_ssl: the broker's ``broker_use_ssl`` when ``url`` is the
                broker's (a dict of ``ssl_*`` options; None or empty: none),
                else None.

        Raises:
            ServerError: a URL that is not ``redis://``, ``rediss://``,
                ``unix://`` or ``sentinel://`` (the core's ``TypeError`` or
                ``ValueError`` is its ``__cause__``), a ``sentinel://`` URL
                without ``master_name``, a URL mixing schemes, several URLs
                that are neither sentinels nor (with ``cluster``) cluster nodes,
                a cluster URL with a database other than 0, an option of the
                wrong type, or TLS settings the locks cannot follow
                (``broker_use_ssl=True``, a key that is not an ``ssl_*`` option
                of redis-py's asyncio client, an unknown ``ssl_cert_reqs``).
        """
        options = {} if options is None else options
        if not isinstance(options, Mapping):
            raise ServerError(f"the transport options must be a dict, got {type(options).__name__}")
        cluster = options.get("cluster", False)
        if not isinstance(cluster, bool):
            raise ServerError(f"transport option 'cluster' must be True or False, got {cluster!r}")
        for chunk in url.split(SEPARATOR):
            try:
                check_url(chunk.strip(), "the URL", URL_SCHEMES)
            except (TypeError, ValueError) as exc:
                raise ServerError(str(exc)) from exc
        url, tls = _tls_options(url, options, use_ssl)
        parts = [urlsplit(chunk.strip()) for chunk in url.split(SEPARATOR)]
        schemes = {part.scheme for part in parts}
        if "sentinel" in schemes:
            if cluster:
                raise ServerError("a sentinel:// URL cannot name a Redis Cluster ('cluster': True)")
            return cls._sentinel(url, parts, schemes, options, tls)
        if cluster:
            _check_nodes(url, parts, schemes)
            return cls(url, cluster=True, ssl=tls)
        if len(parts) > 1:
            raise ServerError(
                f"{_shown(url)} lists several servers; the locks need one server, the "
                "sentinels of one (sentinel://...;sentinel://...) or, with the transport "
                "option 'cluster': True, the nodes of a Redis Cluster"
            )
        return cls(url, ssl=tls)

    @classmethod
    def _sentinel(
        cls,
        url: str,
        parts: list[SplitResult],
        schemes: set[str],
        options: Mapping[str, Any],
        tls: tuple[tuple[str, Any], ...],
    ) -> LockServer:
        if schemes != {"sentinel"} or not all(part.hostname for part in parts):
            raise ServerError(
                f"{_shown(url)}: every URL of a Sentinel set-up must be sentinel://host[:port]"
            )
        master_name = options.get("master_name")
        if not isinstance(master_name, str) or not master_name:
            raise ServerError(
                f"{_shown(url)} is a Sentinel URL: the transport options must name the "
                f"service with 'master_name' (str), got {master_name!r}"
            )
        sentinel_kwargs = options.get("sentinel_kwargs")
        if sentinel_kwargs is not None and not isinstance(sentinel_kwargs, Mapping):
            raise ServerError(
                "transport option 'sentinel_kwargs' must be a dict, got "
                f"{type(sentinel_kwargs).__name__}"
            )
        _database(parts[0])
        kwargs = None if sentinel_kwargs is None else dict(sentinel_kwargs)
        if kwargs is not None:
            _check_tls(None, kwargs, "transport option 'sentinel_kwargs'")
        return cls(url, master_name=master_name, sentinel_kwargs=kwargs, ssl=tls)

    @property
    def topology(self) -> Topology:
        """ "server", "sentinel" or "cluster"."""
        if self.master_name is not None:
            return "sentinel"
        return "cluster" if self.cluster else "server"

    def describe(self) -> str:
        """The URL(s) with passwords masked, and the topology, for messages."""
        if self.topology == "sentinel":
            return f"master {self.master_name!r} of the sentinels {_shown(self.url)}"
        if self.topology == "cluster":
            return f"Redis Cluster {_shown(self.url)}"
        return _shown(self.url)

    def key(self) -> str:
        """A string equal for equal servers (the dataclass holds a dict, so it
        cannot be hashed)."""
        given = self.sentinel_kwargs
        sentinel_kwargs = None if given is None else sorted(given.items())
        return repr((self.url, self.master_name, sentinel_kwargs, self.cluster, self.ssl))

    def loop_clients(self) -> LoopClients:
        """A new ``LoopClients`` for this server (``fifolock_celery.clients.clients_for``
        keeps one per app and server)."""
        parts = [urlsplit(chunk.strip()) for chunk in self.url.split(SEPARATOR)]
        tls = dict(self.ssl)
        if self.master_name is not None:
            first = parts[0]
            master: dict[str, Any] = {"db": _database(first), **tls}
            if first.username:
                master["username"] = unquote(first.username)
            if first.password:
                master["password"] = unquote(first.password)
            return LoopClients.sentinel(
                [(part.hostname or "", part.port or SENTINEL_PORT) for part in parts],
                self.master_name,
                sentinel_kwargs=self.sentinel_kwargs,
                **master,
            )
        if self.cluster:
            nodes = [(part.hostname or "", part.port or NODE_PORT) for part in parts[1:]]
            return LoopClients.cluster(parts[0].geturl(), nodes=nodes, **tls)
        return LoopClients(self.url, **tls)


def _check_tls(url: str | None, options: Mapping[str, Any], source: str) -> None:
    """Refuse TLS ``options`` (with ``url``) that redis-py's asyncio client cannot
    follow, naming ``source``.

    Raises:
        ServerError: see ``redis_fifo_lock.clients.wants_tls``.
    """
    try:
        wants_tls(url, options, source)
    except (TypeError, ValueError) as exc:
        raise ServerError(str(exc)) from None


def _tls_options(
    url: str, options: Mapping[str, Any], use_ssl: object
) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """``url`` without its ``ssl_*`` query keys, and the TLS options of the lock
    server: ``use_ssl`` (``broker_use_ssl``), then the URLs' ``ssl_*`` query keys,
    then the ``ssl_*`` transport options (a later source wins).

    Raises:
        ServerError: naming the setting, for ``broker_use_ssl`` that is not a
            dict of ``ssl_*`` options, an ``ssl_cert_reqs`` kombu does not know,
            or options redis-py's asyncio client does not take.
    """
    tls: dict[str, Any] = {}
    if use_ssl is True or (use_ssl and not isinstance(use_ssl, Mapping)):
        raise ServerError(
            f"broker_use_ssl is {use_ssl!r}: kombu's Redis transport needs a dict of ssl_* "
            "options (and ignores anything else, so the broker would not use TLS); set it to "
            "e.g. {'ssl_cert_reqs': ssl.CERT_REQUIRED, 'ssl_ca_certs': '/path/to/ca.pem'}, "
            "or use a rediss:// URL"
        )
    if isinstance(use_ssl, Mapping):
        others = sorted(str(key) for key in use_ssl if not str(key).startswith("ssl_"))
        if others:
            raise ServerError(
                f"broker_use_ssl has {', '.join(others)}, which redis-py does not take; a "
                "Redis broker's TLS options are ssl_* keys (ssl_cert_reqs, ssl_ca_certs, "
                "ssl_certfile, ssl_keyfile...)"
            )
        _check_tls(None, use_ssl, "broker_use_ssl")
        tls.update(use_ssl)
    chunks = []
    for chunk in url.split(SEPARATOR):
        parts = urlsplit(chunk.strip())
        query = parse_qsl(parts.query, keep_blank_values=True)
        for key, value in query:
            if key.startswith("ssl_"):
                tls[key] = _query_value(key, value)
        rest = [(key, value) for key, value in query if not key.startswith("ssl_")]
        chunks.append(urlunsplit(parts._replace(query=urlencode(rest))))
    clean = SEPARATOR.join(chunks) if len(chunks) > 1 else chunks[0]
    _check_tls(None, tls, f"{_shown(url)} (or broker_use_ssl)")
    from_options = {key: value for key, value in options.items() if key.startswith("ssl_")}
    _check_tls(None, from_options, "the transport options")
    tls.update(from_options)
    return clean, tuple(sorted(tls.items()))


def _query_value(key: str, value: str) -> Any:
    """An ``ssl_*`` value from a URL's query, as kombu reads it.

    Raises:
        ServerError: an ``ssl_cert_reqs`` kombu does not know.
    """
    if key == "ssl_check_hostname":
        return value.lower() != "false"
    if key == "ssl_cert_reqs":
        try:
            return parse_ssl_cert_reqs(value)
        except KeyError:
            raise ServerError(
                f"ssl_cert_reqs={value!r} in the lock server's URL: use CERT_REQUIRED (or "
                "required), CERT_OPTIONAL (optional) or CERT_NONE (none)"
            ) from None
    return value


def _shown(url: str) -> str:
    """``url`` (one or several) with passwords masked, quoted."""
    return repr(SEPARATOR.join(masked_url(chunk.strip()) for chunk in url.split(SEPARATOR)))


def _database(part: SplitResult) -> int:
    """The database number in a URL's path ("/2" is 2, none is 0).

    Raises:
        ServerError: the path is not a number.
    """
    path = part.path.strip("/")
    if not path:
        return 0
    if not path.isdigit():
        raise ServerError(
            f"{_shown(part.geturl())}: the path must be a database number, got {path[:40]!r}"
        )
    return int(path)


def _check_nodes(url: str, parts: list[SplitResult], schemes: set[str]) -> None:
    """Cluster node URLs: redis:// or rediss://, with a host, database 0."""
    if not schemes <= {"redis", "rediss"} or not all(part.hostname for part in parts):
        raise ServerError(
            f"{_shown(url)}: every node of a Redis Cluster must be a redis://host[:port] "
            "or rediss://host[:port] URL"
        )
    for part in parts:
        if _database(part):
            raise ServerError(
                f"{_shown(url)} names database {_database(part)}, but a Redis Cluster has "
                "database 0 only"
            )
