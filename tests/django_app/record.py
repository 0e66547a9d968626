"""A shared record of who held the lock, kept in Redis apart from the lock's keys.

Each holder appends an ``enter`` entry right after it got the lock and an
``exit`` entry right before it releases, and counts itself in and out of
``ACTIVE``: an overlap shows as an ``enter`` whose ``active`` is above 1, or as
two ``enter`` entries in a row. Works across threads, loops and processes.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from django.conf import settings
from redis import Redis

from redis_fifo_lock import Lease

LOG = "record:log"
ACTIVE = "record:active"
HOLD_LIMIT_S = 30
"""Longest a test command holds on (its BLPOP timeout), in seconds."""

_clients: dict[str, Redis] = {}
_guard = threading.Lock()


def redis() -> Redis:
    """A sync client for the ``default`` cache's server (either backend), one per URL."""
    url = str(settings.CACHES["default"]["LOCATION"])
    with _guard:
        client = _clients.get(url)
        if client is None:
            # A read timeout above the commands' 30 s BLPOP (redis-py 8 reads
            # for 5 s by default, so a slow test run failed the BLPOP early).
            client = _clients[url] = Redis.from_url(url, socket_timeout=HOLD_LIMIT_S + 10)
        return client


def enter(who: str, lease: Lease | None) -> None:
    """Record that ``who`` entered its critical section under ``lease`` (None for
    code that does not know the lease it runs under, such as a command run by
    ``fifolock run``)."""
    client = redis()
    active = client.incr(ACTIVE)
    fence, ticket = (None, None) if lease is None else (lease.fence, lease.ticket)
    entry = {"event": "enter", "who": who, "fence": fence, "ticket": ticket}
    client.rpush(LOG, json.dumps({**entry, "active": active}))


def leave(who: str, lease: Lease | None) -> None:
    """Record that ``who`` is leaving its critical section (before release)."""
    client = redis()
    fence = None if lease is None else lease.fence
    client.rpush(LOG, json.dumps({"event": "exit", "who": who, "fence": fence}))
    client.decr(ACTIVE)


def entries(client: Any) -> list[dict[str, Any]]:
    """The record read back with the (sync) client ``client``, in order."""
    return [json.loads(raw) for raw in client.lrange(LOG, 0, -1)]


def holds(client: Any) -> list[dict[str, Any]]:
    """The ``enter`` entries, after checking that the holds never overlapped.

    Raises:
        AssertionError: if two holds overlapped or an exit is unmatched.
    """
    log = entries(client)
    assert len(log) % 2 == 0, log
    for enter_entry, exit_entry in zip(log[::2], log[1::2], strict=True):
        assert enter_entry["event"] == "enter" and enter_entry["active"] == 1, log
        assert exit_entry == {
            "event": "exit",
            "who": enter_entry["who"],
            "fence": enter_entry["fence"],
        }, log
    return log[::2]
