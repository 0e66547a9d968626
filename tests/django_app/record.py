"""A shared record of who held the lock, kept in Redis apart from the lock's keys.

Each holder appends an ``enter`` entry right after it got the lock and an
``exit`` entry right before it releases, and counts itself in and out of
``ACTIVE``: an overlap shows as an ``enter`` whose ``active`` is above 1, or as
two ``enter`` entries in a row. Works across threads, loops and processes.
"""

from __future__ import annotations

import json
from typing import Any

from django_redis import get_redis_connection

from redis_fifo_lock import Lease

LOG = "record:log"
ACTIVE = "record:active"


def enter(who: str, lease: Lease) -> None:
    """Record that ``who`` entered its critical section under ``lease``."""
    redis = get_redis_connection("default")
    active = redis.incr(ACTIVE)
    entry = {"event": "enter", "who": who, "fence": lease.fence, "ticket": lease.ticket}
    redis.rpush(LOG, json.dumps({**entry, "active": active}))


def leave(who: str, lease: Lease) -> None:
    """Record that ``who`` is leaving its critical section (before release)."""
    redis = get_redis_connection("default")
    redis.rpush(LOG, json.dumps({"event": "exit", "who": who, "fence": lease.fence}))
    redis.decr(ACTIVE)


def entries(redis: Any) -> list[dict[str, Any]]:
    """The record read back with the (sync) client ``redis``, in order."""
    return [json.loads(raw) for raw in redis.lrange(LOG, 0, -1)]


def holds(redis: Any) -> list[dict[str, Any]]:
    """The ``enter`` entries, after checking that the holds never overlapped.

    Raises:
        AssertionError: if two holds overlapped or an exit is unmatched.
    """
    log = entries(redis)
    assert len(log) % 2 == 0, log
    for enter_entry, exit_entry in zip(log[::2], log[1::2], strict=True):
        assert enter_entry["event"] == "enter" and enter_entry["active"] == 1, log
        assert exit_entry == {
            "event": "exit",
            "who": enter_entry["who"],
            "fence": enter_entry["fence"],
        }, log
    return log[::2]
