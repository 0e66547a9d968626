"""Where a Celery app's locks live: ``lock_server`` reads a URL and transport
options, as Celery users write them for the broker, into the core's ``LockServer``.

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
from typing import Any
from urllib.parse import SplitResult, parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from kombu.utils.url import parse_ssl_cert_reqs

from redis_fifo_lock import LockServer
from redis_fifo_lock.connection import SCHEMES, check_url, masked_url

SENTINEL_PORT = 26379
"""Port of a sentinel whose URL names none (kombu's default)."""
SEPARATOR = ";"
"""Separates the URLs of several sentinels or cluster nodes (as in kombu)."""


class ServerError(ValueError):
    """A lock server setting is invalid; the message says what to change.

    ``fifolock_celery.settings`` turns it into a ``LockUsageError`` naming the
    lock and the setting.
    """


def lock_server(
    url: str, options: Mapping[str, Any] | None = None, use_ssl: object = None
) -> LockServer:
    """Read a lock server URL and its transport ``options`` into a ``LockServer``.

    Args:
        url: one ``redis://``, ``rediss://`` or ``unix://`` URL, or several
            ``sentinel://`` or (with ``cluster``) node URLs separated by ``;``.
        options: the transport options (``master_name``, ``sentinel_kwargs``,
            ``cluster``, ``ssl_*``); other keys are ignored. None means none.
        use_ssl: the broker's ``broker_use_ssl`` when ``url`` is the broker's
            (a dict of ``ssl_*`` options; None or empty: none), else None.

    Raises:
        ServerError: a ``sentinel://`` URL without ``master_name`` or mixed with
            other schemes, several URLs that are neither sentinels nor (with
            ``cluster``) cluster nodes, an option of the wrong type, TLS
            settings kombu would not follow (``broker_use_ssl=True``, a key that
            is not an ``ssl_*`` option, an unknown ``ssl_cert_reqs``), or
            anything the core's ``LockServer`` refuses (its ``TypeError`` or
            ``ValueError`` is the ``__cause__``: a URL scheme, a cluster node
            with a database other than 0, TLS options redis-py cannot take...).
    """
    options = {} if options is None else options
    if not isinstance(options, Mapping):
        raise ServerError(f"the transport options must be a dict, got {type(options).__name__}")
    cluster = options.get("cluster", False)
    if not isinstance(cluster, bool):
        raise ServerError(f"transport option 'cluster' must be True or False, got {cluster!r}")
    for chunk in url.split(SEPARATOR):
        try:
            check_url(chunk.strip(), "the URL", (*SCHEMES, "sentinel"))
        except (TypeError, ValueError) as exc:
            raise ServerError(str(exc)) from exc
    url, tls = _tls_options(url, options, use_ssl)
    chunks = [chunk.strip() for chunk in url.split(SEPARATOR)]
    parts = [urlsplit(chunk) for chunk in chunks]
    try:
        if any(part.scheme == "sentinel" for part in parts):
            if cluster:
                raise ServerError("a sentinel:// URL cannot name a Redis Cluster ('cluster': True)")
            return _sentinel(url, parts, options, tls)
        if cluster:
            return LockServer.cluster(chunks, **tls)
        if len(chunks) > 1:
            raise ServerError(
                f"{_shown(url)} lists several servers; the locks need one server, the "
                "sentinels of one (sentinel://...;sentinel://...) or, with the transport "
                "option 'cluster': True, the nodes of a Redis Cluster"
            )
        return LockServer.server(url, **tls)
    except ServerError:
        raise
    except (TypeError, ValueError) as exc:
        raise ServerError(str(exc)) from exc


def _sentinel(
    url: str, parts: list[SplitResult], options: Mapping[str, Any], tls: dict[str, Any]
) -> LockServer:
    """The Sentinel master of kombu's form: the first URL's credentials and
    database are the master's."""
    if any(part.scheme != "sentinel" or not part.hostname for part in parts):
        raise ServerError(
            f"{_shown(url)}: every URL of a Sentinel set-up must be sentinel://host[:port]"
        )
    master_name = options.get("master_name")
    if not isinstance(master_name, str) or not master_name:
        raise ServerError(
            f"{_shown(url)} is a Sentinel URL: the transport options must name the "
            f"service with 'master_name' (str), got {master_name!r}"
        )
    first = parts[0]
    master: dict[str, Any] = {"db": _database(first), **tls}
    if first.username:
        master["username"] = unquote(first.username)
    if first.password:
        master["password"] = unquote(first.password)
    return LockServer.sentinel(
        [(part.hostname or "", part.port or SENTINEL_PORT) for part in parts],
        master_name,
        sentinel_kwargs=options.get("sentinel_kwargs"),
        spell=lambda option: f"transport option {option!r}",
        **master,
    )


def _tls_options(
    url: str, options: Mapping[str, Any], use_ssl: object
) -> tuple[str, dict[str, Any]]:
    """``url`` without its ``ssl_*`` query keys, and the TLS options of the lock
    server: ``use_ssl`` (``broker_use_ssl``), then the URLs' ``ssl_*`` query keys,
    then the ``ssl_*`` transport options (a later source wins).

    Raises:
        ServerError: naming the setting, for ``broker_use_ssl`` that is not a
            dict of ``ssl_*`` options, or an ``ssl_cert_reqs`` kombu does not know.
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
    tls.update({key: value for key, value in options.items() if key.startswith("ssl_")})
    return clean, tls


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
