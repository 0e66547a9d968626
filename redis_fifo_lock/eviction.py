"""Whether a server may evict lock keys: its ``maxmemory-policy``, checked as locks are used.

A policy that evicts keys (``allkeys-*``, ``volatile-*``) can delete a held
lock's lease and free it silently. ``check_eviction_policy`` asks the server
(``CONFIG GET maxmemory-policy``) on first use, and again on the first use
after ``RECHECK_S`` seconds, so a policy changed later (an operator's
``CONFIG SET``, a managed service's parameter group) is noticed. While the
policy is unsafe, each lock is named in a WARNING the first time it is used in
a check interval (at most ``MAX_NAMED_LOCKS`` names per server and interval).
A server that refuses ``CONFIG GET`` is reported once, at WARNING.

The state is per server and process (``async_to_sync`` makes a client per
call, and each would pay a round trip otherwise), shared by all event loops
and threads of the process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import (
    NoPermissionError,
    RedisClusterException,
    RedisError,
    ResponseError,
)

from . import native
from .protocol import AsyncClient, lost_in_transport

log = logging.getLogger("redis_fifo_lock")

EVICTING_POLICIES = ("allkeys-", "volatile-")
"""Prefixes of the ``maxmemory-policy`` values that can evict lock keys."""

RECHECK_S = 300.0
"""Seconds after which the next use of a lock asks the server for its policy again."""

CONFIG_REFUSALS = ("NOPERM", "no permissions", "unknown command", "unknown subcommand")
"""Words of a Redis error reply (matched without case) that mean ``CONFIG GET``
itself is refused: an ACL, or the command renamed or disabled."""

MAX_NAMED_LOCKS = 100
"""Most locks named in warnings per server and check interval; beyond it, one
warning says that more locks are in use, and the rest go unnamed until the next check."""


@dataclass
class _Server:
    """What this process knows of one server's eviction policy."""

    checked_at: float | None = None
    """``time.monotonic()`` of the last check started, or None before the first."""
    known: bool = False
    """Whether a check has answered (``evicting`` is then the server's answer)."""
    evicting: tuple[str, ...] = ()
    named: set[str] = field(default_factory=set)
    """Locks warned about in this interval (bounded by ``MAX_NAMED_LOCKS``)."""
    pending: set[str] = field(default_factory=set)
    """Locks first used while a check was on its way (bounded likewise)."""
    denied_reported: bool = False


_guard = native.lock()
_servers: dict[tuple[object, ...], _Server] = {}
_by_client: weakref.WeakKeyDictionary[AsyncClient, _Server] = weakref.WeakKeyDictionary()
"""State of clients without one server address (Redis Cluster): per client."""


def _after_fork_in_child() -> None:
    # A thread of the parent may have held the guard at the moment of the fork,
    # and that thread does not exist here to release it.
    global _guard
    _guard = native.lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


async def check_eviction_policy(
    client: AsyncClient, name: str, ask: Callable[[], Awaitable[set[str]]] | None = None
) -> None:
    """Warn (naming lock ``name``) if the server behind ``client`` may evict keys.

    Asks the server at most once per ``RECHECK_S`` seconds per server and
    process; in between, it only warns for locks not yet named in this
    interval. Never raises: a server that cannot be reached is asked again on
    the next use, one that refuses ``CONFIG GET`` is reported once.

    Args:
        client: the lock's client (``redis.asyncio`` ``Redis`` or ``RedisCluster``).
        name: the lock being used (str).
        ask: how to ask the server for ``eviction_policies(client)`` (the hub
            sends it in its lane of calls); default None: directly.
    """
    now = time.monotonic()
    with _guard:
        state = _state_of(client)
        due = state.checked_at is None or now - state.checked_at >= RECHECK_S
        if not due:
            if state.known:
                _name(state, name, client)
            else:
                _remember(state.pending, name)
            return
        previous = state.checked_at
        state.checked_at = now
        _remember(state.pending, name)
    try:
        policies = await (eviction_policies(client) if ask is None else ask())
    except ResponseError as exc:
        if not refuses_config_get(exc):
            # An error every call meets (a database the server lacks): the
            # lock's own calls raise it; the next use asks again.
            with _guard:
                state.checked_at = previous
            return
        with _guard:
            state.known, state.evicting, state.pending = True, (), set()
            report = not state.denied_reported
            state.denied_reported = True
        if report:
            log.warning(
                "FIFO locks on %s: the server refuses CONFIG GET (%s), so its eviction "
                "policy could not be checked; make sure its maxmemory-policy is "
                "'noeviction' (or allow the lock's user +config|get)",
                _where(client),
                exc,
            )
        return
    except (
        RedisError,
        RedisClusterException,
        OSError,
        asyncio.TimeoutError,
        AttributeError,
        TypeError,
        RuntimeError,
    ) as exc:
        if isinstance(exc, (AttributeError, TypeError, RuntimeError)) and not lost_in_transport(
            exc
        ):
            raise
        with _guard:
            state.checked_at = previous  # not asked: the next use asks again
        return
    with _guard:
        state.known = True
        state.evicting = tuple(sorted(p for p in policies if p.startswith(EVICTING_POLICIES)))
        state.named = set()
        waiting, state.pending = state.pending, set()
        for pending in sorted(waiting):
            _name(state, pending, client)


def refuses_config_get(exc: ResponseError) -> bool:
    """Whether ``exc`` (an error reply to ``eviction_policies``) is the server
    refusing ``CONFIG GET`` (see ``CONFIG_REFUSALS``), rather than an error
    every lock would meet too (``DB index is out of range`` when the connection
    selects its database, a wrong type of server...)."""
    if isinstance(exc, NoPermissionError):
        return True
    text = str(exc).lower()
    return any(words.lower() in text for words in CONFIG_REFUSALS)


def _remember(names: set[str], name: str) -> None:
    if len(names) < MAX_NAMED_LOCKS:
        names.add(name)


def _name(state: _Server, name: str, client: AsyncClient) -> None:
    """Warn about lock ``name`` if the policy is unsafe and it was not named yet."""
    if not state.evicting or name in state.named or len(state.named) > MAX_NAMED_LOCKS:
        return
    if len(state.named) == MAX_NAMED_LOCKS:
        state.named.add(name)  # over the cap: this one stands for all the others
        log.warning(
            "FIFO locks on %s: more than %d locks are used while maxmemory-policy is %s; "
            "the others are not named until the next check",
            _where(client),
            MAX_NAMED_LOCKS,
            " and ".join(repr(policy) for policy in state.evicting),
        )
        return
    state.named.add(name)
    log.warning(
        "FIFO lock %r: the Redis server's maxmemory-policy is %s, which can evict "
        "the lease key and silently free a held lock (the holder then finds its "
        "lease lost at the next renewal). Set maxmemory-policy to 'noeviction', "
        "or give the locks a Redis of their own.",
        name,
        " and ".join(repr(policy) for policy in state.evicting),
    )


async def eviction_policies(client: AsyncClient) -> set[str]:
    """The distinct ``maxmemory-policy`` values (str) of the server(s) behind
    ``client``: its one server, or every primary of a Redis Cluster.

    Raises:
        redis.exceptions.ResponseError: a server refuses ``CONFIG GET``.
        redis.exceptions.RedisError: a server cannot be reached.
    """
    replies: list[dict[Any, Any]]
    if isinstance(client, RedisCluster):
        # Redis Cluster: redis-py sends CONFIG GET to one (the default) node
        # only; ask every master instead, which replies {node: {name: value}}
        # (typed by redis-py as a single node's reply).
        per_node = await client.config_get("maxmemory-policy", target_nodes=client.PRIMARIES)
        replies = list(cast("dict[str, dict[Any, Any]]", per_node).values())
    else:
        replies = [await client.config_get("maxmemory-policy")]
    values = (value for reply in replies for value in reply.values())
    return {value.decode() if isinstance(value, bytes) else str(value) for value in values}


def _state_of(client: AsyncClient) -> _Server:
    """The state of ``client``'s server, created on first use (call under ``_guard``)."""
    server = server_of(client)
    if server is None:
        state = _by_client.get(client)
        if state is None:
            state = _by_client[client] = _Server()
        return state
    state = _servers.get(server)
    if state is None:
        state = _servers[server] = _Server()
    return state


def server_of(client: AsyncClient) -> tuple[object, ...] | None:
    """The identity of ``client``'s server in this process, for state kept per
    server: (pid, host, port, path), or (pid, "sentinel", service); None for a
    Redis Cluster (no one server)."""
    # A RedisCluster has no connection_pool (one pool per node): None, and the
    # state is then kept per client instead of per server.
    pool = getattr(client, "connection_pool", None)
    service = getattr(pool, "service_name", None)
    if service is not None:
        # Found through Sentinel: no address in the pool; the service names it.
        return (os.getpid(), "sentinel", service)
    kwargs = getattr(pool, "connection_kwargs", None)
    if not isinstance(kwargs, dict):
        return None
    address = (kwargs.get("host"), kwargs.get("port"), kwargs.get("path"))
    return (os.getpid(), *address)


def _where(client: AsyncClient) -> str:
    """The server of ``client`` for messages: an address, never credentials."""
    server = server_of(client)
    if server is None:
        return "a Redis Cluster"
    if server[1] == "sentinel":
        return f"the master of Sentinel service {server[2]!r}"
    host, port, path = server[1:]
    return f"Redis server {path}" if path else f"Redis server {host}:{port}"
