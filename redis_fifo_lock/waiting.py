"""How a process waits: one wait group per lock, shared by all its waiters.

All waiters of one lock in one process (more exactly: on one client and event
loop) form a ``WaitGroup``. The group has one session id, whose liveness Redis
keeps in the lock's ``alive`` set; one poll per group refreshes it and asks
Redis for the grant, so 10,000 waiters cost one script call per ``poll_ms``, and
when the process dies all of its waiters are skipped together. A ring of the
doorbell, or the next poll at the latest, wakes a waiter. A ring signed with the
secret of the waiter's current acquire call (its ``ring_key``, which only the
script and the lock's keys know) is its grant, dated from when that call was
sent: the grant is younger, however late the ring is read. Anything else - a
poll's news, an unsigned, forged or stale ring, or a grant dated so far back
that its lease would look too short - makes the waiter claim its grant with a
script call of its own, whose reply (dated by when it was sent) starts the
lease.

The ``Hub`` holds the per-client state: the doorbell, the groups, two lanes of
script calls (so waiters never cost a connection each, and renewals never wait
behind enqueues), the withdrawals still owed to Redis, and the eviction-policy
check (``redis_fifo_lock.eviction``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import itertools
import logging
import re
import secrets
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import (
    NoPermissionError,
    RedisClusterException,
    RedisError,
    ResponseError,
)

from . import metrics
from .calls import UNKNOWN_CALL, call_ids
from .doorbell import (
    Doorbell,
    Ring,
    check_ringing,
    claim_ringing_check,
    drop_ringing_check,
    report_refusal,
)
from .errors import ClientDropped, RedisUnavailable
from .eviction import check_eviction_policy, eviction_policies
from .loops import loop_context
from .memo import cached_attribute
from .protocol import (
    GAVE_BACK,
    AsyncClient,
    ClaimReply,
    Grant,
    LockKeys,
    PollReply,
    Protocol,
    bounded,
    lost_in_transport,
    new_ring_key,
    ring_proof,
)
from .settings import LockSettings, shown_value
from .timeouts import within

if TYPE_CHECKING:
    from .lease import Lease

log = logging.getLogger("redis_fifo_lock")

T = TypeVar("T")

MAX_CONCURRENT_CALLS = 2
"""Enqueues, claims, polls, withdrawals and status calls one hub runs at once."""

MAX_URGENT_CALLS = 1
"""Renewals and releases one hub runs at once, in a lane of their own so that
they never queue behind enqueues, claims and polls (see ``HUB_CONNECTIONS``)."""

HUB_CONNECTIONS = MAX_CONCURRENT_CALLS + MAX_URGENT_CALLS + 1 + 1
"""Connections one hub (one client on one event loop) may have open at once:
its two lanes' calls and the doorbell's subscription, and while the doorbell
rebuilds a broken subscription, the new one (opened before the broken one is
closed, which stays in place if the new one fails)."""

EXPIRY_MARGIN_S = 0.002
"""How long after a lease is due to run out, in seconds, the poll that looks for
its end is sent."""
RETRY_AFTER_ERROR_S = 0.5
"""Pause before a poll or withdrawal that failed is tried again, in seconds (a
poll that failed after one that was answered is tried again at once). For
withdrawals: when Redis answered none of a round's tries, every owed
withdrawal waits this long; when it answered some, only the locks whose
withdrawals failed wait, and a withdrawal of any other lock goes at once."""

WITHDRAW_TRY_S = 5.0
"""Longest wait for one withdrawal's reply, in seconds, before it is sent again."""

WITHDRAW_PROBES_PER_ROUND = 8
"""Most locks whose owed withdrawals one round of retries (every
``RETRY_AFTER_ERROR_S``) tries while Redis replies to none of them. A round
first sends one lock's oldest owed withdrawal at a time, as a probe, starting
where the last round stopped; the first reply from Redis ends the probing,
also an error about that lock's keys (``KEY_ERRORS``), but not one about
Redis as a whole (``SERVER_ERRORS``). Then every other lock's
oldest is sent, oldest lock first (each may head its queue, with a live
waiter behind it), and then the others of each lock whose oldest landed. So
a long outage costs a few connection attempts a round, not one per owed
withdrawal (up to ``MAX_WITHDRAWALS``). A lock whose withdrawals keep failing
while Redis answers costs one attempt every ``RETRY_AFTER_ERROR_S`` and holds
up no other lock's: only its own wait, and a withdrawal owed meanwhile on any
other lock starts a round at once (it waits only for a round on its way). A
round in which Redis answered no try (Redis down, or the node of each lock
tried) pauses every withdrawal."""

KEY_ERRORS = ("WRONGTYPE",)
"""Error replies that concern the keys a call touched, not Redis as a whole: a
withdrawal that meets one proves that Redis serves (see
``WITHDRAW_PROBES_PER_ROUND``). So does an error the script's own Lua raised
on what it read (``user_script:`` in the reply), unless it carries one of
``SERVER_ERRORS`` (or redis-py raised it as one of its subclasses of
``ResponseError``, which it does for most of them)."""

SERVER_ERRORS = (
    "OOM",
    "READONLY",
    "NOREPLICAS",
    "MISCONF",
    "BUSY",
    "LOADING",
    "MASTERDOWN",
    "CLUSTERDOWN",
    "TRYAGAIN",
    "NOPERM",
    "NOSCRIPT",
)
"""Error codes about Redis as a whole (every lock would meet them), also when a
command inside a script met them (Redis 6.2 reports that as the script's
error)."""

CLOSING_S = 1.0
"""Longest wait, in seconds, that a closing event loop gives the work the lock
still owes Redis on it: releases and withdrawals (see ``Hub.finish``). A
request not withdrawn by then leaves the queue when its process's liveness runs
out; a lease not released, when ``lease_ms`` does."""

MAX_WITHDRAWALS = 10_000
"""Most withdrawals one hub keeps pending (while Redis does not answer); beyond
that the oldest is dropped with a warning, and its request is skipped once this
process's session stops polling or its grant expires unclaimed."""


class Waiter:
    """One local request waiting for its grant.

    Attributes:
        token: the request's token (str).
        call: the id (str) of the acquire call waiting (``redis_fifo_lock.calls``),
            ``UNKNOWN_CALL`` until the first is made; a new one each time the
            request joins the queue.
        ticket: its ticket (int) once the acquire script replied, else None.
        queued_at: when (``time.monotonic()`` seconds) that reply arrived.
        sent_at: when (``time.monotonic()`` seconds) the latest acquire call
            was made (before it waited for a lane): a grant it made is younger.
        ring_key: the secret (str) sent with the latest acquire call, with which
            Redis signs the ring of its grant; a new one for each call ("" before
            the first).
        granted: a grant handed over by a release of this process (the reply to
            that release) or by a signed ring, with the moment (monotonic s) its
            lease may be dated from: when that release, or this request's
            acquire call, was sent, before Redis made the grant. None otherwise.
        holder: the description of the caller (str, see ``holder.py``) that its
            acquire records for onlookers; "" for none.
        out_of_reach: the latest failure of its group's polls once they had
            failed for ``lease_ms`` (its place is then lost: Redis presumes
            its process dead), None while Redis answers. An acquire without a
            timeout raises ``RedisUnavailable`` then.
    """

    def __init__(self, token: str, loop: asyncio.AbstractEventLoop) -> None:
        self.token = token
        self.call = UNKNOWN_CALL
        self.ticket: int | None = None
        self.queued_at: float | None = None
        self.sent_at = 0.0
        self.ring_key = ""  # each acquire call gets its own: see sending()
        self.granted: tuple[Grant, float] | None = None
        self.holder = ""
        self.out_of_reach: RedisUnavailable | None = None
        self._loop = loop
        self._hint: asyncio.Future[None] = loop.create_future()

    def sending(self) -> None:
        """An acquire script call for this request is about to be made: its ticket
        is unknown until it replies, and a grant it makes is younger than now."""
        self.ticket = self.queued_at = None
        self.sent_at = time.monotonic()
        self.ring_key = new_ring_key()

    def signed(self, grant: Grant) -> bool:
        """Whether ``grant`` (from a ring) was signed by Redis for this waiter's
        current acquire call: made by a script, for this call, after it was sent."""
        if grant.call != self.call:
            return False
        expected = ring_proof(self.ring_key, self.token, grant)
        return hmac.compare_digest(grant.proof.encode(errors="replace"), expected.encode())

    def queued(self, ticket: int | None) -> None:
        """The acquire script replied: the request has ``ticket`` (None: unknown)."""
        self.ticket = ticket
        self.queued_at = None if ticket is None else time.monotonic()

    def hint(self) -> None:
        """A ring or a poll suggests that this request may hold the lock (or lost
        its place): wake the waiting task, which asks Redis."""
        if not self._hint.done():
            self._hint.set_result(None)

    async def next_hint(self, deadline: float | None) -> bool:
        """Wait for the next hint; False if loop time ``deadline`` came first."""
        if deadline is not None and self._loop.time() >= deadline:
            return False
        hint = self._hint
        timer = None if deadline is None else self._loop.call_at(deadline, self.hint)
        try:
            await hint
        finally:
            if timer is not None:
                timer.cancel()
        self._hint = self._loop.create_future()
        return deadline is None or self._loop.time() < deadline


@dataclass
class WaitGroup:
    """The waiters of one lock (one name and settings) on one hub."""

    hub: Hub
    keys: LockKeys
    settings: LockSettings
    protocol: Protocol
    waiters: dict[str, Waiter] = field(default_factory=dict)
    holder_fence: int | None = None
    holder_expires_at: float | None = None
    """When (``time.monotonic()``) the holder's lease, as the latest acquire reply
    told it, runs out at the earliest; None when nobody held it."""
    _poller: asyncio.Task[None] | None = None
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    """Set for the poller to look again: the last waiter left, or ``catch_up``."""
    _poll_now: bool = False
    """``catch_up`` asked for a poll: a ring may have been lost."""
    _poll_failed: bool = False
    """The latest poll failed to reach Redis."""
    _alive_from: float | None = None
    """When (``time.monotonic()``) the latest answered call that refreshed this
    group's session liveness (a poll, an acquire) was sent: Redis keeps the
    session's requests queued for at least ``lease_ms`` from then. None before
    the first answer."""
    _unreachable_told: bool = False
    """The waiters were told their places may be lost (``_unreachable``), and
    no call was answered since."""

    @cached_attribute
    def session(self) -> str:
        """This group's liveness session (see ``Hub.session_for``); the group's
        hub and settings never change, and neither does it."""
        return self.hub.session_for(self.settings)

    @cached_attribute
    def channel(self) -> str:
        """The doorbell channel on which this group's grants are rung."""
        return self.keys.doorbell_of(self.session)

    def join(self, token: str) -> Waiter:
        """Register ``token`` before its acquire is sent, so no ring is missed
        (one token waits once in a process: see ``tokens``)."""
        waiter = Waiter(token, asyncio.get_running_loop())
        self.waiters[token] = waiter
        return waiter

    def wait(self) -> None:
        """A waiter is queued: make sure the group polls."""
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

    def catch_up(self) -> None:
        """Poll now (if the group polls at all): a ring may have been lost."""
        self._poll_now = True
        self._wake.set()

    def ring(self, token: str, grant: Grant) -> None:
        """A grant was rung on this group's doorbell.

        A waiter of ``token`` is woken, with the grant if the ring is signed for
        its current call (``Waiter.signed``); otherwise it claims what the ring
        says, which may be late, repeated or forged. A ring for a request nobody
        here waits for or holds (one this process gave up, or a late copy of a
        finished one) is given back at once, so the lock does not stall; the
        withdraw script touches only this session's request of that ticket, so
        a forged ring cannot make it give away anyone else's grant.
        """
        waiter = self.waiters.get(token)
        if waiter is not None:
            if waiter.signed(grant):
                waiter.granted = (grant, waiter.sent_at)
            waiter.hint()
        elif grant.ticket > 0 and (self.keys, token) not in self.hub.leases:
            self.hub.withdraw(self, token, grant.ticket, grant.call or UNKNOWN_CALL)

    async def enqueue(self, waiter: Waiter) -> tuple[Grant | None, int, int, int]:
        """Run the acquire script for ``waiter``'s call (in flight, see
        ``CallIds.new``): (grant or None, ticket, holder fence)."""

        async def send(client: AsyncClient) -> tuple[Grant | None, int, int, int]:
            return await self.protocol.acquire(
                client,
                self.keys,
                waiter.token,
                self.session,
                self.settings,
                call=waiter.call,
                floor=call_ids().floor(self.keys),
                holder=waiter.holder,
                ring_key=waiter.ring_key,
            )

        sent = time.monotonic()
        reply = await self.hub.run(self.hub.calls, send)
        self._answered(sent)  # the script refreshed this session's liveness, as a poll does
        return reply

    async def claim(self, token: str, ticket: int) -> ClaimReply:
        """Run the claim script for request (token, ticket). A claim that met a
        lost connection is sent once more at once: after a Redis restart or a
        proxy reset, redis-py hands out the pool's dead idle connections one by
        one (the doorbell's new subscription may have taken the one a failed
        poll reopened), and the grant would otherwise wait for the next poll
        (up to ``poll_ms``). Claiming twice is safe: the claim only re-arms the
        request's own grant, and its lease is dated from the first one sent.
        Raises ``RedisUnavailable`` if the claim sent again fails too."""

        def send(client: AsyncClient) -> Awaitable[ClaimReply]:
            return self.protocol.claim(client, self.keys, token, ticket, self.settings)

        try:
            return await self.hub.run(self.hub.calls, send)
        except RedisUnavailable as exc:
            if not connection_lost(exc.cause):
                raise
        return await self.hub.run(self.hub.calls, send)

    async def _poll_loop(self) -> None:
        watching = False
        try:
            watching = await self._watch()
            unchecked = watching
            loop = asyncio.get_running_loop()
            due = loop.time() + (self._first_poll_s() if watching else 0.0)
            while True:
                if not self.waiters:
                    # Checked and closed with no await in between: a waiter that
                    # joins from now on gets a new group from the hub.
                    self._poller = None
                    self.hub.discard(self)
                    return
                delay = due - loop.time()
                if delay > 0:
                    woken = False
                    with contextlib.suppress(asyncio.TimeoutError):
                        woken = await within(self._wake.wait(), delay)
                    if not self.waiters:
                        # Woken because the last waiter left (granted or gone):
                        # close without one more, useless, poll.
                        continue
                    if woken and not self._poll_now:
                        # The last waiter left and another joined before this
                        # task ran: it waits as a waiter that joins a watched
                        # group does (a poll now only if the channel has not
                        # been steady since every acquire went out), and the
                        # polls keep their times. A poll per such wake was a
                        # third script call per grant for tasks of one process
                        # taking turns.
                        self._wake.clear()
                        if watching:
                            due = min(due, loop.time() + self._first_poll_s())
                        continue
                self._wake.clear()
                self._poll_now = False
                due = loop.time() + await self._poll_once()
                if unchecked and self._may_check_ringing():
                    unchecked = False
                    await self._check_ringing()
        except ClientDropped:
            # Its waiters, which hold the client, left while this poll (or the
            # ringing check) waited for a call slot: nobody is left to poll for.
            self.hub.discard(self)
        finally:
            self._poller = None
            if watching:
                await self.hub.doorbell.unwatch(self.channel, self.ring)

    async def _watch(self) -> bool:
        channel = self.channel
        try:
            # Half a lease at most: the first poll waits for it, and must still
            # come before a grant made meanwhile could expire. False: the client
            # has no pub/sub (the doorbell warned once).
            watching = await within(
                self.hub.doorbell.watch(channel, self.ring), self.settings.lease_ms / 2000
            )
        except ResponseError as exc:
            # Refused (an ACL): said once per server and rule, not per wait.
            report_refusal(self.hub.client, exc, self.keys, self.settings.poll_ms)
            await self.hub.doorbell.unwatch(channel, self.ring)
            return False
        except (RedisError, RedisClusterException, OSError, asyncio.TimeoutError) as exc:
            log.warning(
                "FIFO lock %r: doorbell unavailable (%s); waiters rely on polling every %d ms",
                self.keys.name,
                repr(exc),
                self.settings.poll_ms,
            )
            await self.hub.doorbell.unwatch(channel, self.ring)
            return False
        except ClientDropped:
            raise
        except Exception:
            # A failure the doorbell should have handled: a bug, said loudly.
            # The doorbell is only an optimisation, and this task is the
            # group's poller: ending it would leave its waiters to nobody.
            log.exception(
                "FIFO lock %r: the doorbell failed unexpectedly; waiters rely on polling "
                "every %d ms",
                self.keys.name,
                self.settings.poll_ms,
            )
            await self.hub.doorbell.unwatch(channel, self.ring)
            return False
        return watching

    def _may_check_ringing(self) -> bool:
        """Whether the group's ringing check may be made now: right after a poll
        that Redis answered, for waiters still there (a failed first poll is
        tried again at once, and the check must not hold that retry back)."""
        return bool(self.waiters) and not self._poll_failed

    async def _check_ringing(self) -> None:
        """Check, once per server, user and namespace in this process, that
        Redis lets the scripts ring the doorbell (``doorbell.check_ringing``),
        within half a lease. Made after the group's first poll, not before:
        that poll refreshes the process's liveness, and on a slow link the
        check's call (on a connection still to be opened) held it back past
        ``lease_ms``, and the waiters lost their places."""
        client = self.hub.client  # held for the check: its claim is handed back on it
        if claim_ringing_check(client, self.keys):
            checked = False
            try:
                checked = await within(
                    self.hub.run(
                        self.hub.calls,
                        lambda client: check_ringing(client, self.keys, self.settings.poll_ms),
                    ),
                    self.settings.lease_ms / 2000,
                )
            except asyncio.TimeoutError:
                pass  # a later wait checks
            except Exception:
                # A bug, said loudly, and once (the check counts as made): the
                # check only reports, and this task is the group's poller.
                checked = True
                log.exception(
                    "FIFO lock %r: the check that Redis lets the lock ring its doorbell "
                    "failed unexpectedly",
                    self.keys.name,
                )
            finally:
                if not checked:
                    drop_ringing_check(client, self.keys)

    def _first_poll_s(self) -> float:
        """Seconds until the group's first poll, its doorbell being watched.

        At once, as a rule: a grant rung before the subscription was confirmed
        was missed, and the poll finds it. Not when the channel was confirmed,
        with no failure since, before every waiter's acquire was sent (it
        lingered from an earlier wait, see ``doorbell.LINGER_S``): every grant
        to them is rung on it, and reaches this group (its lock's current
        group, see ``Hub.ringing``). The poll's other duties then keep their
        times: right after the holder's lease runs out (a dead holder is
        replaced within ``lease_ms``), and within ``poll_ms`` (liveness).
        """
        steady = self.hub.doorbell.steady_since(self.channel)
        if steady is None or any(w.sent_at < steady for w in self.waiters.values()):
            return 0.0
        poll_s = self.settings.poll_ms / 1000
        if self.holder_expires_at is None:
            return poll_s
        return min(poll_s, max(0.0, self.holder_expires_at - time.monotonic()) + EXPIRY_MARGIN_S)

    async def _poll_once(self) -> float:
        """One poll; returns seconds until the next one (0 when every waiter left
        while it waited for a call slot: it was not sent, nobody needs it)."""

        async def poll(client: AsyncClient) -> PollReply | None:
            if not self.waiters:
                # A poll queued behind other calls (every group catches up after
                # a reconnection) whose waiters left meanwhile: thousands of
                # them held up the hub's withdrawals and new acquires for
                # seconds (an outside attack).
                return None
            return await self.protocol.poll(client, self.keys, self.session, self.settings)

        sent = time.monotonic()
        try:
            reply = await self.hub.run(self.hub.calls, poll)
        except RedisUnavailable as exc:
            log.warning(
                "FIFO lock %r: poll failed, retrying: %s",
                self.keys.name,
                exc.reason,
            )
            self._unreachable(exc)
            if not self._poll_failed:
                # The first failure after an answer may be the pooled
                # connection's alone (reset while idle: a restart, a proxy),
                # which redis-py has dropped; the next call opens a new one.
                self._poll_failed = True
                return 0.0
            # Never longer than a poll interval: the session's liveness (one
            # lease) must be refreshed before it runs out.
            return min(RETRY_AFTER_ERROR_S, self.settings.poll_ms / 1000)
        if reply is None:
            return 0.0
        self._poll_failed = False
        self._answered(sent)
        self._settle(reply, sent)
        poll_s = self.settings.poll_ms / 1000
        if reply.grant is not None and reply.grant.pttl_ms > 0:
            # Poll again right after the current lease would expire, so a dead
            # holder is replaced within lease_ms, not lease_ms + poll_ms.
            return min(poll_s, reply.grant.pttl_ms / 1000 + EXPIRY_MARGIN_S)
        return poll_s

    def _answered(self, sent: float) -> None:
        """Redis answered a call sent at ``sent`` (``time.monotonic()``) that
        refreshed this group's session liveness (a poll, an acquire): no
        waiter's place is lost, whatever failed before."""
        if self._alive_from is None or sent > self._alive_from:
            self._alive_from = sent
        if self._unreachable_told:
            self._unreachable_told = False
            for waiter in self.waiters.values():
                waiter.out_of_reach = None

    def _unreachable(self, failure: RedisUnavailable) -> None:
        """A poll failed with ``failure``. Once ``lease_ms`` passed since the
        latest answered call that refreshed the session's liveness was sent
        (dated by when it was asked: the outage may have begun up to
        ``poll_ms`` after it), Redis may have presumed this process dead and
        its requests may have lost their places: each waiter is told
        (``out_of_reach``) and woken, once, and one without a timeout gives up."""
        if self._alive_from is None:
            return
        if time.monotonic() - self._alive_from < self.settings.lease_ms / 1000:
            return
        self._unreachable_told = True
        for waiter in self.waiters.values():
            if waiter.out_of_reach is None:  # woken once, not at every failed poll
                waiter.out_of_reach = failure
                waiter.hint()

    def _settle(self, reply: PollReply, sent: float) -> None:
        """Wake the waiters the poll (sent at ``sent``) concerns: the holder, if it
        waits here, and those no longer queued (their claim finds out why, and
        they queue again). A waiter whose acquire had not replied before the poll
        was sent may have queued after the poll ran: the next poll tells."""
        self.holder_fence = reply.grant.fence if reply.grant else None
        for waiter in self.waiters.values():
            if waiter.ticket is None or waiter.queued_at is None or waiter.queued_at > sent:
                continue
            lost_place = reply.head_ticket is None or waiter.ticket < reply.head_ticket
            if waiter.token == reply.holder or lost_place:
                waiter.hint()


WithdrawalKey = tuple[LockKeys, str, str]
"""An owed withdrawal's lock, token and acquire call."""


@dataclass
class _Withdrawal:
    """A request this process gave up, to withdraw as soon as Redis answers."""

    group: WaitGroup
    token: str
    ticket: int
    call: str
    done: asyncio.Future[None]
    failures: int = 0
    """Its tries that failed: no reply, or an error (not those the hub did not
    send, or cut short, for a retry of its token)."""
    attempt: asyncio.Task[int] | None = None
    """The call sending it, while one is on its way."""
    suspended: bool = False
    """A retry of the token is on its way (see ``Hub.reclaim``): not sent until
    it has a reply (then dropped) or fails (then sent again)."""
    replied: bool = False
    """Its last attempt failed with an error Redis replied with about its lock's
    keys (``KEY_ERRORS``): Redis serves, the lock's keys are at fault (see
    ``WITHDRAW_PROBES_PER_ROUND``)."""
    broke: bool = False
    """An attempt failed unexpectedly (a bug somewhere), and that was said (see
    ``Hub._withdrawal_broke``)."""
    seq: int = 0
    """Its place in the order the hub's withdrawals were owed in."""


def _about_its_keys(error: BaseException | None) -> bool:
    """Whether ``error`` is a reply of Redis about the keys the call touched
    (``KEY_ERRORS``, or the script failing on what it read there), not about
    Redis as a whole (``SERVER_ERRORS``), which every lock would meet too."""
    if not isinstance(error, ResponseError):
        return False
    # Redis 7 replies with the code first; 6.2 wraps a script's error in its own.
    text = str(error)
    if any(re.search(rf"\b{code}\b", text) for code in KEY_ERRORS):
        return True
    # redis-py raises a subclass for most server-wide codes (OutOfMemoryError,
    # ReadOnlyError...) and cuts the code off its text: only a plain error is
    # the script's own.
    return (
        type(error) is ResponseError
        and "user_script:" in text
        and not any(re.search(rf"\b{code}\b", text) for code in SERVER_ERRORS)
    )


def _batches(items: list[T]) -> list[list[T]]:
    """``items`` in runs of ``MAX_CONCURRENT_CALLS``, the hub's call slots."""
    return [
        items[at : at + MAX_CONCURRENT_CALLS] for at in range(0, len(items), MAX_CONCURRENT_CALLS)
    ]


def _failures(owed: list[tuple[WithdrawalKey, _Withdrawal]]) -> int:
    """The failed tries of the withdrawals ``owed`` so far."""
    return sum(withdrawal.failures for _, withdrawal in owed)


def _settle(withdrawal: _Withdrawal) -> None:
    """``withdrawal`` is done with (sent, or given up): its call is no longer in
    flight, and whoever waits for it goes on."""
    call_ids().leave(withdrawal.group.keys, withdrawal.call)
    if not withdrawal.done.done():
        withdrawal.done.set_result(None)


class Hub:
    """Per-client (and so per event loop and process) state shared by all locks.

    Holds its client weakly: the hub is stored in its loop's ``LoopContext``,
    keyed weakly by the client, and a strong reference back would keep every
    client alive as long as its loop, however long the loop runs.

    Attributes:
        session: this hub's liveness session id (str), the stem of its wait
            groups' sessions.
        calls: the lane for enqueues, claims, polls, withdrawals and status reads.
        urgent: the lane for renewals and releases.
        leases: the leases granted through this hub and not yet released, by
            lock keys and token (held weakly).
    """

    def __init__(self, client: AsyncClient) -> None:
        self._client = weakref.ref(client)
        self.loop = asyncio.get_running_loop()
        self.session = secrets.token_hex(8)
        self.doorbell = Doorbell(self._client, owner=self.ringing, resubscribed=self.resubscribed)
        loop_context().doorbells.add(self.doorbell)
        self.calls = asyncio.Semaphore(MAX_CONCURRENT_CALLS)
        self.urgent = asyncio.Semaphore(MAX_URGENT_CALLS)
        self.groups: dict[tuple[LockKeys, LockSettings], WaitGroup] = {}
        self._by_channel: dict[str, WaitGroup] = {}  # the same groups, by doorbell channel
        self.leases: weakref.WeakValueDictionary[tuple[LockKeys, str], Lease] = (
            weakref.WeakValueDictionary()
        )
        self._withdrawals: dict[WithdrawalKey, _Withdrawal] = {}
        # The keys of the same withdrawals, by lock and token: every acquire asks
        # for its token's (reclaim, retry_ended), in O(1) however many are owed.
        self._by_token: dict[tuple[LockKeys, str], set[WithdrawalKey]] = {}
        # The same withdrawals by lock, oldest first: a round passes over a lock
        # that must wait (_lock_retry_at) in one step, however many it owes.
        self._by_lock: dict[LockKeys, dict[WithdrawalKey, _Withdrawal]] = {}
        self._owed_count = itertools.count()
        self._withdrawer: asyncio.Task[None] | None = None
        # Set when a withdrawal may be sendable before the next retry is due: a
        # new one owed, or one a retry held back let go (see _withdraw_pending).
        self._owed_anew = asyncio.Event()
        # By lock: when (loop time) its withdrawals may be tried again after one
        # failed while Redis answered others (RETRY_AFTER_ERROR_S). Only locks
        # whose try failed within the last RETRY_AFTER_ERROR_S are kept.
        self._lock_retry_at: dict[LockKeys, float] = {}
        # The lock the next round of withdrawals probes first (WITHDRAW_PROBES_PER_ROUND).
        self._withdraw_from = 0
        self._duties: dict[object, tuple[Callable[[], Awaitable[object]], asyncio.Task[Any]]] = {}

    @property
    def client(self) -> AsyncClient:
        """The client; it is alive while any lock or lease that uses it is."""
        client = self._client()
        if client is None:
            raise ClientDropped("the Redis client of this hub was garbage-collected")
        return client

    def session_for(self, settings: LockSettings) -> str:
        """The liveness session of this hub's waiters with ``settings``: the hub's
        id and a digest of the settings. The same for every group of these
        settings on the hub, so a name's ``alive`` set holds one entry per
        process, loop and settings, however often the name is used."""
        return f"{self.session}.{_digest_of(settings)}"

    def hand_over(
        self,
        keys: LockKeys,
        settings: LockSettings,
        protocol: Protocol,
        handover: tuple[str, Grant],
        sent: float,
    ) -> None:
        """A release sent at ``sent`` (monotonic s) granted the lock to ``handover``
        = (token, grant), a waiter of this hub: wake it with the grant, dated from
        ``sent``. If it no longer waits, give the grant back at once."""
        token, grant = handover
        group = self.groups.get((keys, settings))
        waiter = group.waiters.get(token) if group is not None else None
        if waiter is not None and waiter.call == grant.call:
            waiter.granted = (grant, sent)
            waiter.hint()
        elif (keys, token) not in self.leases:
            owner = group or WaitGroup(self, keys, settings, protocol)
            self.withdraw(owner, token, grant.ticket, grant.call or UNKNOWN_CALL)

    def group(self, keys: LockKeys, settings: LockSettings, protocol: Protocol) -> WaitGroup:
        """The wait group of this lock, created on first use."""
        group = self.groups.get((keys, settings))
        if group is None or group.protocol is not protocol:
            group = WaitGroup(self, keys, settings, protocol)
            self.groups[(keys, settings)] = group
            self._by_channel[group.channel] = group
        return group

    def ringing(self, channel: str) -> Ring | None:
        """Where a ring on doorbell ``channel`` goes when no wait group watches it
        (it lingers): to the current group of its lock, which may have just
        sent its first acquire and not watch the channel yet; None if none."""
        group = self._by_channel.get(channel)
        return None if group is None else group.ring

    def resubscribed(self, channel: str) -> None:
        """Doorbell ``channel`` was subscribed again after a gap: its lock's group
        polls now, for a grant rung in the gap."""
        group = self._by_channel.get(channel)
        if group is not None:
            group.catch_up()

    def discard(self, group: WaitGroup) -> None:
        """Forget ``group`` if it is still the current one for its lock."""
        if self.groups.get((group.keys, group.settings)) is group:
            del self.groups[(group.keys, group.settings)]
            del self._by_channel[group.channel]

    def withdraw(
        self, group: WaitGroup, token: str, ticket: int, call: str
    ) -> asyncio.Future[None]:
        """Withdraw request (token, ticket) of ``group`` (ticket 0 when its acquire's
        fate is unknown: then the request made by acquire call ``call``), now and
        again until Redis answers.

        Returns a future that is done once Redis confirmed the withdrawal. The
        withdrawal is kept (at most ``MAX_WITHDRAWALS``) and retried in rounds
        every ``RETRY_AFTER_ERROR_S`` while Redis does not answer (one a lock
        for a few locks a round, see ``WITHDRAW_PROBES_PER_ROUND``), so that a
        request abandoned by an outage leaves the queue as soon as Redis is
        back.
        """
        key = (group.keys, token, call)
        pending = self._withdrawals.get(key)
        if pending is not None:
            return pending.done
        if len(self._withdrawals) >= MAX_WITHDRAWALS:
            oldest = next(iter(self._withdrawals))
            dropped = self._forget(oldest)
            call_ids().leave(dropped.group.keys, dropped.call)
            dropped.done.cancel()
            log.warning(
                "FIFO lock %r: more than %d withdrawals pending while Redis does not "
                "answer; request %s is left to expire",
                oldest[0].name,
                MAX_WITHDRAWALS,
                oldest[1],
            )
        done = self.loop.create_future()
        withdrawal = _Withdrawal(group, token, ticket, call, done, seq=next(self._owed_count))
        self._withdrawals[key] = withdrawal
        self._by_token.setdefault((group.keys, token), set()).add(key)
        self._by_lock.setdefault(group.keys, {})[key] = withdrawal
        call_ids().enter(group.keys, call)
        self._start_withdrawer()
        self._owed_anew.set()
        return done

    def _forget(self, key: WithdrawalKey) -> _Withdrawal:
        """Remove the owed withdrawal ``key`` and return it."""
        withdrawal = self._withdrawals.pop(key)
        keys = self._by_token[key[:2]]
        keys.discard(key)
        if not keys:
            del self._by_token[key[:2]]
        of_lock = self._by_lock[key[0]]
        del of_lock[key]
        if not of_lock:
            del self._by_lock[key[0]]
        return withdrawal

    def _of_token(self, keys: LockKeys, token: str) -> list[tuple[WithdrawalKey, _Withdrawal]]:
        """The owed withdrawals of ``token`` on the lock of ``keys``."""
        return [(key, self._withdrawals[key]) for key in self._by_token.get((keys, token), ())]

    def _start_withdrawer(self) -> asyncio.Task[None]:
        """The task sending the owed withdrawals, started if it is not running."""
        if self._withdrawer is None or self._withdrawer.done():
            self._withdrawer = self.loop.create_task(self._withdraw_pending())
        return self._withdrawer

    def reclaim(self, keys: LockKeys, token: str) -> None:
        """``token`` is asked for again (a retry after ``RedisUnavailable``): its
        withdrawals are held back, so that the new call takes the request over
        and keeps its place. One on its way is cut short (so that neither the
        lock nor redis-py's retries send it again while the retry is on its
        way), and the retry does not wait for it: if it reached Redis before
        the retry does, the request was withdrawn
        and the retry queues again at the back; if after, it names the call it
        withdraws and leaves alone the request the new call took over. Waiting
        for it instead made the first outcome certain. ``retry_ended`` says
        what becomes of them."""
        for _, pending in self._of_token(keys, token):
            pending.suspended = True
            if pending.attempt is not None:
                pending.attempt.cancel()

    def retry_ended(self, keys: LockKeys, token: str, *, answered: bool) -> None:
        """The retry of ``token`` that ``reclaim`` held its withdrawals back for
        has ended: with Redis's reply (``answered``: the new call took the
        request over, so they are dropped), or without one (it may never have
        reached Redis: they are sent again, or the first request would be left
        queued, or its grant held, with nobody waiting for it)."""
        for key, pending in self._of_token(keys, token):
            if not pending.suspended:
                continue
            if answered:
                self._forget(key)
                call_ids().leave(keys, pending.call)
                pending.done.cancel()
            else:
                pending.suspended = False
                self._start_withdrawer()
                self._owed_anew.set()

    def _sendable(self) -> bool:
        """Whether a withdrawal is owed that no retry holds back: the withdrawer
        stops when none is, and ``retry_ended`` starts it again."""
        return any(not withdrawal.suspended for withdrawal in self._withdrawals.values())

    async def _withdraw_pending(self) -> None:
        while self._sendable():
            if self._client() is None:
                self._drop_withdrawals()
                return
            self._owed_anew.clear()
            if not await self._withdraw_round():
                if self._client() is not None:
                    await asyncio.sleep(RETRY_AFTER_ERROR_S)  # Redis answered none
                continue
            wait_s = self._next_try_s()
            if wait_s > 0:
                await self._wait_for_next_try(wait_s)

    async def _wait_for_next_try(self, wait_s: float) -> None:
        """Only locks whose withdrawals failed are owed: wait ``wait_s``
        seconds, until the first is due, or less if a withdrawal of another
        lock is owed meanwhile. Not ``asyncio.wait_for``: on Python 3.10 and
        3.11 it loses a cancellation that comes once the event is set, and the
        loop's close would wait for the withdrawer for ever."""
        due = self.loop.call_later(wait_s, self._owed_anew.set)
        try:
            await self._owed_anew.wait()
        finally:
            due.cancel()

    def _next_try_s(self) -> float:
        """Seconds until an owed withdrawal that no retry holds back may be
        sent: 0 when one may be now (see ``_lock_retry_at``)."""
        now = self.loop.time()
        first = None
        for lock, withdrawals in self._by_lock.items():
            if any(not withdrawal.suspended for withdrawal in withdrawals.values()):
                due = self._lock_retry_at.get(lock, now)
                if due <= now:
                    return 0.0
                first = due if first is None else min(first, due)
        return 0.0 if first is None else first - now

    def _failed_try(self, withdrawal: _Withdrawal) -> None:
        """A try of ``withdrawal`` failed: its lock's withdrawals wait
        ``RETRY_AFTER_ERROR_S`` before the next."""
        withdrawal.failures += 1
        self._lock_retry_at[withdrawal.group.keys] = self.loop.time() + RETRY_AFTER_ERROR_S

    async def _withdraw_round(self) -> bool:
        """One round of the owed withdrawals (see ``WITHDRAW_PROBES_PER_ROUND``)
        but those of locks whose last try failed less than
        ``RETRY_AFTER_ERROR_S`` ago; False when a try of it failed (no reply,
        or an error) and Redis answered none: then every withdrawal waits. A
        withdrawal not sent (held back, or cut short, for a retry of its token
        that may then end at once) is no failure, nor one asked for again once
        it landed (an acquire given up by its timeout, then by its caller's
        cancellation)."""
        now = self.loop.time()
        self._lock_retry_at = {lock: due for lock, due in self._lock_retry_at.items() if due > now}
        by_lock: dict[LockKeys, list[tuple[WithdrawalKey, _Withdrawal]]] = {}
        for lock, withdrawals in self._by_lock.items():
            if lock in self._lock_retry_at:
                continue  # its last try failed just now
            ready = [
                (key, withdrawal)
                for key, withdrawal in withdrawals.items()  # oldest first
                if not withdrawal.suspended  # else a retry of its token is on its way
            ]
            if ready:
                by_lock[lock] = ready
        owed = [pair for ready in by_lock.values() for pair in ready]
        failures = _failures(owed)
        locks = sorted(by_lock, key=lambda lock: by_lock[lock][0][1].seq)  # oldest first
        start = self._withdraw_from % len(locks) if locks else 0
        withdrawn: dict[LockKeys, bool] = {}  # a lock's oldest owed withdrawal landed
        replied = False
        for lock in locks[start:] + locks[:start]:
            withdrawn[lock], replied = await self._withdraw_oldest(by_lock[lock])
            if replied or len(withdrawn) >= WITHDRAW_PROBES_PER_ROUND:
                break
        if not replied:
            self._withdraw_from = start + len(withdrawn)  # the next round probes the others
            return _failures(owed) == failures
        self._withdraw_from = 0
        # Redis answers: each lock's oldest first (it may head its queue, with a
        # live waiter behind it), then the others of the locks whose oldest landed.
        for batch in _batches([lock for lock in locks if lock not in withdrawn]):
            results = await asyncio.gather(
                *(self._withdraw_oldest(by_lock[lock]) for lock in batch)
            )
            withdrawn.update(
                (lock, landed) for lock, (landed, _) in zip(batch, results, strict=True)
            )
        for lock in locks:
            if withdrawn[lock]:
                for others in _batches(by_lock[lock][1:]):
                    await asyncio.gather(*(self._withdraw_settled(*other) for other in others))
        return True  # Redis answers: a lock whose withdrawal failed waits on its own

    async def _withdraw_oldest(
        self, owed: list[tuple[WithdrawalKey, _Withdrawal]]
    ) -> tuple[bool, bool]:
        """Send one lock's oldest owed withdrawal: whether it landed, and whether
        Redis replied (also with an error: the lock's scripts fail, not Redis).
        One not sent, or cut short, for a retry of its token (see ``reclaim``)
        says neither: the next is sent instead; (False, False) if none is left."""
        for key, oldest in owed:
            if oldest.suspended or self._withdrawals.get(key) is not oldest:
                continue
            failures = oldest.failures
            if await self._withdraw_settled(key, oldest):
                return True, True
            if oldest.failures > failures:
                return False, oldest.replied
        return False, False

    async def _withdraw_settled(self, key: WithdrawalKey, withdrawal: _Withdrawal) -> bool:
        """Send ``withdrawal``; once Redis answered it, it is no longer owed."""
        done = await self._withdraw_one(withdrawal)
        if done and self._withdrawals.get(key) is withdrawal:
            self._forget(key)
            _settle(withdrawal)
        return done

    def _drop_withdrawals(self) -> None:
        """The client was closed and dropped with withdrawals still owed: nothing
        can be sent any more. The requests are skipped once this process stops
        polling for them, or their grants expire unclaimed."""
        log.warning(
            "FIFO lock %r: the Redis client was dropped with %d withdrawal(s) still owed "
            "(Redis did not answer); the requests are left to expire",
            next(iter(self._withdrawals.values())).group.keys.name,
            len(self._withdrawals),
        )
        for withdrawal in self._withdrawals.values():
            _settle(withdrawal)
        self._withdrawals.clear()
        self._by_token.clear()
        self._by_lock.clear()
        self._lock_retry_at.clear()

    async def _withdraw_one(self, withdrawal: _Withdrawal) -> bool:
        group = withdrawal.group
        key = (group.keys, withdrawal.token, withdrawal.call)
        withdrawal.replied = False
        if self._withdrawals.get(key) is not withdrawal:
            return True  # taken over by a retry of the same token meanwhile
        if withdrawal.suspended:
            return False  # a retry of the token is on its way: not yet

        async def send(client: AsyncClient) -> int:
            # Bounded once it has a slot: waiting for one is not a failure.
            return await within(
                group.protocol.withdraw(
                    client,
                    group.keys,
                    withdrawal.token,
                    withdrawal.ticket,
                    group.session,
                    group.settings.keep_ms,
                    withdrawal.call,
                    call_ids().floor(group.keys),
                ),
                WITHDRAW_TRY_S,
            )

        attempt = self.loop.create_task(self.run(self.calls, send))
        withdrawal.attempt = attempt
        try:
            await asyncio.wait({attempt})
        except asyncio.CancelledError:
            attempt.cancel()
            raise
        finally:
            withdrawal.attempt = None
        if attempt.cancelled():
            # Cut short by a retry of the token (see reclaim), or by the loop's
            # shutdown (then tried again, see finish).
            return False
        try:
            outcome = attempt.result()
        except ClientDropped:
            return False  # _withdraw_pending drops them all, saying so
        except RedisUnavailable as exc:
            if isinstance(exc.cause, NoPermissionError):
                # Refused, not unreachable (an ACL without a command the script
                # needs): trying again cannot help; the request is skipped once
                # this process stops polling, or its grant expires unclaimed.
                log.warning(
                    "FIFO lock %r: Redis refused to withdraw request %s (%s); it is left to expire",
                    group.keys.name,
                    withdrawal.token,
                    exc.cause,
                )
                return True
            withdrawal.replied = _about_its_keys(exc.cause)
            return self._withdrawal_failed(withdrawal, exc.reason)
        except asyncio.TimeoutError:
            return self._withdrawal_failed(withdrawal, "no reply")
        except Exception as exc:
            return self._withdrawal_broke(withdrawal, exc)
        if outcome == GAVE_BACK:
            metrics.gave_back(group.keys)
            log.debug("FIFO lock %r: gave back the grant to %s", group.keys.name, withdrawal.token)
        return True

    def _withdrawal_broke(self, withdrawal: _Withdrawal, error: Exception) -> bool:
        """A try of ``withdrawal`` failed with ``error``, neither an outage nor
        Redis's answer (redis-py raises ``AttributeError`` when the client is
        closed while it writes): a bug somewhere, said loudly, with its
        traceback, the first time it does. The task sending the owed
        withdrawals must not end on it, or they would wait for the next one:
        the withdrawal is tried again like any other. Returns False (it is
        still owed)."""
        if not withdrawal.broke:
            withdrawal.broke = True
            self._failed_try(withdrawal)
            log.error(
                "FIFO lock %r: withdrawing request %s failed unexpectedly; retrying every %g s",
                withdrawal.group.keys.name,
                withdrawal.token,
                RETRY_AFTER_ERROR_S,
                exc_info=error,
            )
            return False
        return self._withdrawal_failed(
            withdrawal, f"{type(error).__name__}: {shown_value(str(error))}"
        )

    def _withdrawal_failed(self, withdrawal: _Withdrawal, reason: str) -> bool:
        """A try of ``withdrawal`` failed for ``reason``: say so (at its first
        failure; later ones at DEBUG), and return False (it is still owed)."""
        self._failed_try(withdrawal)
        log.log(
            logging.WARNING if withdrawal.failures == 1 else logging.DEBUG,
            "FIFO lock %r: could not withdraw request %s yet (%s); retrying every %g s "
            "until Redis answers",
            withdrawal.group.keys.name,
            withdrawal.token,
            reason,
            RETRY_AFTER_ERROR_S,
        )
        return False

    def duty(self, key: object, work: Callable[[], Awaitable[T]]) -> asyncio.Task[T]:
        """Run ``work()`` in a task now, and keep it as a duty of this hub, named
        ``key``, until it returns or raises anything but a cancellation.

        For work owed to Redis whatever becomes of the caller (the release of a
        ``hold()``, of a dropped lease): a loop's shutdown (``asyncio.run``,
        ``async_to_sync``) cancels every task it finds, possibly before it ran
        a step, and ``finish`` then runs the duty again before the loop closes.
        """
        task: asyncio.Task[T] = self.loop.create_task(self._perform(key, work))
        self._duties[key] = (work, task)
        return task

    async def _perform(self, key: object, work: Callable[[], Awaitable[T]]) -> T:
        try:
            result = await work()
        except asyncio.CancelledError:
            raise  # still owed: see finish()
        except BaseException:
            self._forget_duty(key, work)
            raise
        self._forget_duty(key, work)
        return result

    def _forget_duty(self, key: object, work: Callable[[], Awaitable[object]]) -> None:
        if key in self._duties and self._duties[key][0] is work:
            del self._duties[key]

    @property
    def busy(self) -> bool:
        """Whether the hub has anything for ``finish`` or ``aclose`` to do: duties
        or withdrawals owed, or a doorbell subscription."""
        return bool(self._duties) or bool(self._withdrawals) or self.doorbell.active

    async def finish(self) -> None:
        """For the event loop's close: do the duties and withdrawals still owed
        (their tasks cancelled by the loop's shutdown, or still running), for at
        most ``CLOSING_S`` in all. Never raises."""
        if self._client() is None:
            return  # nothing reaches Redis any more: aclose drops what is owed
        deadline = self.loop.time() + CLOSING_S
        # Twice: for what was owed, then for duties that came meanwhile (a lease
        # garbage-collected as the loop ends).
        for _ in range(2):
            running = self._owed()
            left = deadline - self.loop.time()
            if not running or left <= 0:
                return
            await asyncio.wait(running, timeout=left)
            for task in running:
                if task.done() and not task.cancelled():
                    task.exception()  # retrieved: its caller, if any, is gone

    def _owed(self) -> list[asyncio.Task[Any]]:
        """The tasks doing what is owed, started again where the loop's shutdown
        cancelled them."""
        running = []
        for key, (work, task) in list(self._duties.items()):
            running.append(self.duty(key, work) if task.done() else task)
        if self._withdrawals:
            running.append(self._start_withdrawer())
        return running

    async def aclose(self) -> None:
        """Stop what the hub runs on its own, for its event loop's close (after
        ``finish``): duties and withdrawals not done by then are dropped, and
        the withdrawer and the doorbell (its reader and subscription) stop.

        A loop's shutdown cancels the tasks it finds, but a task it cancels can
        start another on its way out (a withdrawal, a doorbell subscription
        that was being confirmed); left running, that task is destroyed pending
        when the loop closes. Never raises."""
        stopping = [task for _, task in self._duties.values()]
        if self._withdrawer is not None:
            stopping.append(self._withdrawer)
        for task in stopping:
            task.cancel()
        await asyncio.gather(*stopping, return_exceptions=True)
        self._duties.clear()
        for withdrawal in self._withdrawals.values():
            call_ids().leave(withdrawal.group.keys, withdrawal.call)
            withdrawal.done.cancel()
        self._withdrawals.clear()
        self._by_token.clear()
        self._by_lock.clear()
        self._lock_retry_at.clear()
        await self.doorbell.aclose()

    async def run(self, lane: asyncio.Semaphore, call: Callable[[AsyncClient], Awaitable[T]]) -> T:
        """Take a slot of ``lane`` (``calls`` or ``urgent``), then run
        ``call(client)`` - a ``Protocol`` call on this hub's client - and return
        its reply. The call is made once the slot is taken, so what it sends (a
        floor, a send time) is read when it is sent. Raises what ``call`` raises."""
        async with lane:
            return await call(self.client)

    async def check_eviction_policy(self, name: str) -> None:
        """Warn (naming lock ``name``) if the server may evict keys: see
        ``redis_fifo_lock.eviction.check_eviction_policy``."""
        await check_eviction_policy(
            self.client,
            name,
            lambda: self.run(self.calls, lambda client: bounded(client, eviction_policies(client))),
        )


@functools.lru_cache(maxsize=64)
def _digest_of(settings: LockSettings) -> str:
    """A short digest of ``settings``, worked out once for the few settings a
    process uses: a release asks for it on the way to Redis."""
    return hashlib.blake2s(repr(settings).encode(), digest_size=4).hexdigest()


def connection_lost(cause: BaseException | None) -> bool:
    """Whether ``cause`` (a ``RedisUnavailable``'s) says that the connection the
    call went out on was lost (reset or closed), as redis-py's
    ``ConnectionError`` or the event loop's transport (``lost_in_transport``)
    report it."""
    return cause is not None and (
        isinstance(cause, RedisConnectionError) or lost_in_transport(cause)
    )


def check_pool_size(where: str, client: object) -> None:
    """Refuse ``client`` (a redis.asyncio client) when its connection pool
    allows fewer than ``HUB_CONNECTIONS`` connections: the calls beyond its
    size would fail with "Too many connections" as if Redis were out of reach
    (with one, no release goes through). A ``RedisCluster``, whose pools are per
    node, is not checked.

    Raises:
        ValueError: ``max_connections`` below ``HUB_CONNECTIONS``, naming ``where``.
    """
    limit = getattr(getattr(client, "connection_pool", None), "max_connections", None)
    if isinstance(limit, int) and limit < HUB_CONNECTIONS:
        raise ValueError(
            f"{where}: max_connections of the client's pool is {limit}; the lock needs "
            f"{HUB_CONNECTIONS} connections on each event loop that uses it (its calls, "
            "its renewals and releases, its doorbell and the doorbell's rebuilding); raise "
            "max_connections to "
            f"{HUB_CONNECTIONS} or more, plus what your own commands use on the same client"
        )


def hub_for(client: AsyncClient) -> Hub:
    """The hub of ``client`` on the running event loop, kept in the loop's
    ``LoopContext`` and created on first use.

    Raises:
        ValueError: as ``check_pool_size`` (a client a ``LoopClients`` factory built).
    """
    hubs = loop_context().hubs
    hub = hubs.get(client)
    if hub is None:
        check_pool_size("FIFO lock", client)
        hub = hubs[client] = Hub(client)
    return hub
