"""``FifoLock``: the asyncio FIFO mutex.

What it promises: at most one holder at a time while the holder's event loop
runs at least once per ``lease_ms`` and reaches Redis; grants in the order the
requests reached Redis; a dead holder replaced within ``lease_ms``; fences that
strictly increase per name while the server keeps its data; loud failure
(``LeaseLost``, ``lease.lost``) instead of silent overlap.

What it does not promise: exclusion across a pause (GC, SIGSTOP, VM freeze,
partition) longer than ``lease_ms`` - pass ``lease.fence`` to the resource so it
can refuse stale writers; anything across a Redis failover or restart that loses
writes (the fence counter included), unless ``replicas`` makes every grant and
renewal wait for replicas that a failover would promote; bounding a holder that
is alive but stuck, beyond ``max_hold_ms``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis

from .clients import LoopClients, at_loop_close
from .errors import LeaseLost, LockTimeout, LockUsageError, NotReplicated, RedisUnavailable
from .lease import Lease, LockStatus, Renewal
from .portal import is_portal_loop, portal
from .protocol import (
    GAVE_BACK,
    NOT_HELD,
    PROTOCOL,
    RENEWED,
    AsyncClient,
    Grant,
    LockKeys,
    Protocol,
)
from .settings import LockSettings, check_name, check_namespace
from .waiting import Hub, Waiter, WaitGroup, hub_for

log = logging.getLogger("redis_fifo_lock")

MAX_TOKEN_LENGTH = 128
RENEW_REPLY_FLOOR_S = 0.05
"""Shortest wait for a renewal's reply, in seconds, even when the lease is about
to end (at ``max_hold_ms`` Redis's answer says why)."""
RENEW_RETRY_S = 0.5
"""Pause before a renewal that could not reach Redis is tried again, in seconds."""


def check_timeout(timeout: object) -> float | None:
    """Return ``timeout`` (seconds) as a float, or None to wait forever.

    Raises:
        ValueError: for negative, NaN, bool or non-numeric timeouts.
    """
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise ValueError(f"timeout must be a number of seconds or None, got {timeout!r}")
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"timeout must be >= 0 seconds, got {timeout!r}")
    return float(timeout)


def check_token(token: object) -> str:
    """Return ``token`` if it can identify a request, else raise ``ValueError``."""
    if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_LENGTH:
        raise ValueError(
            f"token must be a non-empty str of at most {MAX_TOKEN_LENGTH} characters, got {token!r}"
        )
    if any(ch.isspace() for ch in token):
        raise ValueError(f"token must not contain whitespace, got {token!r}")
    return token


def lock_settings(name: str, client: AsyncClient | LoopClients, **settings: Any) -> LockSettings:
    """Validate the settings of lock ``name`` on ``client``.

    Raises:
        ValueError: naming the lock and the setting, for a bad value, or for
            ``replicas`` on Redis Cluster (``WAIT`` cannot follow the script on
            its connection there).
    """
    try:
        checked = LockSettings(**settings)
    except ValueError as exc:
        raise ValueError(f"FIFO lock {name!r}: {exc}") from None
    on_cluster = isinstance(client, redis.asyncio.RedisCluster) or (
        isinstance(client, LoopClients) and client.is_cluster
    )
    if checked.replicas and on_cluster:
        raise ValueError(
            f"FIFO lock {name!r}: replicas={checked.replicas} is not supported on Redis "
            "Cluster (WAIT cannot follow the script on its connection there); use replicas=0"
        )
    return checked


class FifoLock:
    """A distributed FIFO mutex on one Redis server, for asyncio code.

    Args:
        redis_client: a ``redis.asyncio.Redis`` or
            ``redis.asyncio.cluster.RedisCluster``, used only on the event loop it
            belongs to; or a ``LoopClients``, from which each call takes the
            running loop's client, so the lock works on any loop. (For threads
            and sync code use ``SyncFifoLock``.)
        name: the lock's name (str): every process that uses the same name on
            the same server shares the lock. Required; see ``check_name``.
        lease_ms: milliseconds a grant survives without renewal (default
            60_000). Bounds crash detection; the holder renews in the background
            every ``lease_ms / 3``. Must exceed the longest stretch your event
            loop can be blocked.
        poll_ms: milliseconds between a waiting process's polls (default
            30_000); latency only when a doorbell ring was lost. At most
            ``lease_ms / 2``.
        max_hold_ms: milliseconds one grant may be renewed in total (default
            1_800_000); afterwards renewal is refused and ``lease.lost`` is set.
        replicas: replicas (int) that must acknowledge each grant and renewal
            before it counts (default 0: none); for Sentinel set-ups, see
            ``LockSettings``. ``acquire`` then raises ``NotReplicated`` for a
            grant that is not acknowledged. Not for Redis Cluster.
        replica_wait_ms: milliseconds to wait for those acknowledgements
            (default None: a tenth of ``lease_ms``, at most 1000).
        namespace: put in front of every key and channel of the lock (str,
            default "": none): ``<namespace>:fifolock:{<name>}:<part>``, e.g. a
            tenant's key prefix for an ACL key pattern. Locks share a lock only
            with the same name and namespace. See ``check_namespace``.

    Raises:
        ValueError: naming the setting, for a bad name, namespace or settings, or
            ``replicas`` with a ``RedisCluster`` client.
        TypeError: when ``redis_client`` is a synchronous ``redis.Redis`` or
            ``redis.RedisCluster``.

    Instances are cheap and hold no ownership: they can be shared by many
    tasks, and made per call.

    A lease is renewed on the loop that acquired it. With a ``LoopClients``, a
    lease still held when that loop closes (an ``async_to_sync`` call that
    returned it) is handed over to the process's portal loop, which renews it
    until it is released; with a plain client it stops renewing then, and must
    be released within ``lease_ms``.
    """

    def __init__(
        self,
        redis_client: AsyncClient | LoopClients,
        name: str,
        *,
        lease_ms: int = 60_000,
        poll_ms: int = 30_000,
        max_hold_ms: int = 1_800_000,
        replicas: int = 0,
        replica_wait_ms: int | None = None,
        namespace: str = "",
    ) -> None:
        if isinstance(redis_client, (redis.Redis, redis.RedisCluster)):
            raise TypeError(
                f"FIFO lock {name!r} needs a redis.asyncio client, got a synchronous "
                f"{type(redis_client).__name__}; use SyncFifoLock from sync code"
            )
        self.name = check_name(name)
        self.settings = lock_settings(
            name,
            redis_client,
            lease_ms=lease_ms,
            poll_ms=poll_ms,
            max_hold_ms=max_hold_ms,
            replicas=replicas,
            replica_wait_ms=replica_wait_ms,
        )
        self.clients = redis_client if isinstance(redis_client, LoopClients) else None
        self._client = None if isinstance(redis_client, LoopClients) else redis_client
        self.keys = LockKeys(self.name, check_namespace(namespace))
        self._protocol: Protocol = PROTOCOL.acknowledged(
            self.settings.replicas, self.settings.ack_wait_ms
        )

    def __repr__(self) -> str:
        return f"<FifoLock {self.name!r} lease_ms={self.settings.lease_ms}>"

    @property
    def client(self) -> AsyncClient:
        """The Redis client this lock uses on the running event loop.

        Raises:
            RuntimeError: built from a ``LoopClients`` and no loop is running.
        """
        if self._client is not None:
            return self._client
        assert self.clients is not None
        return self.clients.client()

    @asynccontextmanager
    async def hold(
        self, timeout: float | None = None, *, token: str | None = None
    ) -> AsyncIterator[Lease]:
        """Acquire, run the block holding the lock, and always release.

        ``async with lock.hold(timeout=5) as lease: ...`` - arguments as for
        ``acquire``. Raises what ``acquire`` raises on entry and ``LeaseLost``
        on exit if the lease was lost while the block ran.
        """
        lease = await self.acquire(timeout, token=token)
        try:
            yield lease
        finally:
            # Shielded: a second cancellation must not leave the lease to expire.
            await asyncio.shield(self.release(lease))

    async def acquire(self, timeout: float | None = None, *, token: str | None = None) -> Lease:
        """Wait for the lock, in arrival order, and return the ``Lease``.

        Args:
            timeout: seconds to wait (float); None waits forever, 0 tries once.
            token: identity of this request (str without whitespace, at most
                128 characters). Retrying with the same token keeps the place in
                the queue, or returns the grant if it was already made. Default:
                a fresh random token.

        Raises:
            LockTimeout: (a ``TimeoutError``) when ``timeout`` ran out; the
                request was withdrawn and no grant is left behind.
            RedisUnavailable: when Redis could not be reached. The request may
                be queued: retry with the same ``token`` to keep its place.
            ValueError: for a bad ``timeout`` or ``token``.

        On cancellation the request is withdrawn (and a grant that landed
        meanwhile is handed on at once) before ``CancelledError`` propagates.
        """
        wait_s = check_timeout(timeout)
        token = secrets.token_hex(16) if token is None else check_token(token)
        loop = asyncio.get_running_loop()
        started = loop.time()
        hub = hub_for(self.client)
        await hub.check_eviction_policy(self.name)
        group = hub.group(self.keys, self.settings, self._protocol)
        waiter = group.join(token)
        try:
            grant, ticket, holder_fence = await self._enqueue(hub, group, token)
            if grant is None:
                group.holder_fence = holder_fence or None
                if wait_s == 0:
                    await asyncio.shield(self._withdraw(hub, token))
                    raise self._timed_out(group, started, wait_s)
                group.wait(waiter, ticket)
                grant = await self._wait(group, waiter, started, wait_s)
                if self.settings.replicas:
                    grant = await self._confirm(hub, token, grant)
        finally:
            group.leave(token)
        return self._start_lease(hub, token, grant)

    async def _enqueue(
        self, hub: Hub, group: WaitGroup, token: str
    ) -> tuple[Grant | None, int, int]:
        call = asyncio.ensure_future(group.enqueue(token))
        try:
            return await asyncio.shield(call)
        except asyncio.CancelledError:
            # Cancelled after the script was sent: its outcome is unknown until
            # the reply arrives. Wait for it, then withdraw, so the withdrawal
            # reaches Redis after the enqueue it undoes.
            await asyncio.shield(self._withdraw_after(hub, call, token))
            raise
        except NotReplicated:
            # Granted, but a failover could lose the grant: give it back.
            await asyncio.shield(self._withdraw(hub, token))
            raise

    async def _confirm(self, hub: Hub, token: str, grant: Grant) -> Grant:
        """Count a grant made by another script call (a release, a poll) only once
        ``replicas`` replicas have it: renew it with ``WAIT`` in one round trip.

        Raises:
            NotReplicated: the grant vanished or was not acknowledged in time;
                it was given back.
            RedisUnavailable: Redis could not be reached; it was given back if
                Redis could be reached for that.
        """
        try:
            async with hub.calls:
                outcome, pttl_ms = await self._protocol.renew(
                    hub.client, self.keys, token, grant.fence, self.settings.lease_ms
                )
        except BaseException:
            # Also on cancellation. In either order with the renewal, the
            # withdrawal wins: a renewal cannot bring a given-back grant back.
            await asyncio.shield(self._withdraw(hub, token))
            raise
        if outcome != RENEWED:
            raise NotReplicated(
                self.name,
                f"the grant of fence {grant.fence} was gone before {self.settings.replicas} "
                "replica(s) could confirm it (a failover lost it, or it expired unseen)",
                replicas=self.settings.replicas,
            )
        return Grant(grant.fence, grant.ticket, pttl_ms)

    async def _wait(
        self, group: WaitGroup, waiter: Waiter, started: float, wait_s: float | None
    ) -> Grant:
        loop = asyncio.get_running_loop()
        # The timeout is a timer that resolves the waiter's future with None, so
        # that this task awaits the future itself: a ring wakes it in one loop
        # iteration (asyncio.wait would take two), on the hand-off's critical path.
        timer = None if wait_s is None else loop.call_at(started + wait_s, waiter.give_up)
        try:
            grant = await waiter.future
        except asyncio.CancelledError:
            # Cancelled before the grant (withdraw leaves the queue) or after it
            # (withdraw gives the grant back and hands it on): one call for both.
            await asyncio.shield(self._withdraw(group.hub, waiter.token))
            raise
        finally:
            if timer is not None:
                timer.cancel()
        if grant is not None:
            return grant
        # Shielded like every withdrawal: an outer cancellation while it waits
        # for a call slot must not leave the request queued (it would be granted
        # to nobody and stall the lock).
        await asyncio.shield(self._withdraw(group.hub, waiter.token))
        raise self._timed_out(group, started, wait_s or 0.0)

    def _timed_out(self, group: WaitGroup, started: float, wait_s: float) -> LockTimeout:
        waited = asyncio.get_running_loop().time() - started
        return LockTimeout(
            self.name,
            f"not acquired within {wait_s:g} s (waited {waited:.3f} s; holder fence "
            f"{group.holder_fence}); the request was withdrawn",
            waited=waited,
            holder_fence=group.holder_fence,
        )

    async def _withdraw_after(
        self, hub: Hub, call: asyncio.Future[tuple[Grant | None, int, int]], token: str
    ) -> None:
        await asyncio.gather(call, return_exceptions=True)
        await self._withdraw(hub, token)

    async def _withdraw(self, hub: Hub, token: str) -> None:
        try:
            async with hub.calls:
                outcome = await self._protocol.withdraw(hub.client, self.keys, token)
        except RedisUnavailable as exc:
            log.warning(
                "FIFO lock %r: could not withdraw request %s (%s); it is skipped once "
                "this process stops polling",
                self.name,
                token,
                exc.cause,
            )
            return
        if outcome == GAVE_BACK:
            log.debug("FIFO lock %r: grant to %s landed while giving up", self.name, token)

    def _start_lease(self, hub: Hub, token: str, grant: Grant) -> Lease:
        lease = Lease(self.name, token, grant.fence, grant.ticket)
        loop = asyncio.get_running_loop()
        granted_at = loop.time()
        first_at = granted_at + min(self.settings.renew_every_s, grant.pttl_ms / 2000)
        lease._renewal = Renewal(
            loop, first_at, granted_at + grant.pttl_ms / 1000, lambda r: self._renew(hub, lease, r)
        )
        if self.clients is not None and not is_portal_loop(loop):
            _hand_over_at_close(loop, lease, self)
        return lease

    async def _hand_over(self, lease: Lease) -> None:
        """``lease``'s loop is closing: renew it on the portal loop from now on."""
        renewal = lease._renewal
        if renewal is None or renewal.stopped or lease.released or lease.lost:
            return
        running = renewal.cancel()
        if running is not None:
            await asyncio.gather(running, return_exceptions=True)
        portal().loop.call_soon_threadsafe(self._renew_on_portal, lease, renewal.expires_at)

    def _renew_on_portal(self, lease: Lease, expires_at: float) -> None:
        if lease.releasing or lease.lost:
            return
        hub = hub_for(self.client)
        loop = asyncio.get_running_loop()
        lease._renewal = Renewal(
            loop, loop.time(), expires_at, lambda r: self._renew(hub, lease, r)
        )

    async def _renew(self, hub: Hub, lease: Lease, renewal: Renewal) -> None:
        """Keep ``lease`` alive until released; mark it lost when Redis refuses.

        Started by the lease's ``Renewal`` timer when the first renewal is due;
        keeps ``renewal.expires_at`` (loop time) up to date.
        """
        loop = asyncio.get_running_loop()
        settings = self.settings
        interval = settings.renew_every_s
        next_at = renewal.first_at
        failure = "no reply"  # why the latest renewals failed, for the loss's reason
        while True:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            late = loop.time() - next_at
            if late > settings.lease_ms / 3000:
                log.warning(
                    "FIFO lock %r: lease renewal ran %.1f s late (lease_ms is %d); the "
                    "event loop was blocked - raise lease_ms or stop blocking the loop",
                    self.name,
                    late,
                    settings.lease_ms,
                )
            sent = loop.time()
            try:
                # Bounded by the lease's remaining life: a holder cut off from
                # Redis must learn it lost the lock when the lease expires, not
                # whenever the client's own timeouts give up.
                outcome, pttl_ms = await asyncio.wait_for(
                    self._renew_once(hub, lease),
                    max(RENEW_REPLY_FLOOR_S, renewal.expires_at - sent),
                )
            except (RedisUnavailable, asyncio.TimeoutError) as exc:
                # NotReplicated has no redis-py cause: its message says why.
                failure = str(getattr(exc, "cause", None) or getattr(exc, "message", failure))
                if loop.time() >= renewal.expires_at:
                    self._lose(lease, f"no renewal succeeded before the lease expired ({failure})")
                    return
                next_at = loop.time() + min(RENEW_RETRY_S, interval)
                continue
            if outcome != RENEWED:
                reason = (
                    f"max_hold_ms ({settings.max_hold_ms}) reached"
                    if outcome != 0
                    else "Redis refused the renewal: the lease expired or was taken"
                )
                self._lose(lease, reason)
                return
            renewal.expires_at = sent + pttl_ms / 1000
            next_at = sent + min(interval, pttl_ms / 2000)

    async def _renew_once(self, hub: Hub, lease: Lease) -> tuple[int, int]:
        async with hub.calls:
            return await self._protocol.renew(
                hub.client, self.keys, lease.token, lease.fence, self.settings.lease_ms
            )

    def _lose(self, lease: Lease, reason: str) -> None:
        if lease.releasing:
            # Released meanwhile: a renewal whose cancellation was swallowed
            # (Python 3.11's wait_for can do that, bpo-42130), or that ran on
            # another loop, is refused after the release, which says nothing
            # about the lease.
            return
        lease.mark_lost(reason)
        log.warning("FIFO lock %r: lease fence %d lost: %s", self.name, lease.fence, reason)

    async def release(self, lease: Lease) -> None:
        """Release ``lease`` and hand the lock to the next waiter.

        Releasing an already released lease is a no-op; so is Redis seeing the
        same release twice.

        Raises:
            LeaseLost: the lock was no longer held by this lease (it expired, was
                refused renewal, or was taken after its keys vanished); or the
                lease was marked lost while held (``lease.lost``: e.g. renewals
                unanswered, or not acknowledged by ``replicas``, until it could
                have expired) - then it is released, but exclusion during the
                hold was not assured.
            RedisUnavailable: Redis could not be reached; the lease is kept (not
                renewed) and ``release`` can be retried.
            LockUsageError: ``lease`` belongs to another lock name.
        """
        if not isinstance(lease, Lease) or lease.name != self.name:
            raise LockUsageError(
                self.name,
                f"release() got {lease!r}, which is not a lease of this lock; release a "
                "lease with the lock (same name) that granted it",
            )
        if lease.released:
            return
        lease.releasing = True
        renewal, stopped = lease._renewal, None
        if renewal is not None and renewal.loop is asyncio.get_running_loop():
            # Not awaited before the release is sent: a renewal cut off now never
            # reads its reply, and Redis refuses a renewal that runs after the
            # release, so it can neither revive the lease nor mark it lost.
            stopped = renewal.cancel()
        elif renewal is not None and not renewal.loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closed meanwhile: nothing runs there
                renewal.loop.call_soon_threadsafe(renewal.cancel)
        # else: the loop that acquired the lease is closed (as after an
        # async_to_sync call), and its renewal stopped with it.
        hub = hub_for(self.client)
        try:
            async with hub.calls:
                outcome = await self._protocol.release(
                    hub.client, self.keys, lease.token, lease.fence
                )
        except BaseException:
            lease.releasing = False
            raise
        lease.released = True
        if stopped is not None and not stopped.done():
            await asyncio.gather(stopped, return_exceptions=True)
        if outcome == NOT_HELD:
            reason = lease.lost_reason or "the lease expired or was taken before release"
            lease.mark_lost(reason)
            raise LeaseLost(
                self.name,
                f"lease fence {lease.fence} was no longer held at release ({reason}); "
                "the critical section may have overlapped with the next holder",
                fence=lease.fence,
                token=lease.token,
            )
        if lease.lost:
            raise LeaseLost(
                self.name,
                f"lease fence {lease.fence} was released, but it had been given up for lost "
                f"while held ({lease.lost_reason}); the critical section may have "
                "overlapped with another holder",
                fence=lease.fence,
                token=lease.token,
            )

    async def status(self) -> LockStatus:
        """A snapshot of the lock: held or not, last fence, queue length.

        Raises:
            RedisUnavailable: when Redis could not be reached.
        """
        hub = hub_for(self.client)
        async with hub.calls:
            reply = await self._protocol.status(hub.client, self.keys)
        grant = reply.grant
        return LockStatus(
            name=self.name,
            held=grant is not None,
            fence=reply.last_fence,
            waiting=reply.waiting,
            holder_fence=grant.fence if grant else None,
            holder_ticket=grant.ticket if grant else None,
            lease_left_ms=grant.pttl_ms if grant else None,
        )


_held_on: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, weakref.WeakKeyDictionary[Lease, FifoLock]
] = weakref.WeakKeyDictionary()
"""Per loop, the leases it renews that move to the portal when it closes."""


def _hand_over_at_close(loop: asyncio.AbstractEventLoop, lease: Lease, lock: FifoLock) -> None:
    leases = _held_on.get(loop)
    if leases is None:
        leases = _held_on[loop] = weakref.WeakKeyDictionary()
        at_loop_close(loop, lambda: _hand_over_all(loop))
    leases[lease] = lock


async def _hand_over_all(loop: asyncio.AbstractEventLoop) -> None:
    leases = _held_on.pop(loop, None)
    if leases is None:
        return
    await asyncio.gather(*(lock._hand_over(lease) for lease, lock in list(leases.items())))
