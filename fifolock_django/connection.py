"""What the lock backends share to say where a cache's FIFO locks live.

Each lock backend translates its own ``LOCATION`` and ``OPTIONS`` into the
core's ``LockServer`` (see ``fifolock_django.cache`` and
``fifolock_django.builtin``): one Redis server, the master of a Sentinel
service, or a Redis Cluster; the core checks it and keeps its clients. Nothing
here reads Django settings.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from redis.asyncio.connection import AbstractConnection as AsyncAbstractConnection
from redis.asyncio.connection import SSLConnection as AsyncSSLConnection
from redis.connection import AbstractConnection, SSLConnection

from redis_fifo_lock import LockServer
from redis_fifo_lock.connection import check_url, is_seconds
from redis_fifo_lock.settings import shown_value

TIMEOUT_KWARGS = ("socket_timeout", "socket_connect_timeout")
"""redis-py connection kwargs in seconds that ``check_seconds`` checks."""


def check_location(location: object) -> None:
    """Check a cache's ``LOCATION`` when its backend is built: one URL, several
    separated by ``,`` or ``;``, or a list of URLs, each ``redis://``,
    ``rediss://`` or ``unix://`` (the core's ``check_url``).

    Raises:
        ImproperlyConfigured: naming ``LOCATION``, whose ``__cause__`` is the
            core's ``TypeError`` (not a str or list of str) or ``ValueError``
            (another scheme, or a URL redis-py cannot parse). The message never
            shows a password.
    """
    try:
        if isinstance(location, (list, tuple)):
            urls: Sequence[object] = [url for url in location if url != ""]
        elif isinstance(location, str):
            # Each URL on its own: the whole text does not parse as one.
            urls = [url for url in re.split("[;,]", location) if url != ""] or [location]
        else:
            urls = [location]  # the core refuses it, naming its type
        for url in urls:
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


def check_seconds(setting: str, value: object) -> None:
    """Check a socket timeout of a cache's settings (``SOCKET_TIMEOUT``,
    ``socket_timeout``, ``socket_connect_timeout``...) before the lock uses it.

    The core refuses the same values (``redis_fifo_lock.connection.is_seconds``)
    when the clients are built; this names the cache's setting instead.

    Args:
        setting: how the user spells it, for the message (e.g.
            ``"CACHES['default']['OPTIONS']['SOCKET_TIMEOUT']"``).
        value: the configured value: None (no timeout) or seconds, an int or
            float above 0 and finite.

    Raises:
        ImproperlyConfigured: naming ``setting``, for any other value (a str,
            a bool, 0 or less, NaN, infinity). A str is shown cut short.
    """
    if is_seconds(value):
        return
    raise ImproperlyConfigured(
        f"{setting} must be a number of seconds above 0 (an int or float, or None for no "
        f"timeout), got {type(value).__name__} {shown_value(value)}; fix it in the cache's "
        "CACHES entry"
    )


def check_timeouts(kwargs: Mapping[str, Any], setting: str) -> None:
    """``check_seconds`` each of ``TIMEOUT_KWARGS`` in ``kwargs`` (redis-py
    connection kwargs that ``setting`` spells, e.g. ``"OPTIONS"``).

    Raises:
        ImproperlyConfigured: naming ``setting[key]``, see ``check_seconds``.
    """
    for key in TIMEOUT_KWARGS:
        if key in kwargs:
            check_seconds(f"{setting}[{key!r}]", kwargs[key])


def lock_kwargs(
    options: Mapping[str, Any], setting: str, sync_only: frozenset[str]
) -> dict[str, Any]:
    """The lock's ``redis.asyncio`` connection kwargs from a cache's pool kwargs.

    Args:
        options: redis-py pool kwargs (``OPTIONS`` of Django's backend,
            ``CONNECTION_POOL_KWARGS`` of django-redis').
        setting: how the user spells ``options``, for messages.
        sync_only: keys to leave out (they only fit the sync client).

    Returns:
        ``options`` less ``sync_only``, with ``ssl=True`` when their
        ``connection_class`` speaks TLS: the lock then uses TLS too. (The core
        checks the TLS options when the ``LockServer`` is made.)

    Raises:
        ImproperlyConfigured: naming ``setting``, for a ``connection_class``
            that is not a class, or a ``socket_timeout`` or
            ``socket_connect_timeout`` that is no number of seconds above 0
            (see ``check_seconds``).
    """
    check_timeouts(options, setting)
    kwargs = {key: value for key, value in options.items() if key not in sync_only}
    if "connection_class" in options and speaks_tls(setting, options["connection_class"]):
        kwargs["ssl"] = True
    return kwargs


def configured_server(build: Callable[..., LockServer], *args: Any, **kwargs: Any) -> LockServer:
    """``build(*args, **kwargs)`` (a ``LockServer`` constructor), with the core's
    refusal of a setting turned into Django's ``ImproperlyConfigured``.

    Raises:
        ImproperlyConfigured: whose ``__cause__`` is the core's ``TypeError``
            or ``ValueError`` (see ``redis_fifo_lock.LockServer``).
    """
    try:
        return build(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(f"a cache with fifo_lock(): {exc}") from exc
