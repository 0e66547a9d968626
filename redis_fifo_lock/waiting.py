"""How a process waits: one wait group per lock, shared by all its waiters.

All waiters of one lock in one process (more exactly: on one client and event
loop) form a ``WaitGroup``. The group has one session id, whose liveness Redis
keeps in the lock's ``alive`` set; one poll per group refreshes it and asks
Redis for the grant, so 10,000 waiters cost one script call per ``poll_ms``, and
when the process dies all of its waiters are skipped together. Waiters learn of
their grant from the doorbell at once, or from the next poll at the latest.

The ``Hub`` holds the per-client state: the doorbell, the groups, a cap on
concurrent script calls (so waiters never cost a connection each) and the
eviction-policy check (``redis_fifo_lock.eviction``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import weakref
from dataclasses import dataclass, field

from redis.exceptions import RedisClusterException, RedisError

from .doorbell import Doorbell
from .errors import LockUsageError, RedisUnavailable
from .eviction import check_eviction_policy
from .protocol import AsyncClient, Grant, LockKeys, PollReply, Protocol
from .settings import LockSettings

log = logging.getLogger("redis_fifo_lock")

MAX_CONCURRENT_CALLS = 3
"""Script calls one hub runs at once: with the doorbell, at most 4 connections."""

RETRY_AFTER_ERROR_S = 0.5
"""Pause before a poll that failed to reach Redis is tried again, in seconds."""


@dataclass
class Waiter:
    """One local request waiting for its grant (``future``'s result; None when
    its timeout ran out first)."""

    token: str
    future: asyncio.Future[Grant | None]
    ticket: int | None = None

    def give_up(self) -> None:
        """The timeout ran out: resolve ``future`` with None unless a grant came first."""
        if not self.future.done():
            self.future.set_result(None)


@dataclass
class WaitGroup:
    """The waiters of one lock (one name and settings) in this process."""

    hub: Hub
    keys: LockKeys
    settings: LockSettings
    protocol: Protocol
    session: str = field(default_factory=lambda: secrets.token_hex(8))
    waiters: dict[str, Waiter] = field(default_factory=dict)
    holder_fence: int | None = None
    _poller: asyncio.Task[None] | None = None
    _wake: asyncio.Event = field(default_factory=asyncio.Event)

    def join(self, token: str) -> Waiter:
        """Register ``token`` before its acquire is sent, so no ring is missed.

        Raises:
            LockUsageError: ``token`` is already waiting in this process: one
                token must name one request at a time.
        """
        if token in self.waiters:
            raise LockUsageError(
                self.keys.name,
                f"token {token!r} is already waiting for this lock in this process; a "
                "token identifies one request: retry with it only after the first "
                "acquire returned or raised",
            )
        waiter = Waiter(token, asyncio.get_running_loop().create_future())
        self.waiters[token] = waiter
        return waiter

    def wait(self, waiter: Waiter, ticket: int) -> None:
        """``waiter`` is queued with ``ticket``: make sure the group polls."""
        waiter.ticket = ticket
        if self._poller is None:
            self._poller = asyncio.create_task(self._poll_loop())

    def leave(self, token: str) -> None:
        """Forget ``token``; an idle group leaves the hub at once."""
        self.waiters.pop(token, None)
        if not self.waiters:
            if self._poller is None:
                self.hub.discard(self)
            else:
                self._wake.set()

    def ring(self, token: str, grant: Grant) -> None:
        """A grant was rung on the doorbell (or seen by a poll)."""
        waiter = self.waiters.get(token)
        if waiter is not None and not waiter.future.done():
            waiter.future.set_result(grant)

    async def enqueue(self, token: str) -> tuple[Grant | None, int, int]:
        """Run the acquire script for ``token``: (grant or None, ticket, holder fence)."""
        settings = self.settings
        async with self.hub.calls:
            return await self.protocol.acquire(
                self.hub.client,
                self.keys,
                token,
                self.session,
                settings.lease_ms,
                settings.max_hold_ms,
                settings.lease_ms,
            )

    async def _poll_loop(self) -> None:
        watching = await self._watch()
        delay = 0.0
        try:
            while True:
                if not self.waiters:
                    # Checked and closed with no await in between: a waiter that
                    # joins from now on gets a new group from the hub.
                    self._poller = None
                    self.hub.discard(self)
                    return
                if delay > 0:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), delay)
                    if not self.waiters:
                        # Woken because the last waiter left (granted or gone):
                        # close without one more, useless, poll.
                        continue
                self._wake.clear()
                delay = await self._poll_once()
        finally:
            self._poller = None
            if watching:
                await self.hub.doorbell.unwatch(self.keys.doorbell_of(self.session), self.ring)

    async def _watch(self) -> bool:
        channel = self.keys.doorbell_of(self.session)
        try:
            # Half a lease at most: the first poll waits for this, and must still
            # come before a grant made meanwhile could expire.
            # False: the client has no pub/sub (the doorbell warned once).
            return await asyncio.wait_for(
                self.hub.doorbell.watch(channel, self.ring), self.settings.lease_ms / 2000
            )
        except (RedisError, RedisClusterException, OSError, asyncio.TimeoutError) as exc:
            log.warning(
                "FIFO lock %r: doorbell unavailable (%s); waiters rely on polling every %d ms",
                self.keys.name,
                repr(exc),
                self.settings.poll_ms,
            )
            await self.hub.doorbell.unwatch(channel, self.ring)
            return False

    async def _poll_once(self) -> float:
        """One poll; returns seconds until the next one."""
        alive_ms = self.settings.lease_ms
        try:
            async with self.hub.calls:
                reply = await self.protocol.poll(self.hub.client, self.keys, self.session, alive_ms)
        except RedisUnavailable as exc:
            log.warning("FIFO lock %r: poll failed, retrying: %s", self.keys.name, exc.cause)
            # Never longer than a poll interval: the session's liveness (one
            # lease) must be refreshed before it runs out.
            return min(RETRY_AFTER_ERROR_S, self.settings.poll_ms / 1000)
        await self._settle(reply)
        poll_s = self.settings.poll_ms / 1000
        if reply.grant is not None and reply.grant.pttl_ms > 0:
            # Poll again right after the current lease would expire, so a dead
            # holder is replaced within lease_ms, not lease_ms + poll_ms.
            return min(poll_s, reply.grant.pttl_ms / 1000 + 0.002)
        return poll_s

    async def _settle(self, reply: PollReply) -> None:
        self.holder_fence = reply.grant.fence if reply.grant else None
        if reply.holder is not None and reply.grant is not None:
            self.ring(reply.holder, reply.grant)
        for waiter in list(self.waiters.values()):
            if waiter.future.done() or waiter.ticket is None or waiter.token == reply.holder:
                continue
            if reply.head_ticket is None or waiter.ticket < reply.head_ticket:
                await self._requeue(waiter)

    async def _requeue(self, waiter: Waiter) -> None:
        # Lost its place: its grant expired before this process saw it, or the
        # process was presumed dead (it could not poll for a whole lease).
        log.warning(
            "FIFO lock %r: request %s (ticket %s) lost its place in the queue and "
            "joins it again at the back: its process could not poll for a whole lease "
            "(event loop blocked, or Redis unreachable, for that long)",
            self.keys.name,
            waiter.token,
            waiter.ticket,
        )
        try:
            grant, ticket, _ = await self.enqueue(waiter.token)
        except RedisUnavailable:
            return
        waiter.ticket = ticket
        if grant is not None:
            self.ring(waiter.token, grant)


class Hub:
    """Per-client (and so per event loop and process) state shared by all locks.

    Holds its client weakly: the hub is stored in a WeakKeyDictionary keyed by
    the client, and a strong reference back would keep every client (and its
    event loop) alive forever, one per ``asyncio.run`` or ``async_to_sync``.
    """

    def __init__(self, client: AsyncClient) -> None:
        self._client = weakref.ref(client)
        self.loop = asyncio.get_running_loop()
        self.doorbell = Doorbell(self._client)
        self.calls = asyncio.Semaphore(MAX_CONCURRENT_CALLS)
        self.groups: dict[tuple[LockKeys, LockSettings], WaitGroup] = {}

    @property
    def client(self) -> AsyncClient:
        """The client; it is alive while any lock or lease that uses it is."""
        client = self._client()
        if client is None:
            raise RuntimeError("the Redis client of this hub was garbage-collected")
        return client

    def group(self, keys: LockKeys, settings: LockSettings, protocol: Protocol) -> WaitGroup:
        """The wait group of this lock, created on first use."""
        group = self.groups.get((keys, settings))
        if group is None or group.protocol is not protocol:
            group = WaitGroup(self, keys, settings, protocol)
            self.groups[(keys, settings)] = group
        return group

    def discard(self, group: WaitGroup) -> None:
        """Forget ``group`` if it is still the current one for its lock."""
        if self.groups.get((group.keys, group.settings)) is group:
            del self.groups[(group.keys, group.settings)]

    async def check_eviction_policy(self, name: str) -> None:
        """Warn (naming lock ``name``) if the server may evict keys: see
        ``redis_fifo_lock.eviction.check_eviction_policy``."""
        await check_eviction_policy(self.client, name, self.calls)


_hubs: weakref.WeakKeyDictionary[AsyncClient, Hub] = weakref.WeakKeyDictionary()


def hub_for(client: AsyncClient) -> Hub:
    """The hub of ``client`` on the running event loop."""
    hub = _hubs.get(client)
    if hub is None or hub.loop is not asyncio.get_running_loop():
        hub = _hubs[client] = Hub(client)
    return hub
