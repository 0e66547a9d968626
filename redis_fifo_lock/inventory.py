"""Which locks exist: the names of every lock with a key in Redis, for operators.

The names are found with ``SCAN`` (never ``KEYS``, which blocks the server for
as long as it walks the whole keyspace), matching the key pattern of one
namespace (see ``acl.key_pattern``). A lock shows up while any of its keys
exists: while it is held or waited for, and for ``keep_ms`` after it was last
used. On Redis Cluster, redis-py's ``scan_iter`` walks every master.
"""

from __future__ import annotations

import asyncio

import redis

from .acl import key_pattern
from .clients import LoopClients
from .portal import portal
from .protocol import CALL_TIMEOUT_S, KEY_PREFIX, AsyncClient, as_text, bounded, client_encoding

SCAN_COUNT = 1000
"""How many keys each ``SCAN`` call asks the server to look at (its ``COUNT``)."""


def _name_of(key: str, prefix: str) -> str | None:
    """The lock name in ``key`` (``<prefix>{<name>}:<part>``), or None for another key."""
    if not key.startswith(prefix):
        return None
    name, closed, _ = key[len(prefix) :].partition("}:")
    return name if closed else None


async def lock_names(client: AsyncClient, namespace: str = "") -> list[str]:
    """The names (str) of the locks of ``namespace`` (str, "" for none) that have
    any key in Redis, sorted.

    Raises:
        redis.exceptions.RedisError: Redis could not be reached or refused SCAN
            (the lock user's ACL needs ``+scan`` for this);
            ``redis.exceptions.TimeoutError`` when a ``SCAN`` went unanswered
            for ``protocol.CALL_TIMEOUT_S`` seconds on a client with no
            ``socket_timeout`` (see ``protocol.bounded``).
    """
    prefix = f"{namespace}:{KEY_PREFIX}:{{" if namespace else f"{KEY_PREFIX}:{{"
    names: set[str] = set()
    encoding = client_encoding(client)
    # The keys are UTF-8 whatever the client's encoding (see protocol.wired).
    pattern = key_pattern(namespace).encode()
    keys = client.scan_iter(match=pattern, count=SCAN_COUNT)
    while True:
        try:
            key = await bounded(client, anext(keys))
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            raise redis.exceptions.TimeoutError(
                f"Redis did not answer a SCAN for lock names within {CALL_TIMEOUT_S:g} s; "
                "check that the server is reachable, and retry"
            ) from None
        # A foreign key that matches the pattern may not be UTF-8.
        text = key.decode("utf-8", "replace") if isinstance(key, bytes) else as_text(key, *encoding)
        name = _name_of(text, prefix)
        if name is not None:
            names.add(name)
    return sorted(names)


def lock_names_sync(clients: LoopClients, namespace: str = "") -> list[str]:
    """``lock_names`` for sync code: run on the process's portal loop with its
    client from ``clients``. Raises what ``lock_names`` raises."""

    async def run() -> list[str]:
        return await lock_names(clients.client(), namespace)

    return portal().call(f"{namespace}:*" if namespace else "*", run)
