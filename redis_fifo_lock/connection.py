"""Connection arguments: checked once when a lock or its clients are built, and
shown without their secrets.

``check_url`` is the one place that decides which URLs a lock can connect to,
and ``check_options`` has redis-py refuse, at once, the options of a plain
server's client it would refuse only at its first command;
``LoopClients``, ``SyncFifoLock`` and the Celery and Django integrations call
it, so a wrong type or scheme fails at construction, naming the setting, rather
than at the first acquire. ``masked_url`` and ``masked_kwargs`` are what every
``repr`` and message uses to show a connection: passwords become ``***``.
"""

from __future__ import annotations

import contextlib
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from redis.asyncio import Redis
from redis.connection import parse_url
from redis.exceptions import RedisError

SCHEMES = ("redis", "rediss", "unix")
"""URL schemes a lock connects with (as redis-py's ``from_url``): plain, TLS, Unix socket."""

MASK = "***"
"""What a secret is shown as."""

SECRET_WORDS = ("password", "passwd", "secret", "token", "credential")
"""A connection option (or URL query parameter) whose name contains one of these
is a secret: its value is never shown."""

SHOWN_URL_CHARS = 200
"""Longest URL text put in a message, in characters (the rest is cut)."""

NODE_PORT = 6379
"""Port of a Redis Cluster node whose URL names none."""

TIMEOUT_OPTIONS = ("socket_timeout", "socket_connect_timeout")
"""Connection options in seconds that ``check_options`` checks with ``is_seconds``."""


def is_seconds(value: object) -> bool:
    """Whether ``value`` can be a socket timeout: None (none), or an int or
    float above 0 and finite (not a bool). redis-py takes any value and fails
    only when it connects: a str raises a bare ``TypeError`` there, and a
    negative, zero, NaN or infinite one makes every call fail or never end."""
    if value is None:
        return True
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) and value > 0


def is_secret(option: str) -> bool:
    """Whether the connection option (or query parameter) ``option`` holds a secret."""
    lowered = option.lower()
    return any(word in lowered for word in SECRET_WORDS)


def masked_url(url: str) -> str:
    """``url`` with its password and any secret query parameter shown as ``***``.

    A URL that cannot be parsed is shown as its scheme only. The result is
    cut at ``SHOWN_URL_CHARS`` characters.
    """
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return f"{url.split(':', 1)[0][:20]}://(unparsable URL)"
    netloc = parts.netloc
    if password is not None:
        user = parts.username or ""
        netloc = f"{user}:{MASK}@{netloc.rsplit('@', 1)[1]}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(key, MASK if is_secret(key) else value) for key, value in pairs])
    shown = urlunsplit(parts._replace(netloc=netloc, query=query))
    if len(shown) > SHOWN_URL_CHARS:
        return shown[:SHOWN_URL_CHARS] + "..."
    return shown


def masked_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of connection ``kwargs`` to show: secrets (``password``,
    ``ssl_password``, ``credential_provider``...) replaced by ``***``, nested
    option dicts (``sentinel_kwargs``) masked the same way, URLs masked."""
    shown: dict[str, Any] = {}
    for key, value in kwargs.items():
        if is_secret(str(key)) and value is not None:
            shown[key] = MASK
        elif isinstance(value, Mapping):
            shown[key] = masked_kwargs(value)
        elif isinstance(value, str) and "://" in value:
            shown[key] = masked_url(value)
        else:
            shown[key] = value
    return shown


def check_url(url: object, argument: str, schemes: tuple[str, ...] = SCHEMES) -> str:
    """Return ``url`` if a lock can connect with it, else raise naming ``argument``.

    Args:
        url: the value to check.
        argument: how the caller spells the setting or argument (str), e.g.
            ``"url"``, ``"LOCATION"``, ``"fifo_lock_redis_url"``.
        schemes: the accepted URL schemes, lower case; default ``SCHEMES``.

    Raises:
        TypeError: ``url`` is not a ``str``.
        ValueError: its scheme is not one of ``schemes``, redis-py cannot
            parse it (a port that is not a number, a database that is not an
            integer...), or a ``unix://`` URL has no socket path; the message
            shows the URL with its password masked.
    """
    if not isinstance(url, str):
        raise TypeError(f"{argument} must be a str (a Redis URL), got {type(url).__name__}")
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in schemes:
        *others, last = [f"{name}://" for name in schemes]
        accepted = f"{', '.join(others)} or {last}" if others else last
        raise ValueError(
            f"{argument} {masked_url(url)!r} is not a URL the lock can connect with: it must "
            f"start with {accepted} (for example redis://localhost:6379/0)"
        )
    if scheme in SCHEMES:
        try:
            # redis-py's own parser (untyped), given the scheme in lower case as it wants.
            parsed = parse_url(scheme + url[len(scheme) :])  # type: ignore[no-untyped-call]
        except ValueError as exc:
            raise ValueError(
                f"{argument} {masked_url(url)!r} is not a URL the lock can connect with: "
                f"{_unsecret(str(exc), url, {})[:SHOWN_URL_CHARS]}"
            ) from None
        if scheme == "unix" and not parsed.get("path"):
            raise ValueError(
                f"{argument} {masked_url(url)!r} is not a URL the lock can connect with: a "
                "unix:// URL must give the socket's path (for example unix:///run/redis.sock)"
            )
    return url


CHECKED_MAX = 256
"""Most connection configurations ``check_options`` remembers as accepted, so
that building many locks on one configuration checks it once (redis-py 8
reads its package metadata for every connection it builds: about 0.5 ms).
Only configurations whose options are all plain values (str, int, float,
bool, bytes, None) are remembered: an object's equality says nothing of what
redis-py will do with it."""

_PLAIN = (str, int, float, bool, bytes, type(None))

_accepted: OrderedDict[tuple[object, ...], None] = OrderedDict()


def check_options(
    build: Callable[[], Redis], url: str | None, kwargs: Mapping[str, Any], where: str
) -> None:
    """Build, never open, one connection of the pool of the client ``build()``
    returns, as redis-py will at the first command, so that an option it
    refuses fails now, naming ``where``. A configuration of plain values
    accepted once is not checked again (see ``CHECKED_MAX``). Thread-safe.

    Args:
        build: makes a plain client from ``url`` and ``kwargs``.
        url: the URL (str), or None; shown masked.
        kwargs: the connection options; secrets never shown.
        where: what to name in the message (str), e.g. ``"LoopClients"``.

    Raises:
        TypeError: an option no connection takes (a misspelt keyword, an unknown
            URL query parameter).
        ValueError: a value redis-py refuses (``protocol`` other than 2 or 3, an
            unknown ``ssl_cert_reqs``...), or a ``socket_timeout`` or
            ``socket_connect_timeout`` that is no number of seconds above 0
            (see ``is_seconds``), from the URL's query or the options.
    """
    key = _plain_key(url, kwargs)
    if key is not None and key in _accepted:
        return
    shown = masked_url(url) if url is not None else "the connection"
    try:
        connection = build().connection_pool.make_connection()  # type: ignore[no-untyped-call]
    except TypeError as exc:
        reason = _unsecret(str(exc), url, kwargs)[:SHOWN_URL_CHARS]
        raise TypeError(
            f"{where}: redis-py takes no such connection option for {shown!r} ({reason}); "
            "check its spelling in the URL's query and the connection options"
        ) from None
    except (RedisError, ValueError) as exc:
        reason = _unsecret(str(exc), url, kwargs)[:SHOWN_URL_CHARS]
        raise ValueError(
            f"{where}: redis-py refuses the connection options of {shown!r}: {reason}"
        ) from None
    for option in TIMEOUT_OPTIONS:
        value = getattr(connection, option, None)
        if not is_seconds(value):
            raise ValueError(
                f"{where}: {option} of {shown!r} must be a number of seconds above 0 (an int "
                f"or float, or None for none), got {type(value).__name__} "
                f"{str(value)[:SHOWN_URL_CHARS]!r}"
            )
    if key is not None:
        _accepted[key] = None
        while len(_accepted) > CHECKED_MAX:
            with contextlib.suppress(KeyError):  # another thread emptied it first
                _accepted.popitem(last=False)


def _plain_key(url: str | None, kwargs: Mapping[str, Any]) -> tuple[object, ...] | None:
    """What ``check_options`` remembers ``url`` and ``kwargs`` by, or None when an
    option is not a plain value (see ``CHECKED_MAX``)."""
    if not all(isinstance(value, _PLAIN) for value in kwargs.values()):
        return None
    options = sorted((str(name), type(value).__name__, value) for name, value in kwargs.items())
    return (url, *options)


def _unsecret(text: str, url: str | None, kwargs: Mapping[str, Any]) -> str:
    """``text`` (redis-py's reason for refusing ``url`` or ``kwargs``) with every
    password or other secret it quotes shown as ``***``."""
    secrets = [str(value) for key, value in kwargs.items() if is_secret(str(key)) and value]
    with contextlib.suppress(ValueError):  # an unparsable URL quotes no password
        secrets.append(urlsplit(url or "").password or "")
    for secret in secrets:
        if secret:
            text = text.replace(secret, MASK)
    return text


def node_address(url: object, argument: str) -> tuple[str, int]:
    """``(host, port)`` of a Redis Cluster node's URL, checked: ``redis://`` or
    ``rediss://``, with a host, and database 0 (the only one a cluster has);
    port ``NODE_PORT`` when it names none.

    Args:
        url: the value to check.
        argument: how the caller spells the setting, for messages (str).

    Raises:
        TypeError: ``url`` is not a ``str``.
        ValueError: naming ``argument``, another scheme, no host, a malformed
            port, or a database other than 0.
    """
    parts = urlsplit(check_url(url, argument, ("redis", "rediss")))
    shown = masked_url(str(url))
    try:
        port = parts.port or NODE_PORT
    except ValueError as exc:
        raise ValueError(f"{argument} {shown!r}: {exc}") from None
    if not parts.hostname:
        raise ValueError(f"{argument} {shown!r} names no host; a cluster node needs one")
    path = parts.path.strip("/")
    if path not in ("", "0"):
        raise ValueError(
            f"{argument} {shown!r} names database {path[:40]!r}, but a Redis Cluster has "
            "database 0 only"
        )
    return parts.hostname, port
