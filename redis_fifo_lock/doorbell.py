"""The doorbell: one pub/sub subscription per client, shared by all its waiters.

Every grant made by a script is published as ``"<token> <fence> <ticket>
<pttl_ms> <call> <queued> <proof>"`` (the proof signs the rest with a secret of
the acquire call, see ``grant_next`` in lib.lua) on the doorbell channel of the
session that waits for it,
``fifolock:{<name>}:doorbell:<session>``, so a grant wakes only the process it
is for, however many processes wait. A process subscribes to the channel of each
of its wait groups and routes each ring to that group's waiters. The doorbell is
only an optimisation: a lost ring costs latency, never correctness, because
every waiting process also polls (see ``waiting.py``).

When the subscription's connection breaks, redis-py reconnects it (and
subscribes again) before raising the error if the server is still there; the
doorbell then reads on. If not, the doorbell builds a new pub/sub from the
client and subscribes it to every watched channel again, every
``RECONNECT_DELAY_S`` until that works. Rebuilding (rather than letting the
broken pub/sub reconnect to its own address) matters on Redis Cluster: a
``ClusterPubSub`` stays bound to the node it first connected to, which may
never come back after a failover. A new one goes to the node the client's slot
map names for the first channel, and if that fails (the map may still name the
dead node), to each other node the client knows: with classic pub/sub any node
hears every ring.

A ``SUBSCRIBE`` refused by the server (an ACL without ``+subscribe`` or without
the lock's channel pattern) fails that channel's ``watch`` at once with the
server's error; the wait group then reports it (``report_refusal``: one
WARNING per server and rule in the process) and its waiters poll. A ring the
server refuses to a script fails nothing (the script rings with
``redis.pcall``), so ``check_ringing`` tries a ``PUBLISH`` of its own once per
server, user and namespace, and reports an error reply the same way.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable

import redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import (
    NoPermissionError,
    RedisClusterException,
    RedisError,
    ResponseError,
)

from . import native
from .acl import RULES_HINT, refusal
from .errors import ClientDropped
from .eviction import server_of
from .protocol import AsyncClient, Grant, LockKeys, as_text, lost_in_transport
from .timeouts import cancelling, within

log = logging.getLogger(__name__)

Ring = Callable[[str, Grant], None]
"""Called with (token, grant) for every grant rung on a channel."""

RECONNECT_DELAY_S = 0.5
"""Pause, in seconds, before a broken subscription is rebuilt (and between tries)."""

RESUBSCRIBE_TIMEOUT_S = 2.0
"""Longest wait, in seconds, for a rebuilt subscription to one node to be sent."""

LINGER_S = 2.0
"""How long, in seconds, a channel nobody watches any more stays subscribed (and
the connection open): the next wait on it (one waiter per process taking a lock
again and again, as Celery prefork workers do) finds it confirmed, with no new
connection and no ``SUBSCRIBE``."""

MAX_LINGERING = 32
"""Most channels one doorbell keeps subscribed with nobody watching them; the
longest-lingering is unsubscribed beyond that."""

PROBE_TIMEOUT_S = 0.5
"""How long, in seconds, the probe that a wait reusing a lingering channel sends
on the subscription's connection may go unanswered. A kept connection may have
died silently (a NAT or middlebox that dropped the flow, with no error on
either side), and rings sent on it are lost: past this bound the groups of
every watched channel poll at once and the subscription is rebuilt on a new
connection. The probe is a ``SUBSCRIBE`` of the channel again, which the lock's
user may send (a ``PING`` would need ``+ping``): Redis confirms it in order
after every ring it published before, so its confirmation proves those were
delivered."""

CONFIRM_TIMEOUT_S = 2.0
"""How long, in seconds, a new channel's ``SUBSCRIBE`` on the subscription's
connection may go unconfirmed while nothing at all is read from that
connection; then the connection is taken for dead, as for an unanswered
probe (``PROBE_TIMEOUT_S``). A reconnection that redis-py began inside the
reader, on a client with no ``socket_timeout``, waits for ever for a
handshake reply that was lost: rings would reach no waiter of this process
until its polls."""

IDLE_PROBE_S = 5.0
"""How long, in seconds, the subscription's connection may go with nothing
read from it while a channel is watched; then it is probed, and rebuilt if
the probe goes unanswered for ``IDLE_PROBE_TIMEOUT_S``. A wait on a channel
the process already watches sends nothing that would find the connection
dead: it may have died silently, or redis-py's reconnection inside the reader
may wait for ever for a lost handshake reply (a client with no
``socket_timeout``), and rings would reach no waiter until its polls. At most
one probe per ``IDLE_PROBE_S`` per doorbell, and none while rings or
confirmations are read."""

BLOCKING_READ_UNBOUNDED = redis.VERSION[0] >= 8
"""Whether redis-py reads a pub/sub message with ``get_message(timeout=None)``
for as long as it takes. Before redis-py 8 that read takes the client's
``socket_timeout`` as its bound, and at its end raises ``TimeoutError`` and
drops the connection: a quiet subscription was rebuilt (a new connection, a
``SUBSCRIBE`` and a poll) every ``socket_timeout`` (see ``read_slice_s``)."""

READ_SLICE_S = 5.0
"""How long, in seconds, one read of the subscription waits for a message,
where ``BLOCKING_READ_UNBOUNDED`` is false and the client has a
``socket_timeout``; the reader then reads again."""

IDLE_PROBE_TIMEOUT_S = 2.0
"""How long, in seconds, the probe of a quiet subscription (``IDLE_PROBE_S``)
may go unanswered. Longer than ``PROBE_TIMEOUT_S``, as no wait is starting
on it: a slow link, or an event loop kept busy for half a second, must not
have the subscription rebuilt, and every watched group poll, after each
quiet period."""

FAILURES = (RedisError, RedisClusterException, OSError)
"""What a pub/sub call raises when Redis (or a cluster node) cannot be reached.
``RedisClusterException`` (e.g. ``SlotNotCoveredError``) is not a ``RedisError``."""

PUBSUB_FAILURES: tuple[type[Exception], ...] = (*FAILURES, RuntimeError, AttributeError)
"""What a call on the subscription's connection raises when that connection
breaks: ``FAILURES``, and what redis-py raises instead when the reader's
``get_message`` and a ``SUBSCRIBE`` (a probe, a new channel) or ``UNSUBSCRIBE``
meet on a connection it is reconnecting - ``RuntimeError`` ("read() called while
another coroutine is already waiting for incoming data", both reading the
handshake) or ``AttributeError`` (the connection's writer gone under the other
call). Seen with redis-py 8 and the subscription's connection killed every few
ms; uncaught, it ended the wait group's poller, and its waiter hung."""

_warned_no_pubsub: set[type] = set()
"""Client classes already warned about having no asyncio pub/sub, in this process."""

_refusals_reported: set[tuple[object, str]] = set()
"""(server, what to add) pairs already reported at WARNING, in this process."""
_refusals_guard = native.lock()

_ringing_checked: set[tuple[object, ...]] = set()
"""(server, user, namespace) whose permission to ring the doorbell this process
has checked, or is checking (``check_ringing``): a handful, one per server and
lock user."""

UNWATCHED_SESSION = "check"
"""A session no waiter has (sessions are hex digits and a dot): the channel of
``check_ringing``'s empty PUBLISH, which nobody hears."""


def _after_fork_in_child() -> None:
    # A thread of the parent may have held the guard at the moment of the fork,
    # and that thread does not exist here to release it.
    global _refusals_guard
    _refusals_guard = native.lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Doorbell:
    """Subscriptions of one client: ``watch``/``unwatch`` channels, rings routed
    to one callback per channel. Holds one connection while anything is watched,
    and a channel's subscription ``LINGER_S`` seconds past its last watch (at
    most ``MAX_LINGERING`` such channels), so that waits one after another
    reuse it.
    """

    def __init__(
        self,
        client: Callable[[], AsyncClient | None],
        owner: Callable[[str], Ring | None] | None = None,
        resubscribed: Callable[[str], None] | None = None,
    ) -> None:
        self._client = client  # a weak reference, as the hub holds it
        # Who a ring on a lingering channel goes to (its lock's current wait
        # group, which may not watch it yet): None for nobody.
        self._owner = owner
        # Told of each channel subscribed again (after a reconnection, or a
        # rebuilt subscription): rings published meanwhile were lost.
        self._resubscribed = resubscribed
        self._handlers: dict[str, Ring] = {}
        # Per channel: done with None once Redis confirmed the subscription, or
        # with the error it refused it with (a result, not an exception, so that
        # an unawaited refusal is not logged as never retrieved).
        self._confirmed: dict[str, asyncio.Future[ResponseError | None]] = {}
        # (command, channel) of each SUBSCRIBE / UNSUBSCRIBE sent and not yet
        # answered, in sending order: Redis answers in that order, and an error
        # reply (an ACL refusal) does not name its channel.
        self._unanswered: deque[tuple[str, str]] = deque()
        self._pubsub: PubSub | None = None
        self._reader: asyncio.Task[None] | None = None
        self._change = asyncio.Lock()
        # Channels still subscribed (and confirmed) that nobody watches, with
        # the loop time their last watch ended, oldest first (see LINGER_S).
        self._lingering: dict[str, float] = {}
        # Per channel: when (time.monotonic()) Redis's latest confirmation of its
        # subscription was read, if the connection has not failed since.
        self._steady: dict[str, float] = {}
        self._sweep_timer: asyncio.TimerHandle | None = None
        self._sweeper: asyncio.Task[None] | None = None
        # The unanswered probe on the connection (its channel, and the timer
        # that takes the connection for dead), see PROBE_TIMEOUT_S.
        self._probe: tuple[str, asyncio.TimerHandle] | None = None
        self._replacer: asyncio.Task[None] | None = None
        # When (loop time) the reader last read anything from the connection.
        self._last_read = float("-inf")
        # Checks, while anything is watched, that the connection did not go
        # quiet for IDLE_PROBE_S (the timer, then the task probing it).
        self._idle_timer: asyncio.TimerHandle | None = None
        self._idle_prober: asyncio.Task[None] | None = None

    async def watch(self, channel: str, ring: Ring) -> bool:
        """Subscribe to ``channel`` and return True once Redis confirmed it, so that
        no grant published after this returns can be missed.

        Returns False at once, subscribing nothing, when the client has no
        asyncio pub/sub at all (``redis.asyncio.RedisCluster`` before redis-py
        8.0): its waiters rely on polling. A warning says so once per process.

        Raises:
            redis.exceptions.ResponseError: the server refused the subscription
                (e.g. ``NoPermissionError``: its ACL); the caller reports it
                (``report_refusal``), falls back to polling and calls ``unwatch``.
            redis.exceptions.RedisError, redis.exceptions.RedisClusterException,
            OSError: when the subscription fails; the caller falls back to polling
                and calls ``unwatch``.
        """
        async with self._change:
            if self._pubsub is None:
                factories = self._factories()
                if not factories:
                    return False
                self._pubsub = factories[0]()
            self._handlers[channel] = ring
            self._check_idle_later()
            confirmed = self._confirmed.get(channel)
            if self._lingering.pop(channel, None) is not None and _subscribed(confirmed):
                # Still subscribed since its last watch: nothing to subscribe,
                # but the kept connection must prove it still delivers.
                await self._send_probe(channel)
                return True
            if confirmed is None or (confirmed.done() and confirmed.result() is not None):
                confirmed = self._confirmed[channel] = asyncio.get_running_loop().create_future()
            # Before sending: the reply may be read while the send still awaits.
            self._unanswered.append(("subscribe", channel))
            try:
                sent = await self._sent(self._pubsub.subscribe(_wire(channel)), CONFIRM_TIMEOUT_S)
            except BaseException as exc:
                _forget(self._unanswered, ("subscribe", channel))
                if isinstance(exc, PUBSUB_FAILURES) and not isinstance(exc, FAILURES):
                    raise redis.ConnectionError(
                        f"the subscription's connection broke under the SUBSCRIBE ({exc!r})"
                    ) from exc
                raise
            if not sent:
                # The rebuilt subscription subscribes this channel too.
                _forget(self._unanswered, ("subscribe", channel))
                self._rebuild(self._pubsub, "a SUBSCRIBE (not sent)", CONFIRM_TIMEOUT_S)
            self._track(self._pubsub)
            if self._reader is None or self._reader.done():
                self._reader = asyncio.create_task(self._read())
            pubsub, sent_at = self._pubsub, asyncio.get_running_loop().time()
        # Shielded: the future is shared by every watch of the channel, and the
        # caller's timeout must not cancel it for the others.
        try:
            refused = await within(asyncio.shield(confirmed), CONFIRM_TIMEOUT_S)
        except asyncio.TimeoutError:
            if self._last_read < sent_at:
                self._rebuild(pubsub, "a SUBSCRIBE", CONFIRM_TIMEOUT_S)
            refused = await asyncio.shield(confirmed)
        if refused is not None:
            raise refused
        return True

    async def unwatch(self, channel: str, ring: Ring) -> None:
        """Stop routing ``channel`` to ``ring``; drop the connection when nothing is
        watched. Does nothing if the channel was watched again by another ring."""
        async with self._change:
            if self._handlers.get(channel) != ring:
                return
            del self._handlers[channel]
            if self._pubsub is not None and _subscribed(self._confirmed.get(channel)):
                # Kept a while for the next wait on it (LINGER_S).
                self._lingering[channel] = asyncio.get_running_loop().time()
                while len(self._lingering) > MAX_LINGERING:
                    await self._unsubscribe(next(iter(self._lingering)))
                self._sweep_later()
                return
            self._confirmed.pop(channel, None)
            self._steady.pop(channel, None)
            if self._pubsub is None:
                return
            if self._handlers or self._lingering:
                await self._unsubscribe(channel)
                return
            pubsub, reader = self._drop()
        if pubsub is not None:
            await _stop(reader, pubsub)

    async def _unsubscribe(self, channel: str) -> None:
        """Unsubscribe from ``channel``, which nobody watches (under ``_change``,
        with a pub/sub in place); a failure is left to the reader to notice."""
        self._lingering.pop(channel, None)
        self._confirmed.pop(channel, None)
        self._steady.pop(channel, None)
        pubsub = self._pubsub
        if pubsub is None:
            return
        self._unanswered.append(("unsubscribe", channel))
        try:
            sent = await self._sent(pubsub.unsubscribe(_wire(channel)), RESUBSCRIBE_TIMEOUT_S)
        except PUBSUB_FAILURES:
            _forget(self._unanswered, ("unsubscribe", channel))
            log.debug("doorbell: unsubscribe from %s failed", channel, exc_info=True)
            return
        if not sent:
            _forget(self._unanswered, ("unsubscribe", channel))
            self._rebuild(pubsub, "an UNSUBSCRIBE (not sent)", RESUBSCRIBE_TIMEOUT_S)

    async def _sent(self, command: Awaitable[object], timeout_s: float) -> bool:
        """Await ``command``, a SUBSCRIBE or UNSUBSCRIBE on the subscription, for
        at most ``timeout_s`` seconds; False if that ran out. It was then not
        even sent: redis-py reconnects a broken connection inside the call, and
        bounds that handshake by ``socket_timeout`` alone (for ever with none,
        while the caller holds ``_change`` and so every other watch up).

        Raises:
            whatever ``command`` raises.
        """
        try:
            await within(command, timeout_s)
        except asyncio.TimeoutError:
            return False
        return True

    async def _send_probe(self, channel: str, answer_s: float = PROBE_TIMEOUT_S) -> bool:
        """Subscribe to ``channel`` again (under ``_change``; it is subscribed and
        confirmed) unless a probe is on its way already, and take the connection
        for dead if no confirmation comes within ``answer_s`` seconds, also when
        the probe could not be sent by then; a probe on its way is given no
        longer than that from now. If sending fails, ``channel`` is no longer
        steady (its group polls at once) and this returns False."""
        pubsub = self._pubsub
        loop = asyncio.get_running_loop()
        if self._probe is not None:
            probed, pending = self._probe
            if pending.when() > loop.time() + answer_s:
                pending.cancel()
                self._probe = (probed, loop.call_later(answer_s, self._probe_unanswered, answer_s))
            return True
        if pubsub is None:
            return True
        timer = loop.call_later(answer_s, self._probe_unanswered, answer_s)
        self._probe = (channel, timer)
        self._unanswered.append(("subscribe", channel))
        try:
            if not await self._sent(pubsub.subscribe(_wire(channel)), answer_s):
                # Not sent: the probe's timer rebuilds the subscription.
                _forget(self._unanswered, ("subscribe", channel))
        except PUBSUB_FAILURES:
            _forget(self._unanswered, ("subscribe", channel))
            self._end_probe()
            self._steady.pop(channel, None)
            log.debug("doorbell: the probe of the subscription failed", exc_info=True)
            return False
        return True

    def _check_idle_later(self, since: float | None = None) -> None:
        """Make sure the connection is checked for going quiet while anything is
        watched: ``IDLE_PROBE_S`` after ``since`` (loop time; default now)."""
        if self._idle_timer is None and self._handlers:
            loop = asyncio.get_running_loop()
            due = (loop.time() if since is None else since) + IDLE_PROBE_S
            self._idle_timer = loop.call_at(due, self._idle_due)

    def _idle_due(self) -> None:
        self._idle_timer = None
        if not self._handlers or self._pubsub is None:
            return
        if asyncio.get_running_loop().time() - self._last_read < IDLE_PROBE_S:
            self._check_idle_later(self._last_read)
            return
        if self._idle_prober is None or self._idle_prober.done():
            self._idle_prober = asyncio.get_running_loop().create_task(self._probe_idle())

    async def _probe_idle(self) -> None:
        """Probe the subscription, which read nothing for ``IDLE_PROBE_S`` while
        channels are watched; a probe that cannot be sent takes the connection
        for dead at once. Then check again ``IDLE_PROBE_S`` later."""
        async with self._change:
            pubsub = self._pubsub
            watched = [c for c in self._handlers if _subscribed(self._confirmed.get(c))]
            if (
                pubsub is not None
                and watched
                and not await self._send_probe(watched[0], IDLE_PROBE_TIMEOUT_S)
            ):
                self._rebuild(pubsub, "anything (and a probe could not be sent)", IDLE_PROBE_S)
            self._check_idle_later()

    def _track(self, pubsub: PubSub) -> None:
        """Be told (``_reconnected``) each time redis-py connects ``pubsub``'s
        connection again; registering twice is a no-op."""
        connection = getattr(pubsub, "connection", None)
        if connection is None:
            return
        # redis-py 5.0.1 names it with a leading underscore (public from 5.0.2).
        register = (
            getattr(connection, "register_connect_callback", None)
            or connection._register_connect_callback
        )
        register(self._reconnected)

    def _reconnected(self, connection: object) -> None:
        """redis-py connected the subscription's connection again, and is
        subscribing its channels again, with no word to the reader when it did
        so on a read (a client with retries): rings published in the gap may be
        lost. A probe on its way is answered never, or by a confirmation that
        is the resubscription's: it ends here, so that each channel's
        confirmation makes its group catch up (``_again``)."""
        self._end_probe()
        self._steady.clear()

    def _end_probe(self) -> None:
        if self._probe is not None:
            self._probe[1].cancel()
            self._probe = None

    def _probe_unanswered(self, waited_s: float) -> None:
        """No confirmation of the probe within ``waited_s`` seconds."""
        self._probe = None
        if self._pubsub is not None:
            self._rebuild(self._pubsub, "the probe", waited_s)

    def _rebuild(self, silent: PubSub, what: str, waited_s: float) -> None:
        """``silent``, if still the subscription, left ``what`` unanswered for
        ``waited_s`` seconds: rings may be lost on its connection. Every
        watched channel's group polls now, and the subscription is rebuilt."""
        if self._pubsub is not silent:
            return
        log.info(
            "doorbell: the subscription's connection did not answer %s within %.1f s; "
            "polling, and rebuilding the subscription",
            what,
            waited_s,
        )
        self._steady.clear()
        self._catch_up()
        if self._replacer is None or self._replacer.done():
            self._replacer = asyncio.get_running_loop().create_task(self._replace(silent))

    def _catch_up(self) -> None:
        """Every watched channel's group polls now: rings may have been lost."""
        if self._resubscribed is not None:
            for channel in list(self._handlers):
                self._resubscribed(channel)

    async def _replace(self, silent: PubSub) -> None:
        """Stop reading ``silent`` (it left a SUBSCRIBE unanswered) and rebuild the
        subscription on a new connection; with nothing watched, just drop it."""
        reader = self._reader
        if self._pubsub is not silent:
            return
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        if not self._handlers and await self._abandon(silent):
            return
        await self._resubscribe(silent)
        async with self._change:
            if self._pubsub is not None and (self._reader is None or self._reader.done()):
                self._reader = asyncio.create_task(self._read())

    def _drop(self) -> tuple[PubSub | None, asyncio.Task[None] | None]:
        """Forget the pub/sub and its reader (under ``_change``), for the caller to
        stop outside the lock: nothing is watched, and nothing lingers."""
        self._lingering.clear()
        self._steady.clear()
        self._unanswered.clear()
        self._end_probe()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
            self._sweep_timer = None
        pubsub, self._pubsub = self._pubsub, None
        reader, self._reader = self._reader, None
        return pubsub, reader

    def _sweep_later(self) -> None:
        """Make sure the oldest lingering channel is swept once its time is up."""
        if self._sweep_timer is not None or not self._lingering:
            return
        loop = asyncio.get_running_loop()
        due = next(iter(self._lingering.values())) + LINGER_S
        self._sweep_timer = loop.call_at(due, self._start_sweep)

    def _start_sweep(self) -> None:
        self._sweep_timer = None
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def _sweep(self) -> None:
        """Unsubscribe the channels that lingered ``LINGER_S``; drop the
        connection when nothing is watched or lingers any more."""
        async with self._change:
            now = asyncio.get_running_loop().time()
            expired = [c for c, since in self._lingering.items() if now - since >= LINGER_S]
            if self._pubsub is None:
                return
            if self._handlers or len(expired) < len(self._lingering):
                for channel in expired:
                    await self._unsubscribe(channel)
                self._sweep_later()
                return
            for channel in expired:
                self._confirmed.pop(channel, None)
            pubsub, reader = self._drop()
        if pubsub is not None:
            await _stop(reader, pubsub)

    def steady_since(self, channel: str) -> float | None:
        """When (``time.monotonic()`` seconds) ``channel``'s subscription was last
        confirmed, if the connection has not failed since: every ring published
        after that moment reaches this doorbell (and a lingering channel's goes
        to its lock's current wait group, see ``owner``). None when it is not
        subscribed, not confirmed yet, or may have missed a ring."""
        return self._steady.get(channel)

    @property
    def active(self) -> bool:
        """Whether the doorbell holds a subscription (and so a connection and a reader)."""
        return self._pubsub is not None

    async def aclose(self) -> None:
        """Drop every subscription and the connection, and stop the reader."""
        async with self._change:
            self._handlers.clear()
            self._confirmed.clear()
            pubsub, reader = self._drop()
            helpers = (self._sweeper, self._replacer, self._idle_prober)
            self._sweeper = self._replacer = self._idle_prober = None
        for helper in helpers:
            if helper is not None and helper is not asyncio.current_task():
                helper.cancel()
                await asyncio.gather(helper, return_exceptions=True)
        if pubsub is not None:
            await _stop(reader, pubsub)

    def _factories(self) -> list[Callable[[], PubSub]]:
        """Ways to make a new, unsubscribed pub/sub of the client, best first:
        the client's own choice, then on a cluster one bound to each node the
        client knows. Empty when the client has no pub/sub (warned once)."""
        client = self._client()
        if client is None:
            raise ClientDropped("the doorbell's Redis client was garbage-collected")
        make = getattr(client, "pubsub", None)
        if make is None:
            _warn_no_pubsub(client)
            return []
        # On Redis Cluster this is a ClusterPubSub: its one connection goes to
        # the master owning the first channel's slot, and the channels of all
        # other locks ride on it too, which is right for classic (not sharded)
        # pub/sub: a PUBLISH, also one made by a script, is broadcast to every
        # node of the cluster, replicas included.
        factories: list[Callable[[], PubSub]] = [make]
        if isinstance(client, RedisCluster):
            factories += [functools.partial(make, node=node) for node in client.get_nodes()]
        return factories

    async def _read(self) -> None:
        """Route rings until cancelled, rebuilding the subscription when it breaks."""
        failures = 0
        while True:
            pubsub = self._pubsub
            if pubsub is None:
                return
            if cancelling():
                # Cancelled, and the cancellation swallowed by redis-py as it
                # reconnected: reading on would keep a closing loop waiting.
                raise asyncio.CancelledError
            slice_s = read_slice_s(pubsub)
            try:
                message = await pubsub.get_message(timeout=slice_s)
            except asyncio.CancelledError:
                raise
            except NoPermissionError as exc:
                # The server refused a SUBSCRIBE or UNSUBSCRIBE (its ACL, which
                # answers NOPERM); the connection is fine, and resubscribing
                # would only be refused again.
                failures = 0
                self._refused(exc)
                continue
            except ResponseError:
                # Another error reply answers no SUBSCRIBE of ours: the
                # handshake of a reconnection, read by this reader as redis-py
                # reconnected under a SUBSCRIBE (``CLIENT SETINFO`` on a server
                # before Redis 7.2). Taken for a refusal, it failed a pending
                # watch and was reported as an ACL refusal.
                failures = 0
                log.debug("doorbell: an error reply that answers no subscription", exc_info=True)
                continue
            except PUBSUB_FAILURES:
                self._steady.clear()  # rings may have been lost meanwhile
                self._end_probe()  # its answer is lost; a resubscription catches up
                if not self._handlers and await self._abandon(pubsub):
                    return  # only lingering channels: not worth a new connection
                failures += 1
                if failures == 1 and _connected(pubsub):
                    # redis-py reconnected it (subscribing again) before raising
                    # the error: read on, rings may be waiting in it already.
                    continue
                log.debug("doorbell connection lost; resubscribing", exc_info=True)
                if failures <= 2:
                    # Lost, and not reconnected by redis-py (a client with no
                    # retries; 5.0 does not reconnect a pub/sub): rings go to
                    # nobody until the subscription is rebuilt, whose
                    # confirmation comes a delay from now at the earliest.
                    # Only after the first failures: during an outage the
                    # groups' own polls keep their pace.
                    self._catch_up()
                await asyncio.sleep(RECONNECT_DELAY_S)
                await self._resubscribe(pubsub)
                continue
            failures = 0
            if message is None and slice_s is not None:
                continue  # a quiet slice: nothing was read, as the idle probe counts
            self._last_read = asyncio.get_running_loop().time()
            if message is not None:
                encoder = pubsub.encoder
                self._dispatch(message, (encoder.encoding, encoder.encoding_errors))
                if message["type"] == "message":
                    # A ring woke a waiter, which is to hold the lock now: it
                    # runs before this reader reads on, for until it runs the
                    # lock serves nobody.
                    await asyncio.sleep(0)

    async def _abandon(self, broken: PubSub) -> bool:
        """Drop the broken pub/sub (from its reader) if nothing is watched: the
        lingering channels are not subscribed again. Whether it was dropped."""
        async with self._change:
            if self._pubsub is not broken or self._handlers:
                return False
            self._confirmed.clear()
            self._drop()
        await _close(broken)
        return True

    async def _resubscribe(self, broken: PubSub) -> None:
        """Replace ``broken`` by a new pub/sub subscribed to every watched channel.

        On failure ``broken`` stays in place: the reader reads it again (it may
        reconnect by itself) and comes back here after the next delay.
        """
        async with self._change:
            for channel in self._lingering:
                self._confirmed.pop(channel, None)  # rings may have been lost
            self._lingering.clear()
            self._steady.clear()
            channels = list(self._handlers)
            if self._pubsub is not broken or not channels:
                return  # closed or replaced meanwhile, or about to be dropped
            fresh = await self._subscribed(channels)
            if fresh is None:
                return
            self._pubsub = fresh
            self._track(fresh)
            self._end_probe()  # its answer was to come on the broken connection
            # The broken connection's replies never come; the new one answers
            # (confirms or refuses) each channel's SUBSCRIBE, in this order.
            self._unanswered = deque(("subscribe", channel) for channel in channels)
            await _close(broken)
        log.info("doorbell: subscription rebuilt for %d channel(s)", len(channels))

    async def _subscribed(self, channels: list[str]) -> PubSub | None:
        """The first new pub/sub that subscribed to ``channels``; None if none did."""
        for factory in self._factories():
            try:
                fresh = factory()
            except FAILURES:  # e.g. a node the client dropped meanwhile
                continue
            try:
                await within(fresh.subscribe(*map(_wire, channels)), RESUBSCRIBE_TIMEOUT_S)
            except BaseException as exc:
                await _close(fresh)
                if isinstance(exc, (*FAILURES, asyncio.TimeoutError)):
                    log.debug("doorbell: resubscribing failed; next node", exc_info=True)
                    continue
                raise
            return fresh
        return None

    def _refused(self, exc: ResponseError) -> None:
        """The server answered the oldest unanswered SUBSCRIBE or UNSUBSCRIBE
        with ``exc``: fail that channel's ``watch``, or report it."""
        command, channel = self._unanswered.popleft() if self._unanswered else ("", "")
        confirmed = self._confirmed.get(channel) if command == "subscribe" else None
        if command == "subscribe":
            self._steady.pop(channel, None)
        if confirmed is not None and not confirmed.done():
            confirmed.set_result(exc)
            return
        if self._probe is not None and command == "subscribe" and self._probe[0] == channel:
            self._end_probe()  # refused: the channel's group must not count on it
            if self._resubscribed is not None:
                self._resubscribed(channel)
        # An UNSUBSCRIBE, or a SUBSCRIBE sent again after a reconnection: the
        # channel's waiters already poll, or will at their next poll.
        client = self._client()
        if client is not None:
            report_refusal(client, exc, None, None)

    def _again(self, channel: str) -> None:
        """``channel`` was confirmed again: subscribed anew after a gap (redis-py
        reconnects and resubscribes on its own, without a word to the reader)
        in which rings may have been lost. Whoever waits on it catches up (a
        poll); with nothing watched at all, the lingering channels are not
        worth the new connection, and are dropped now."""
        if self._resubscribed is not None:
            self._resubscribed(channel)
        if not self._handlers and self._lingering:
            for lingering in self._lingering:
                self._lingering[lingering] = float("-inf")
            if self._sweep_timer is not None:
                self._sweep_timer.cancel()
            self._start_sweep()

    def _dispatch(self, message: dict[str, object], encoding: tuple[str, str]) -> None:
        """Route ``message``, read from a pub/sub whose client decodes with
        ``encoding`` (its encoding and errors, when it has ``decode_responses``)."""
        channel = as_text(message["channel"], *encoding)
        if message["type"] in ("subscribe", "unsubscribe"):
            _forget(self._unanswered, (str(message["type"]), channel))
        if message["type"] == "subscribe":
            confirmed = self._confirmed.get(channel)
            if confirmed is not None and not confirmed.done():
                self._steady[channel] = time.monotonic()
                confirmed.set_result(None)
            elif self._probe is not None and self._probe[0] == channel:
                # The probe's answer: the connection delivered every ring
                # published before it, and the channel stayed subscribed.
                self._end_probe()
            elif confirmed is not None:
                self._steady[channel] = time.monotonic()
                self._again(channel)
        elif message["type"] == "message":
            ring = self._handlers.get(channel)
            if ring is None and channel in self._lingering and self._owner is not None:
                ring = self._owner(channel)
            if ring is None:
                return
            try:
                token, fence, ticket, pttl_ms, call, queued, proof = as_text(
                    message["data"], *encoding
                ).split(" ")
                if not _PROOF.fullmatch(proof):
                    raise ValueError(proof)
                grant = Grant(int(fence), int(ticket), int(pttl_ms), call, int(queued), proof)
            except ValueError:
                # Not rung by the lock's scripts: ignored (the poll is the truth).
                log.debug("doorbell: ignored a malformed ring on %s", channel)
                return
            try:
                ring(token, grant)
            except Exception:
                # Anyone allowed to PUBLISH here can send anything: whatever one
                # message does, the reader goes on serving every lock's waiters.
                log.exception("doorbell: a ring on %s could not be handled", channel)


def report_refusal(
    client: AsyncClient, exc: ResponseError, keys: LockKeys | None, poll_ms: int | None
) -> None:
    """Log that the server refused the doorbell ``exc``, naming the rule to add:
    at WARNING once per server and rule in this process, then at DEBUG.

    Args:
        client: the client whose server refused.
        exc: the server's refusal.
        keys: the keys of the lock whose channel was refused (for its name and
            namespace), or None when not known (an UNSUBSCRIBE, a resubscription).
        poll_ms: how often that lock's waiters poll (int), or None.
    """
    namespace = keys.namespace if keys is not None else ""
    refused = refusal(str(exc), namespace) or f"the server refused it: {exc}"
    server = server_of(client) or ("client", id(client))
    with _refusals_guard:
        first = (server, refused) not in _refusals_reported
        _refusals_reported.add((server, refused))
    who = f"FIFO lock {keys.name!r}" if keys is not None else "FIFO locks"
    waits = f"up to poll_ms, {poll_ms} ms" if poll_ms is not None else "up to poll_ms"
    log.log(
        logging.WARNING if first else logging.DEBUG,
        "%s: Redis's ACL refused the doorbell (%s): %s to the lock user's ACL rules. "
        "Until then grants are not rung, and each hand-off waits for the next "
        "waiter's poll (%s); %s",
        who,
        exc,
        refused,
        waits,
        RULES_HINT,
    )


async def check_ringing(client: AsyncClient, keys: LockKeys, poll_ms: int) -> bool:
    """Check that Redis lets the lock ring its doorbell: ``PUBLISH`` an empty
    message, as the scripts do to ring a grant, on a channel of ``keys`` that
    nobody hears. Made once per server, user and namespace in this process
    (``claim_ringing_check``).

    A script rings with ``redis.pcall``, so a refused ring fails nothing and
    says nothing, and every hand-off to another process then waits for that
    waiter's poll. An error reply here (an ACL refusal, or a server whose
    ``PUBLISH`` was renamed away) is reported like a refused subscription
    (``report_refusal``: a WARNING per server and rule, naming the rule to add).

    Returns:
        True once Redis answered (the check is made); False when it could not
        be reached (the caller drops its claim, and a later wait checks).
    """
    try:
        await client.publish(_wire(keys.doorbell_of(UNWATCHED_SESSION)), b"")
    except ResponseError as exc:
        if refusal(str(exc), keys.namespace) is not None:
            report_refusal(client, exc, keys, poll_ms)
        else:
            log.warning(
                "FIFO lock %r: Redis refused PUBLISH on the lock's doorbell channel (%s); "
                "grants are not rung, and each hand-off waits for the next waiter's poll "
                "(up to poll_ms, %d ms). The lock needs PUBLISH (check rename-command)",
                keys.name,
                exc,
                poll_ms,
            )
    except (*FAILURES, AttributeError, TypeError, RuntimeError) as exc:
        if isinstance(exc, (AttributeError, TypeError, RuntimeError)) and not lost_in_transport(
            exc
        ):
            raise
        return False
    return True


def claim_ringing_check(client: AsyncClient, keys: LockKeys) -> bool:
    """Whether ``check_ringing`` is still to be made for ``client``'s server and
    user and the namespace of ``keys`` in this process. If so, the caller makes
    it, and it counts as made for everyone else, unless the caller hands it
    back (``drop_ringing_check``) because it could not make it."""
    identity = _ringing_identity(client, keys)
    with _refusals_guard:
        if identity in _ringing_checked:
            return False
        _ringing_checked.add(identity)
        return True


def drop_ringing_check(client: AsyncClient, keys: LockKeys) -> None:
    """Hand back a ``claim_ringing_check`` whose check was not made: the next
    wait makes it."""
    with _refusals_guard:
        _ringing_checked.discard(_ringing_identity(client, keys))


def _ringing_identity(client: AsyncClient, keys: LockKeys) -> tuple[object, ...]:
    # Not the client's identity: a process may make clients without end. All
    # clusters share one entry (a cluster has no one server).
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    user = kwargs.get("username") if isinstance(kwargs, dict) else None
    return (server_of(client) or ("cluster",), user, keys.namespace)


def _forget(unanswered: deque[tuple[str, str]], entry: tuple[str, str]) -> None:
    """Drop the first ``entry`` from ``unanswered``, if there."""
    if entry in unanswered:
        unanswered.remove(entry)


def _warn_no_pubsub(client: AsyncClient) -> None:
    kind = type(client)
    if kind in _warned_no_pubsub:
        return
    _warned_no_pubsub.add(kind)
    log.warning(
        "redis-py %s's asyncio %s has no pubsub() (it came in redis-py 8.0): FIFO locks "
        "on it work without the doorbell, and each hand-off waits for the next waiter's "
        "poll (up to poll_ms); upgrade redis-py for immediate hand-offs",
        redis.__version__,
        kind.__name__,
    )


def _subscribed(confirmed: asyncio.Future[ResponseError | None] | None) -> bool:
    """Whether a channel's confirmation says Redis confirmed its subscription."""
    return confirmed is not None and confirmed.done() and confirmed.result() is None


def read_slice_s(pubsub: PubSub) -> float | None:
    """The ``timeout`` (seconds) for the reader's ``get_message`` on ``pubsub``:
    None (for as long as it takes) where redis-py reads so, else
    ``READ_SLICE_S``, an explicit bound whose end redis-py reports as no message
    rather than as a failure of the connection."""
    connection = pubsub.connection
    if BLOCKING_READ_UNBOUNDED or getattr(connection, "socket_timeout", None) is None:
        return None
    return READ_SLICE_S


def _connected(pubsub: PubSub) -> bool:
    connection = pubsub.connection
    return connection is not None and bool(connection.is_connected)


async def _close(pubsub: PubSub) -> None:
    try:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
    except PUBSUB_FAILURES:
        log.debug("doorbell: closing the pub/sub connection failed", exc_info=True)


async def _stop(reader: asyncio.Task[None] | None, pubsub: PubSub) -> None:
    if reader is not None:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    await _close(pubsub)


_PROOF = re.compile(r"[0-9a-f]{40}")
"""A ring's proof, as the scripts write it: a SHA-1 digest in lower-case hex."""


def _wire(channel: str) -> bytes:
    """``channel`` as the scripts spell it when they ring it: in UTF-8, whatever
    the client's encoding (see ``protocol.wired``)."""
    return channel.encode()
