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
import time
from collections.abc import AsyncIterator, Awaitable, Coroutine, Mapping
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, TypeVar

import redis

from . import metrics, reentry, tokens
from .calls import call_ids
from .clients import LoopClients
from .connection import masked_url
from .errors import (
    LeaseLost,
    LockError,
    LockTimeout,
    LockUsageError,
    NotReplicated,
    RedisUnavailable,
)
from .holder import holder_description
from .holding import attach_release_error, release_retrying, release_when_cancelled
from .lease import Lease, LockStatus
from .protocol import (
    NOT_HELD,
    PROTOCOL,
    AsyncClient,
    Grant,
    LockKeys,
    Protocol,
    RenewReply,
    check_client_encoding,
    client_options,
)
from .renewal import end_renewal, start_renewal
from .settings import LockOptions, LockSettings, check_name, check_namespace, shown_value
from .timeouts import cancelling, within
from .waiting import Hub, Waiter, WaitGroup, check_pool_size, hub_for

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger("redis_fifo_lock")

MAX_TOKEN_LENGTH = 128
WITHDRAW_GRACE_S = 0.25
"""Longest wait, in seconds, for a withdrawal's reply before ``acquire`` raises
(past its timeout, or on cancellation); the hub goes on withdrawing after that."""

T = TypeVar("T")


ATTEMPT_FLOOR_S = 0.5
"""Shortest time, in seconds, the script calls of one ``acquire`` are given,
counted from when it began, even when its ``timeout`` is shorter (so that
``timeout=0`` still tries once)."""


async def _within(
    awaitable: Awaitable[T], started: float, deadline: float | None, *, floor_s: float
) -> T:
    """Await ``awaitable``, a script call of the ``acquire`` that began at loop
    time ``started``, raising ``asyncio.TimeoutError`` at loop time ``deadline``
    (or ``floor_s`` seconds after ``started``, if that is later: the lock's
    ``_attempt_floor_s``). Past that, the call is not sent at all: a later call
    of an acquire gets no floor of its own, so that calls made again on a slow
    link never carry it past its timeout.

    A cancellation of the caller is never lost (see ``timeouts.within``).
    """
    if deadline is None:
        return await awaitable
    left_s = max(deadline, started + floor_s) - asyncio.get_running_loop().time()
    if left_s <= 0:
        if isinstance(awaitable, Coroutine):
            awaitable.close()
        raise asyncio.TimeoutError
    return await within(awaitable, left_s)


async def _answered(withdrawal: asyncio.Future[None]) -> bool:
    """Wait at most ``WITHDRAW_GRACE_S`` for the hub's ``withdrawal`` to be done
    with; whether it was (Redis confirmed it, or the hub gave it up, saying so)."""
    await asyncio.wait({withdrawal}, timeout=WITHDRAW_GRACE_S)
    return withdrawal.done() and not withdrawal.cancelled()


def check_timeout(timeout: object) -> float | None:
    """Return ``timeout`` (seconds) as a float, or None to wait forever.

    Raises:
        ValueError: for negative, NaN, bool or non-numeric timeouts, and for an
            int too large for a float (pass None to wait for ever).
    """
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise ValueError(f"timeout must be a number of seconds or None, got {shown_value(timeout)}")
    try:
        seconds = float(timeout)
    except OverflowError:
        raise ValueError(
            f"timeout {shown_value(timeout)} is too large a number of seconds; pass None "
            "to wait for ever"
        ) from None
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"timeout must be >= 0 seconds, got {timeout!r}")
    return seconds


def check_token(token: object) -> str:
    """``token`` as the plain ``str`` of its value if it can identify a
    request, else raise ``ValueError``. A ``str`` subclass (an Enum member,
    say) may print, hash and compare other than its value, which is what Redis
    holds and hands back."""
    if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_LENGTH:
        raise ValueError(
            f"token must be a non-empty str of at most {MAX_TOKEN_LENGTH} characters, "
            f"got {shown_value(token)}"
        )
    if any(ch.isspace() for ch in token):
        raise ValueError(f"token must not contain whitespace, got {shown_value(token)}")
    return token if type(token) is str else str.__str__(token)


def lock_settings(
    name: str,
    client: AsyncClient | LoopClients,
    settings: LockSettings | None,
    options: Mapping[str, object],
) -> LockSettings:
    """The settings of lock ``name`` on ``client``: ``settings`` (default
    ``LockSettings()``) with the keyword ``options`` applied (see ``LockSettings.merged``).

    Raises:
        TypeError: an option that is not a lock option, or ``settings`` that is
            not a ``LockSettings``.
        ValueError: naming the lock and the option, for a bad value, or for
            ``replicas`` on Redis Cluster.
    """
    if settings is not None and not isinstance(settings, LockSettings):
        raise TypeError(
            f"FIFO lock {name!r}: settings must be a LockSettings, got "
            f"{type(settings).__name__}; pass single options as keywords instead "
            "(lease_ms=..., poll_ms=...)"
        )
    if isinstance(client, redis.asyncio.RedisCluster):
        cluster: str | None = "a RedisCluster client"
    elif isinstance(client, LoopClients) and client.is_cluster:
        cluster = f"Redis Cluster {masked_url(client.url or '')}".rstrip()
    else:
        cluster = None
    try:
        return (settings or LockSettings()).merged((options, str), cluster=cluster)
    except ValueError as exc:
        raise ValueError(f"FIFO lock {name!r}: {exc}") from None


def check_text_options(name: str, client: AsyncClient | LoopClients) -> None:
    """Refuse, for lock ``name``, a client whose ``encoding`` and
    ``decode_responses`` cannot carry the lock's UTF-8 text (see
    ``protocol.check_client_encoding``); a ``LoopClients`` with a ``factory`` is
    not checked (its clients' options are not known before one is made).

    Raises:
        ValueError: naming the lock and the option.
    """
    options = client.options() if isinstance(client, LoopClients) else client_options(client)
    if options is not None:
        check_client_encoding(name, options)


def check_lease(name: str, lease: object) -> Lease:
    """``lease``, if it is a lease of lock ``name`` held by this process.

    Raises:
        LockUsageError: ``lease`` is no ``Lease``, another lock's (another
            name), or another process's (this one was forked while it was held).
    """
    if not isinstance(lease, Lease) or lease.name != name:
        raise LockUsageError(
            name,
            f"release() got {shown_value(lease)}, which is not a lease of this lock; "
            "release a lease with the lock (same name) that granted it",
        )
    lease.check_owner()
    return lease


class FifoLock:
    """A distributed FIFO mutex on one Redis server, for asyncio code.

    Args:
        redis_client: a ``redis.asyncio.Redis`` or
            ``redis.asyncio.cluster.RedisCluster``, used only on the event loop it
            belongs to; or a ``LoopClients``, from which each call takes the
            running loop's client, so the lock works on any loop. (For threads
            and sync code use ``SyncFifoLock``.) Each call waits for Redis at
            most the client's ``socket_timeout``, or on Python 3.11+ 5 s when
            it has none (``protocol.CALL_TIMEOUT_S``); ``socket_timeout=None``
            is faster on Python 3.11 (docs/performance.md).
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
        settings: all five at once (``LockSettings``), as the integrations
            pass them; the options above, when given too, override its values.
            Default None: ``LockSettings()``.
        namespace: put in front of every key and channel of the lock (str,
            default "": none): ``<namespace>:fifolock:{<name>}:<part>``, e.g. a
            tenant's key prefix for an ACL key pattern. Locks share a lock only
            with the same name and namespace. See ``check_namespace``.
        name_template: the template the name was filled in from (str, e.g.
            ``"customer-{customer_id}"``), recorded with the lock's OpenTelemetry
            metrics and spans (``redis_fifo_lock.metrics``) in place of the name;
            default None: ``"(untemplated)"`` for every lock, never the name.
        integration: what made the lock, recorded with the same: ``"core"``
            (default), ``"django"`` or ``"celery"``.

    Raises:
        ValueError: naming the setting, for a bad name, namespace, settings,
            ``name_template`` or ``integration``, ``replicas`` with a
            ``RedisCluster`` client, or a client whose pool allows fewer than
            the 5 connections a lock may use on one loop
            (``waiting.check_pool_size``).
        TypeError: when ``redis_client`` is a synchronous ``redis.Redis`` or
            ``redis.RedisCluster``, or anything else but a ``redis.asyncio``
            client or a ``LoopClients`` (a URL string among them: the message
            points to ``LockServer.server(url).clients()``), or
            ``name_template`` is neither a str nor None.

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
        settings: LockSettings | None = None,
        namespace: str = "",
        name_template: str | None = None,
        integration: str = "core",
        **options: Unpack[LockOptions],
    ) -> None:
        self.name = check_name(name)
        self.labels = metrics.lock_labels(name, name_template, integration)
        if isinstance(redis_client, (redis.Redis, redis.RedisCluster)):
            raise TypeError(
                f"FIFO lock {name!r} needs a redis.asyncio client, got a synchronous "
                f"{type(redis_client).__name__}; use SyncFifoLock from sync code"
            )
        if not isinstance(redis_client, (redis.asyncio.Redis, redis.asyncio.RedisCluster)) and (
            not isinstance(redis_client, LoopClients)
        ):
            raise TypeError(
                f"FIFO lock {name!r}: redis_client must be a redis.asyncio client or a "
                f"LoopClients, got {type(redis_client).__name__}; for a URL pass "
                "LockServer.server(url).clients(), the process's one LoopClients(url) for "
                "that server"
            )
        self.settings = lock_settings(name, redis_client, settings, options)
        check_text_options(name, redis_client)
        if not isinstance(redis_client, LoopClients):
            check_pool_size(f"FIFO lock {name!r}", redis_client)
        self.clients = redis_client if isinstance(redis_client, LoopClients) else None
        self._client = None if isinstance(redis_client, LoopClients) else redis_client
        self.keys = LockKeys(self.name, check_namespace(namespace))
        self._protocol: Protocol = PROTOCOL.acknowledged(
            self.settings.replicas, self.settings.ack_wait_ms
        )
        # One try of an acquire includes its wait for the replicas' acknowledgement.
        self._attempt_floor_s = ATTEMPT_FLOOR_S + (
            self.settings.ack_wait_ms / 1000 if self.settings.replicas else 0
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
        ``acquire``. Raises what ``acquire`` raises on entry, and on exit what
        ``release`` raises (``LeaseLost`` if the lease was lost while the block
        ran). A release that cannot reach Redis is tried again for about a
        second (``holding.RELEASE_RETRY_PAUSES_S``) before it gives up; each
        try waits at most ``holding.RELEASE_TRY_S`` for its reply, so a server
        that accepts connections but never answers keeps the caller about 5 s.
        A cancelled block waits for the release's first try only; the retries
        go on in the background (see ``holding.release_when_cancelled``).

        If the block raised, that exception propagates even when the release
        fails too: the release's exception is then attached to it as its
        ``fifolock_release_error`` attribute (and as a note on Python 3.11+).
        """
        lease = await self.acquire(timeout, token=token)
        try:
            with metrics.current(lease):
                yield lease
        except BaseException as error:
            release = self.release_owed(lease)
            try:
                if isinstance(error, asyncio.CancelledError):
                    await release_when_cancelled(self.name, lease, release)
                else:
                    await asyncio.shield(release)
            except Exception as failure:
                attach_release_error(error, failure, self.name)
            raise
        await asyncio.shield(self.release_owed(lease))

    def release_owed(self, lease: Lease) -> asyncio.Task[None]:
        """Release ``lease`` (``holding.release_retrying``) as a duty of the
        running loop's hub, and return its task, to be shielded: a cancelled
        caller must not leave the lease to expire, nor the loop's shutdown,
        which cancels the release's task, possibly before it ran (see
        ``Hub.duty``). Used by ``hold()`` and ``SyncFifoLock.release_retrying``."""
        return hub_for(self.client).duty(
            ("release", self.keys, lease.token), partial(release_retrying, self, lease)
        )

    async def acquire(self, timeout: float | None = None, *, token: str | None = None) -> Lease:
        """Wait for the lock, in arrival order, and return the ``Lease``.

        Args:
            timeout: seconds to wait (float); None waits forever, 0 tries once.
                It bounds the whole call, also when Redis stops answering or
                answers slowly: ``LockTimeout`` comes at most
                ``WITHDRAW_GRACE_S`` after the larger of ``timeout`` and
                ``ATTEMPT_FLOOR_S`` (plus ``ack_wait_ms`` with ``replicas``, so
                that one try waits for the acknowledgement).
            token: identity of this request (str without whitespace, at most
                128 characters). Retrying with the same token while the request
                is queued keeps its place, or returns the grant if it was already
                made. Default: a fresh random token.

        Raises:
            LockTimeout: (a ``TimeoutError``) when ``timeout`` ran out; the
                request was withdrawn (or, if Redis does not answer, will be as
                soon as it does) and no grant is left behind.
            RedisUnavailable: when Redis could not be reached to queue the
                request; or, with no ``timeout``, once its polls failed while
                ``lease_ms`` passed since the last answered one was sent (its
                place may be lost). The request is withdrawn as soon as Redis answers
                again, unless it is retried with the same ``token`` first.
            LockUsageError: ``token`` is already in use on this lock in this
                process (its request waits, or its lease is held, through any
                client, loop or settings), or names a request that already
                ended (a token names one request);
                or, with no ``timeout``, this task already holds the lock or
                waits for it (locks are not reentrant, and it would wait for
                itself for ever; see ``reentry``), before anything is sent.
            ValueError: for a bad ``timeout`` or ``token``.

        On cancellation the request is withdrawn (and a grant that landed
        meanwhile is handed on at once) before ``CancelledError`` propagates.

        The request records a description of the caller for onlookers
        (``LockStatus.holder``): host, process id, and what ``describing()``
        says of the running context.
        """
        wait_s = check_timeout(timeout)
        given = None if token is None else check_token(token)
        token = given or secrets.token_hex(16)
        use = tokens.take(self.keys, token)
        try:
            lease = await self._request(token, given, wait_s)
        except BaseException:
            use.end()
            raise
        use.granted(lease)
        return lease

    async def _request(self, token: str, given: str | None, wait_s: float | None) -> Lease:
        """``acquire``'s request of ``token`` (the caller's, ``given``, or a
        fresh one), waiting at most ``wait_s`` seconds (None: no bound)."""
        holder = holder_description()
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = None if wait_s is None else started + wait_s
        hub = hub_for(self.client)
        group = hub.group(self.keys, self.settings, self._protocol)
        waiter = group.join(token)
        waiter.holder = holder
        try:
            claim = reentry.claim(self.keys, holder, token=given, timeout=wait_s)
            try:
                with metrics.Waiting(self.labels, self.keys):
                    lease = await self._acquire(hub, group, waiter, started, deadline)
            except BaseException:
                claim.failed()
                raise
        finally:
            group.leave(token)
        claim.granted(lease)
        if cancelling():
            # Cancelled while the call that granted it was in flight, and the
            # cancellation was swallowed on the way (redis-py and asyncio.wait_for
            # can do that): the caller will not see this lease, so hand it on.
            with contextlib.suppress(LockError):
                await asyncio.shield(self.release(lease))
            raise asyncio.CancelledError
        return lease

    async def _acquire(
        self, hub: Hub, group: WaitGroup, waiter: Waiter, started: float, deadline: float | None
    ) -> Lease:
        lease = await self._enqueue(hub, group, waiter, started, deadline, requeue=False)
        if lease is not None:
            return lease
        if deadline is not None and asyncio.get_running_loop().time() >= deadline:
            withdrawn = await self._give_up(hub, group, waiter)
            raise self._timed_out(group, started, deadline, withdrawn=withdrawn)
        group.wait()
        while True:
            try:
                if cancelling():
                    # Cancelled while a call was on its way, and the cancellation
                    # lost there (redis-py can swallow one while it connects):
                    # waiting on would keep a closing loop waiting for this task.
                    raise asyncio.CancelledError
                hinted = await waiter.next_hint(deadline)
                if not hinted:
                    withdrawn = await self._give_up(hub, group, waiter)
                    raise self._timed_out(group, started, deadline, withdrawn=withdrawn)
                # Read before the withdrawal is awaited: a poll answered meanwhile
                # clears it, and the decision was made on what the group knew.
                out_of_reach = waiter.out_of_reach
                if deadline is None and out_of_reach is not None:
                    await self._give_up(hub, group, waiter)
                    raise self._out_of_reach(out_of_reach)
                lease = self._take_granted(hub, waiter) or await self._claim(
                    hub, group, waiter, started, deadline
                )
            except asyncio.CancelledError:
                # Cancelled before the grant (withdraw leaves the queue) or after it
                # (withdraw gives the grant back and hands it on): one call for both.
                await asyncio.shield(self._give_up(hub, group, waiter))
                raise
            if lease is not None:
                return lease

    async def _enqueue(
        self,
        hub: Hub,
        group: WaitGroup,
        waiter: Waiter,
        started: float,
        deadline: float | None,
        *,
        requeue: bool,
    ) -> Lease | None:
        """Run the acquire script: the lease if granted at once, else None with
        ``waiter.ticket`` set. On any failure whose outcome at Redis is unknown
        (no reply, cancelled, timed out) the request is withdrawn, now or as soon
        as Redis answers."""

        async def send() -> tuple[Grant | None, int, int, int]:
            if not requeue:
                hub.reclaim(self.keys, waiter.token)
                await hub.check_eviction_policy(self.name)
            return await group.enqueue(waiter)

        # A new call each time the request joins the queue, so that a late copy
        # of the call that lost its place cannot bring it back later.
        waiter.call = call_ids().start(self.keys)
        waiter.sending()  # the grant, if this call makes one, is younger than this
        try:
            try:
                grant, ticket, holder_fence, holder_pttl_ms = await _within(
                    send(), started, deadline, floor_s=self._attempt_floor_s
                )
            except BaseException:
                if not requeue:
                    hub.retry_ended(self.keys, waiter.token, answered=False)
                raise
            finally:
                call_ids().leave(self.keys, waiter.call)
            if not requeue:
                hub.retry_ended(self.keys, waiter.token, answered=True)
        except NotReplicated:
            # Granted, but a failover could lose the grant: give it back.
            await self._give_up(hub, group, waiter)
            raise
        except LockUsageError:
            raise
        except BaseException as exc:
            # The script may have run: withdraw what this call made, which also
            # keeps a copy of it still on its way from queueing it later.
            waiter.queued(None)
            if isinstance(exc, asyncio.CancelledError):
                await asyncio.shield(self._give_up(hub, group, waiter))
            else:
                hub.withdraw(group, waiter.token, 0, waiter.call)
            if isinstance(exc, asyncio.TimeoutError):
                raise self._timed_out(group, started, deadline, withdrawn=False) from None
            raise
        group.holder_fence = holder_fence or None
        group.holder_expires_at = (
            waiter.sent_at + holder_pttl_ms / 1000 if holder_pttl_ms > 0 else None
        )
        waiter.queued(ticket)
        if grant is not None:
            return self._lease_if_in_time(hub, waiter, grant, waiter.sent_at)
        return None

    def _take_granted(self, hub: Hub, waiter: Waiter) -> Lease | None:
        """The lease for a grant that a release of this process handed over in its
        reply, or a signed ring brought: no round trip, dated from when that
        release (or the waiter's acquire call) was sent, before Redis made the
        grant. None - then the waiter claims - when there is none, it is for
        another call or ticket, the dating leaves it too little slack, or
        ``replicas`` must confirm it."""
        granted, waiter.granted = waiter.granted, None
        if granted is None or self.settings.replicas:
            return None
        grant, dated = granted
        # Dated from before the grant, the lease looks shorter than it is by the
        # time since: take it only if that is under half a renewal interval, so
        # it has as much slack as any lease at its first renewal; else a claim
        # re-arms it in one round trip.
        waited = time.monotonic() - dated
        if (
            grant.ticket != waiter.ticket
            or grant.call != waiter.call
            or waited >= min(self.settings.renew_every_s, grant.pttl_ms / 1000) / 2
        ):
            return None
        return self._start_lease(hub, waiter, grant, dated)

    async def _claim(
        self, hub: Hub, group: WaitGroup, waiter: Waiter, started: float, deadline: float | None
    ) -> Lease | None:
        """A hint came: ask Redis whether the request holds the lock. Returns the
        lease, dated by when the claim was sent, or None to keep waiting (a stale
        or forged hint). A request that lost its place joins the queue again."""
        if waiter.ticket is None:
            return None  # its acquire has not replied: nothing to claim yet
        sent = time.monotonic()
        try:
            reply = await _within(
                group.claim(waiter.token, waiter.ticket),
                started,
                deadline,
                floor_s=self._attempt_floor_s,
            )
        except asyncio.TimeoutError:
            withdrawn = await self._give_up(hub, group, waiter)
            raise self._timed_out(group, started, deadline, withdrawn=withdrawn) from None
        except NotReplicated:
            await self._give_up(hub, group, waiter)
            raise
        except RedisUnavailable as exc:
            log.warning(
                "FIFO lock %r: could not claim a grant (%s); the next poll tries again",
                self.name,
                exc.reason,
            )
            return None
        if reply.grant is not None:
            return self._lease_if_in_time(hub, waiter, reply.grant, sent)
        if reply.queued_ticket is not None:
            waiter.queued(reply.queued_ticket)
            return None
        # Lost its place: its grant expired before this process claimed it, or
        # the process was presumed dead (no poll of it answered for a lease).
        log.warning(
            "FIFO lock %r: request %s (ticket %s) lost its place in the queue and "
            "joins it again at the back: its process could not claim its grant, or no poll "
            "of it reached Redis for lease_ms (counted from the last one that did, up to "
            "poll_ms before an outage began; event loop blocked, or Redis unreachable)",
            self.name,
            waiter.token,
            waiter.ticket,
        )
        return await self._enqueue(hub, group, waiter, started, deadline, requeue=True)

    def _give_up(self, hub: Hub, group: WaitGroup, waiter: Waiter) -> Awaitable[bool]:
        """Withdraw the request (its ticket, or by token if its acquire's fate is
        unknown): the hub has the withdrawal from the moment this returns (a
        cancellation of the awaitable, even before it ran, loses nothing; the
        hub keeps trying in the background, and before its loop closes).
        Awaiting the result waits for Redis's answer at most ``WITHDRAW_GRACE_S``,
        and says whether it came."""
        return _answered(hub.withdraw(group, waiter.token, waiter.ticket or 0, waiter.call))

    def _out_of_reach(self, failure: RedisUnavailable) -> RedisUnavailable:
        """The error for an acquire without a timeout whose process could not
        reach Redis for ``lease_ms`` while it waited (its polls failed with
        ``failure``): its place is lost, and an outage is no busy lock."""
        error = RedisUnavailable(
            self.name,
            f"Redis could not be reached while this request waited ({failure.reason}), and "
            f"lease_ms ({self.settings.lease_ms} ms) passed since it last kept this process's "
            "requests queued, so its place in the queue is lost; "
            "acquire again once Redis answers, or pass a timeout to wait through outages "
            "until it runs out",
            cause=failure.cause,
        )
        error.__cause__ = failure
        return error

    def _timed_out(
        self, group: WaitGroup, started: float, deadline: float | None, *, withdrawn: bool
    ) -> LockTimeout:
        """The error for an acquire, begun at loop time ``started``, that reached
        loop time ``deadline``; ``withdrawn``: what ``_answered`` said of its
        withdrawal."""
        waited = asyncio.get_running_loop().time() - started
        fate = (
            "the request was withdrawn"
            if withdrawn
            else "Redis has not confirmed the request's withdrawal yet; it is sent again "
            "until Redis does"
        )
        return LockTimeout(
            self.name,
            f"not acquired within {(deadline or started) - started:g} s (waited "
            f"{waited:.3f} s; holder fence {group.holder_fence}); {fate}",
            waited=waited,
            holder_fence=group.holder_fence,
        )

    def _lease_if_in_time(
        self, hub: Hub, waiter: Waiter, grant: Grant, sent: float
    ) -> Lease | None:
        """The lease for ``waiter``'s ``grant``, in a reply to a call sent at
        ``sent`` (``time.monotonic()``); None if the reply came after that lease
        ran out (a reply delayed on a slow link, or read late by a blocked event
        loop): the waiter is hinted, so that it asks Redis again, rather than
        enter holding nothing."""
        late_s = time.monotonic() - (sent + grant.pttl_ms / 1000)
        if late_s < 0:
            return self._start_lease(hub, waiter, grant, sent)
        log.warning(
            "FIFO lock %r: the reply granting request %s came %.3f s after the lease it "
            "granted ran out (a slow link, or a blocked event loop); asking Redis again",
            self.name,
            waiter.token,
            late_s,
        )
        waiter.hint()
        return None

    def _start_lease(self, hub: Hub, waiter: Waiter, grant: Grant, sent: float) -> Lease:
        """The lease for ``waiter``'s ``grant``, whose ``pttl_ms`` Redis reported in
        reply to a call sent at ``sent`` (``time.monotonic()``): it ends no later
        than that."""
        expires_at = sent + grant.pttl_ms / 1000
        lease = Lease(
            self.name, waiter.token, grant.fence, grant.ticket, expires_at, call=waiter.call
        )
        call_ids().hold(self.keys, lease)
        metrics.hold_started(self.labels, lease, grant.queued)
        first_at = sent + min(self.settings.renew_every_s, grant.pttl_ms / 2000)
        start_renewal(self, hub, lease, first_at)
        return lease

    async def _renew_once(self, hub: Hub, lease: Lease) -> RenewReply:
        """One renewal of ``lease`` (see ``redis_fifo_lock.renewal``), in ``hub``'s
        urgent lane: Redis's answer."""
        return await hub.run(
            hub.urgent,
            lambda client: self._protocol.renew(
                client, self.keys, lease.token, lease.fence, self.settings
            ),
        )

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
                hold was not assured. Also when that lease's release could not
                reach Redis (the ``RedisUnavailable`` is its ``__cause__``).
            RedisUnavailable: Redis could not be reached; the lease is kept (not
                renewed) and ``release`` can be retried.
            LockUsageError: ``lease`` belongs to another lock name, or to another
                process (this one was forked while it was held); nothing is
                changed in Redis then.

        When the lock went to a waiter of this process, ``release`` lets that
        waiter run before it returns, so a cancellation can reach it after the
        release is done: ``lease.released`` tells, and releasing again is a no-op.
        """
        check_lease(self.name, lease)
        lease.asked_to_release()
        if lease.released:
            return
        # Not awaited before the release is sent: a renewal cut off now never
        # reads its reply, and Redis refuses a renewal that runs after the
        # release, so it can neither revive the lease nor mark it lost.
        stopped = lease.begin_release()
        hub = hub_for(self.client)
        try:
            outcome, handed_over = await self._send_release(
                hub, lease.token, lease.fence, lease.call
            )
        except RedisUnavailable as exc:
            lease.release_failed()
            lost = lease.unreleased(exc)
            if lost is None:
                raise
            raise lost from exc
        except BaseException:
            lease.release_failed()
            raise
        lease.mark_released()
        tokens.released(self.keys, lease)
        call_ids().released(lease)
        metrics.hold_ended(lease, lost=outcome == NOT_HELD or lease.lost_reason is not None)
        hub.leases.pop((self.keys, lease.token), None)
        if stopped is not None and not stopped.done():
            await end_renewal(stopped)
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
        if lease.lost_while_held or lease.lost_reason is not None:
            raise lease.lost_error("it was released")
        if handed_over:
            # The next holder waits in this process, woken but not yet run: it
            # goes first, before this task goes on with its own work (its next
            # acquire, say), for until it runs the lock serves nobody.
            await asyncio.sleep(0)

    async def _send_release(self, hub: Hub, token: str, fence: int, call: str) -> tuple[int, bool]:
        """Run the release script for the grant (token, fence) made to acquire
        call ``call``, and hand the lock to the next holder if it waits in this
        process; returns (RELEASED, ALREADY_RELEASED or NOT_HELD; whether the
        lock was handed to a waiter of this process)."""
        session = hub.session_for(self.settings)

        async def send(client: AsyncClient) -> tuple[float, tuple[int, tuple[str, Grant] | None]]:
            sent = time.monotonic()  # once in the lane: a handed-over grant is dated from it
            return sent, await self._protocol.release(
                client,
                self.keys,
                token,
                fence,
                self.settings.keep_ms,
                call,
                session,
                call_ids().floor(self.keys),
            )

        with call_ids().in_flight(self.keys, call):
            sent, (outcome, handover) = await hub.run(hub.urgent, send)
        if handover is not None:
            # The next holder waits in this process: no ring was sent for it.
            hub.hand_over(self.keys, self.settings, self._protocol, handover, sent)
        return outcome, handover is not None

    async def _release_dropped(self, hub: Hub, token: str, fence: int, call: str) -> None:
        """Release the grant (token, fence) of a lease its holder dropped without
        releasing it (see ``renewal.Renewal``); a failure is logged, and the
        grant then expires with its lease."""
        try:
            await self._send_release(hub, token, fence, call)
        except (LockError, redis.RedisError) as exc:
            log.warning(
                "FIFO lock %r: could not release the dropped lease of fence %d (%s); it "
                "expires within lease_ms (%d)",
                self.name,
                fence,
                exc,
                self.settings.lease_ms,
            )

    async def status(self) -> LockStatus:
        """A snapshot of the lock: held or not, last fence, queue length.

        Raises:
            RedisUnavailable: when Redis could not be reached.
        """
        hub = hub_for(self.client)
        reply = await hub.run(hub.calls, lambda client: self._protocol.status(client, self.keys))
        grant = reply.grant
        return LockStatus(
            name=self.name,
            held=grant is not None,
            last_fence=reply.last_fence,
            waiting=reply.waiting,
            holder_fence=grant.fence if grant else None,
            holder_ticket=grant.ticket if grant else None,
            lease_left_ms=grant.pttl_ms if grant else None,
            holder=reply.description if grant else None,
            live_waiting=reply.live_waiting,
            known=reply.known,
        )

    async def force_release(self, fence: int | None = None) -> int | None:
        """Free the lock whoever holds it - for an operator breaking a stuck lock.

        The lock goes to the next live waiter at once, with a higher fence. The
        evicted holder is not told: its next renewal is refused, which sets its
        ``lease.lost``, and its ``release()`` raises ``LeaseLost``. Exclusion
        is broken for as long as the evicted holder goes on working: use it only
        on a holder that is stuck, or whose resource checks fences.

        Args:
            fence: evict only the grant with this fence (int), so that a lock
                that changed hands since you looked is left alone; None (default)
                evicts whoever holds it.

        Returns:
            the evicted grant's fence (int), or None when nothing was evicted
            (nobody held the lock, or its holder's fence is not ``fence``).

        Raises:
            RedisUnavailable: Redis could not be reached; nothing was changed,
                or the eviction may have happened (check with ``status()``).
            ValueError: ``fence`` is not a positive int.
        """
        if fence is not None and (
            isinstance(fence, bool) or not isinstance(fence, int) or fence < 1
        ):
            raise ValueError(
                f"FIFO lock {self.name!r}: fence must be a positive int, got {fence!r}"
            )
        hub = hub_for(self.client)
        async with hub.urgent:
            evicted, _, holder = await self._protocol.force_release(
                hub.client, self.keys, fence or 0, self.settings.keep_ms
            )
        if evicted is not None:
            log.warning(
                "FIFO lock %r: fence %d (held by %s) was forcibly released",
                self.name,
                evicted,
                holder or "an undescribed holder",
            )
        return evicted
