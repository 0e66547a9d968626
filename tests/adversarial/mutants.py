"""Deliberately broken variants of the lock, for proving the adversarial suite can fail.

Nothing here edits the core. A Lua mutant is a text substitution applied to the
live script sources (``lib.lua`` + the script, as ``Script`` loads them) and run
through ``Protocol(**overrides)``; every substitution asserts that its snippet
occurs exactly once, so a refactor of the scripts breaks the mutant loudly
instead of silently turning it into the real lock. A Python mutant is a
subclass of ``FifoLock``, ``Protocol``, ``WaitGroup`` or ``Doorbell``;
``Mutant.installed()`` swaps the ``WaitGroup`` and ``Doorbell`` classes for the
duration of a ``with`` block (contender processes hold them for their whole
life, selected with ``--mutant NAME``).

``REAL`` is the unmodified lock, so that every caller builds locks one way.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import hmac
import inspect
import time
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError, ResponseError

import redis_fifo_lock.calls as calls_module
import redis_fifo_lock.doorbell as doorbell_module
import redis_fifo_lock.lock as lock_module
import redis_fifo_lock.protocol as protocol_module
import redis_fifo_lock.renewal as renewal_module
import redis_fifo_lock.waiting as waiting_module
from redis_fifo_lock import FifoLock, Lease, RedisUnavailable
from redis_fifo_lock.calls import SEQ_DIGITS, CallIds
from redis_fifo_lock.doorbell import PROBE_TIMEOUT_S, Doorbell
from redis_fifo_lock.loops import loop_context
from redis_fifo_lock.protocol import (
    GAVE_BACK,
    RELEASED,
    WITHDRAWN,
    AsyncClient,
    Grant,
    LockKeys,
    PollReply,
    Protocol,
    RenewReply,
    Script,
    as_text,
)
from redis_fifo_lock.renewal import Renewal
from redis_fifo_lock.timeouts import within
from redis_fifo_lock.waiting import Hub, Waiter, WaitGroup
from tests.adversarial.actors import cancelling, protocol_arguments

SCRIPTS = ("acquire", "claim", "release", "renew", "withdraw", "poll", "status")


class MutantOutdated(AssertionError):
    """A mutant's snippet is no longer in the core: update the mutant to the new code."""


@dataclass(frozen=True)
class Substitution:
    """Replace ``old`` (which must occur exactly once) by ``new`` in each of ``scripts``."""

    scripts: tuple[str, ...]
    old: str
    new: str


class SourceScript(Script):
    """A ``Script`` whose source text is given, not read from ``lua/``."""

    def __init__(self, filename: str, source: str) -> None:
        self.filename = filename
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


def lua_source(filename: str) -> str:
    """The text of ``redis_fifo_lock/lua/<filename>`` as the core ships it."""
    return (files("redis_fifo_lock") / "lua" / filename).read_text()


def substituted(mutant: str, script: str, edits: list[Substitution]) -> SourceScript:
    """The live source of ``script`` with ``edits`` applied, checked to apply exactly once."""
    source = Script(f"{script}.lua").source
    for edit in edits:
        found = source.count(edit.old)
        if found != 1:
            raise MutantOutdated(
                f"mutant {mutant!r}: expected the snippet {edit.old!r} once in {script}.lua "
                f"(with lib.lua), found it {found} times; the core changed - update "
                "tests/adversarial/mutants.py"
            )
        source = source.replace(edit.old, edit.new)
    return SourceScript(f"{script}.lua", source)


def require_source(mutant: str, function: object, snippet: str) -> None:
    """Fail loudly if the core function a Python mutant relies on no longer has ``snippet``."""
    source = inspect.getsource(function)  # type: ignore[arg-type]
    if snippet not in source:
        raise MutantOutdated(
            f"mutant {mutant!r}: {getattr(function, '__qualname__', function)} no longer "
            f"contains {snippet!r}; the core changed - update tests/adversarial/mutants.py"
        )


# --- Python mutants --------------------------------------------------------------------


class NoRenewalLock(FifoLock):
    """MUTANT renewal-never-started: the lease is handed out with no renewal at all
    (its local deadline is still the grant's, so it runs out under a live holder)."""

    def _start_lease(self, hub: Hub, waiter: Waiter, grant: Grant, sent: float) -> Lease:
        expires_at = sent + grant.pttl_ms / 1000
        lease = Lease(
            self.name, waiter.token, grant.fence, grant.ticket, expires_at, call=waiter.call
        )
        hub.leases[(self.keys, waiter.token)] = lease
        return lease


class NoDeadlineLease(Lease):
    """A lease that is lost only when someone says so: its ``expires_at`` is ignored."""

    @property
    def lost(self) -> bool:
        return self.lost_reason is not None


class UnboundedRenewalLock(FifoLock):
    """MUTANT renewal-unbounded: the holder learns that its lease ended only from
    Redis's replies. A renewal waits for its reply however long it takes, and the
    lease keeps no local deadline, so a holder cut off from Redis is told its lease
    is gone only when a reply finally comes, long after the lock moved on."""

    def _start_lease(self, hub: Hub, waiter: Waiter, grant: Grant, sent: float) -> Lease:
        lease = super()._start_lease(hub, waiter, grant, sent)
        lease.__class__ = NoDeadlineLease  # the mutation, part 1: no local deadline
        return lease

    async def _renew_once(self, hub: Hub, lease: Lease) -> RenewReply:
        call = asyncio.ensure_future(super()._renew_once(hub, lease))
        while True:
            try:
                return await asyncio.shield(call)
            except asyncio.CancelledError:
                if call.done():
                    return call.result()
                # the mutation, part 2: the bound on the reply (a cancellation) is ignored


_ACQUIRING: contextvars.ContextVar[asyncio.Task[Any] | None] = contextvars.ContextVar(
    "fifolock_mutant_acquiring", default=None
)


class CancelWithoutWithdrawLock(FifoLock):
    """MUTANT cancel-without-withdraw: a request cancelled while it waits in the
    queue (or after its grant landed) is not withdrawn.

    Timeouts still withdraw; only the cancellation path (which gives up while the
    acquiring task is being cancelled) skips it.
    """

    async def acquire(self, timeout: float | None = None, *, token: str | None = None) -> Lease:
        _ACQUIRING.set(asyncio.current_task())
        return await super().acquire(timeout, token=token)

    async def _give_up(self, hub: Hub, group: WaitGroup, waiter: Waiter) -> None:
        task = _ACQUIRING.get()
        if task is not None and cancelling(task):
            return  # the mutation: cancelled, and nothing is withdrawn
        await super()._give_up(hub, group, waiter)


class _ForgetfulHub:
    """A view of a ``Hub`` whose withdrawals of requests of unknown fate (ticket 0)
    are dropped; everything else goes to the hub."""

    def __init__(self, hub: Hub) -> None:
        self._hub = hub

    def __getattr__(self, name: str) -> Any:
        return getattr(self._hub, name)

    def withdraw(
        self, group: WaitGroup, token: str, ticket: int, call: str
    ) -> asyncio.Future[None]:
        if ticket == 0:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done  # the mutation: nothing is withdrawn, now or later
        return self._hub.withdraw(group, token, ticket, call)


class AbandoningLock(FifoLock):
    """MUTANT abandoned-not-withdrawn: an acquire whose script may have run but whose
    reply never came (RedisUnavailable, a timeout, a cancellation during the call)
    leaves its request in Redis: queued, or holding a grant nobody will use."""

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
        forgetful: Any = _ForgetfulHub(hub)
        return await super()._enqueue(forgetful, group, waiter, started, deadline, requeue=requeue)


class PausedRetryGroup(WaitGroup):
    """MUTANT poll-retry-paused: every failed poll waits ``RETRY_AFTER_ERROR_S``
    before the next, the first after an answered one too."""

    async def _poll_once(self) -> float:
        self._poll_failed = True
        return await super()._poll_once()


class PollForNobodyGroup(WaitGroup):
    """MUTANT polls-for-nobody: a poll is sent once it has a call slot, also when
    every waiter of its group left while it waited for one (before fcaf0c3):
    after a reconnection every group catches up with a poll, and those of
    cancelled waiters hold the hub's withdrawals and new acquires up."""

    async def _poll_once(self) -> float:
        sent = time.monotonic()
        try:
            reply = await self.hub.run(
                self.hub.calls,
                lambda client: self.protocol.poll(client, self.keys, self.session, self.settings),
            )
        except RedisUnavailable:
            return waiting_module.RETRY_AFTER_ERROR_S
        self._settle(reply, sent)
        return self.settings.poll_ms / 1000


class DoorbellOnlyGroup(WaitGroup):
    """MUTANT doorbell-only: the poll is removed; waiters rely on the doorbell alone."""

    async def _poll_once(self) -> float:
        return 3600.0  # never asks Redis: no liveness refresh, no grant, no re-queue


class RingKeepingGroup(WaitGroup):
    """Part of MUTANT lease-dated-from-ring: a ring's grant is kept for its waiter,
    stamped with the moment this process read it."""

    def ring(self, token: str, grant: Grant) -> None:
        waiter = self.waiters.get(token)
        if waiter is not None:
            waiter.rung = (grant, time.monotonic())  # type: ignore[attr-defined]
        super().ring(token, grant)


class RingDatedLock(FifoLock):
    """MUTANT lease-dated-from-ring: a waiter woken by a ring takes the ring as its
    grant, without claiming it: its lease lasts the ring's pttl from when the ring
    was read, however late that was (a busy event loop), and a forged ring is
    believed."""

    async def _claim(
        self, hub: Hub, group: WaitGroup, waiter: Waiter, started: float, deadline: float | None
    ) -> Lease | None:
        rung: tuple[Grant, float] | None = getattr(waiter, "rung", None)
        if rung is not None:
            waiter.rung = None  # type: ignore[attr-defined]
            grant, read_at = rung
            return self._start_lease(hub, waiter, grant, read_at)
        return await super()._claim(hub, group, waiter, started, deadline)


class UncheckedRingGroup(WaitGroup):
    """MUTANT ring-proof-unchecked: a ring naming the waiter's current acquire call
    is taken as its grant (dated from that call, as a signed one is) without
    checking its proof, so a forged ring is believed."""

    def ring(self, token: str, grant: Grant) -> None:
        waiter = self.waiters.get(token)
        if waiter is not None and grant.call == waiter.call:
            waiter.granted = (grant, waiter.sent_at)
        super().ring(token, grant)


class TextProofGroup(WaitGroup):
    """Part of MUTANT malformed-ring-ends-reader: a ring's proof is compared as
    text, and ``hmac.compare_digest`` raises ``TypeError`` on a non-ASCII str."""

    def ring(self, token: str, grant: Grant) -> None:
        hmac.compare_digest(grant.proof, "0" * 40)
        super().ring(token, grant)


class ProbelessDoorbell(Doorbell):
    """MUTANT probe-skipped: a wait that reuses a lingering channel trusts its
    kept connection without checking it, so rings lost on a connection that died
    silently wait for the group's first poll."""

    async def _send_probe(self, channel: str) -> None:
        return  # the mutation: no probe


class ConfirmBlindDoorbell(Doorbell):
    """MUTANT unconfirmed-subscribe-trusted: a new channel's SUBSCRIBE that
    goes unconfirmed, with nothing read from the connection, is waited for
    without end, so a reader stuck in redis-py's reconnection leaves every
    later wait of the process to its poll."""

    def _rebuild(self, silent: PubSub, what: str, waited_s: float) -> None:
        if what == "the probe":  # the mutation: only an unanswered probe rebuilds
            super()._rebuild(silent, what, waited_s)


class QuietTrustingDoorbell(Doorbell):
    """MUTANT quiet-subscription-trusted: a subscription that reads nothing
    while channels are watched is never probed, so a reader stuck in redis-py's
    reconnection leaves the waits already watching to their polls."""

    def _check_idle_later(self) -> None:
        return  # the mutation: a quiet connection is trusted


class UnboundedSendDoorbell(Doorbell):
    """MUTANT unbounded-pubsub-send: a SUBSCRIBE or UNSUBSCRIBE the doorbell
    sends waits as long as redis-py does, so a reconnection inside it whose
    handshake reply was lost holds the watch, and the doorbell's lock, for
    ever on a client with no socket_timeout."""

    async def _sent(self, command: Awaitable[object], timeout_s: float) -> bool:
        await command  # the mutation: no bound
        return True


class HastyIdleProbeDoorbell(Doorbell):
    """MUTANT slow-answer-taken-for-dead: the probe of a quiet subscription
    gets a starting wait's half second to be answered, so a slow link (or a
    busy loop) has the subscription rebuilt after every quiet period."""

    async def _send_probe(self, channel: str, answer_s: float = PROBE_TIMEOUT_S) -> bool:
        return await super()._send_probe(channel)  # the mutation: always PROBE_TIMEOUT_S


class ReconnectBlindDoorbell(Doorbell):
    """MUTANT reconnect-taken-for-answer: a reconnection of the subscription's
    connection by redis-py goes unnoticed, so while a probe is on its way the
    resubscription's confirmation of the probed channel is taken for the
    probe's answer, and a ring lost in the gap waits for a poll."""

    def _reconnected(self, connection: object) -> None:
        return  # the mutation: reconnections are not noticed


class UnguardedDoorbell(Doorbell):
    """Part of MUTANT malformed-ring-ends-reader: a ring's proof is passed on
    whatever its form, and a ring handler that raises ends the reader task, so
    every lock of the client waits for its poll until a new wait subscribes."""

    def _dispatch(self, message: dict[str, object], encoding: tuple[str, str]) -> None:
        ring = self._handlers.get(as_text(message["channel"], *encoding))
        if message["type"] != "message" or ring is None:
            super()._dispatch(message, encoding)
            return
        try:
            text = as_text(message["data"], *encoding)
            token, fence, ticket, pttl_ms, call, queued, proof = text.split(" ")
            grant = Grant(int(fence), int(ticket), int(pttl_ms), call, int(queued), proof)
        except ValueError:
            return
        ring(token, grant)


class ReadDatedRingGroup(WaitGroup):
    """MUTANT signed-ring-dated-at-read: a signed ring's lease is dated from when
    this process read the ring, not from when the waiter's acquire was sent, so a
    ring read late (a busy event loop) makes the lease outlive Redis's."""

    def ring(self, token: str, grant: Grant) -> None:
        super().ring(token, grant)
        waiter = self.waiters.get(token)
        if waiter is not None and waiter.granted is not None:
            waiter.granted = (waiter.granted[0], time.monotonic())


SPLIT_GAP_S = 0.03
"""MUTANT split-grant: time between its read and its write round trip - what a
slow network or a busy client gives any two round trips."""


class SplitGrantProtocol(Protocol):
    """MUTANT split-grant: the hand-off reads "is it free?" in one round trip and
    grants the head in a second one, as the peer implementation did.

    Every script runs with ``grant_next`` disabled; after each call that can free
    the lock or queue a request, ``EXISTS lease`` is read, and if the lock looked
    free a separate script grants the current head without checking again.
    """

    def __init__(self, **overrides: Script) -> None:
        super().__init__(**overrides)
        body = (
            "\nlocal now, now_us = clock()\n"
            "local keep_ms, caller = arguments(2)\n"
            "local g = grant_next(now, now_us, DOORBELL, caller, false)\n"
            "touch(tonumber(keep_ms))\n"
            "if g then return g end\nreturn false\n"
        )
        lib = lua_source("lib.lua")
        check = (
            "    if not lease_gone and redis.call('EXISTS', K_LEASE) == 1 then\n"
            "        return nil\n    end\n"
        )
        if lib.count(check) != 1:
            raise MutantOutdated(f"mutant 'split-grant': {check!r} not found once in lib.lua")
        self.scripts["grant"] = SourceScript("grant.lua", lib.replace(check, "") + body)

    async def _hand_off(
        self, client: AsyncClient, keys: LockKeys, keep_ms: int, caller: str = ""
    ) -> tuple[str, Grant] | None:
        """Round trip 1 reads, round trip 2 writes; returns (token, grant) if one was made."""
        try:
            free = not await client.exists(keys.key("lease"))
        except RedisError as exc:
            raise RedisUnavailable(keys.name, f"split-grant read failed: {exc}") from exc
        if not free:
            return None
        await asyncio.sleep(SPLIT_GAP_S)  # the gap between the two round trips
        reply = await self._call(client, keys, "grant", keep_ms, caller)
        if not reply:
            return None
        token = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        return token, Grant(int(reply[1]), int(reply[2]), int(reply[3]))

    async def acquire(self, *args: Any, **kwargs: Any) -> tuple[Grant | None, int, int, int]:
        grant, ticket, holder, pttl_ms = await super().acquire(*args, **kwargs)
        if grant is None:
            call = protocol_arguments(Protocol.acquire, args, kwargs)
            made = await self._hand_off(
                call["client"], call["keys"], call["settings"].keep_ms, call["token"]
            )
            if made is not None and made[0] == call["token"]:
                return made[1], made[1].ticket, made[1].fence, made[1].pttl_ms
        return grant, ticket, holder, pttl_ms

    async def release(self, *args: Any, **kwargs: Any) -> tuple[int, tuple[str, Grant] | None]:
        outcome, handover = await super().release(*args, **kwargs)
        if outcome == RELEASED:
            call = protocol_arguments(Protocol.release, args, kwargs)
            await self._hand_off(call["client"], call["keys"], call["keep_ms"])
        return outcome, handover

    async def withdraw(self, *args: Any, **kwargs: Any) -> int:
        outcome = await super().withdraw(*args, **kwargs)
        if outcome in (WITHDRAWN, GAVE_BACK):
            call = protocol_arguments(Protocol.withdraw, args, kwargs)
            await self._hand_off(call["client"], call["keys"], call["keep_ms"])
        return outcome

    async def poll(self, *args: Any, **kwargs: Any) -> PollReply:
        reply = await super().poll(*args, **kwargs)
        call = protocol_arguments(Protocol.poll, args, kwargs)
        await self._hand_off(call["client"], call["keys"], call["settings"].keep_ms)
        return reply


# --- the catalogue ---------------------------------------------------------------------


class LateEnteringCallIds(CallIds):
    """MUTANT call-id-entered-late: a call id is issued, and counted in flight
    only in a second step; another thread of the process that reads the lock's
    floor in between sends a floor past it, and Redis refuses the call as a
    late copy."""

    def start(self, keys: LockKeys) -> str:
        with self._guard:
            seq = self._next
            self._next += 1
        call = f"{self.process}/{seq:0{SEQ_DIGITS}x}"
        if seq % 2:
            # The mutation: other threads run before the call is entered - for
            # some calls only, as a thread switch would (one that delayed every
            # call alike would keep their order).
            time.sleep(0.002)
        self.enter(keys, call)
        return call


class ForgetfulClosingHub(Hub):
    """MUTANT owed-dropped-at-close: a closing event loop does not do what the
    lock still owes Redis on it: the release of a hold() and the withdrawal of a
    request whose tasks the loop's shutdown cancelled before they ran are
    dropped, and the lock waits for leases and liveness to run out."""

    async def finish(self) -> None:
        return  # the mutation: nothing owed is done


async def _swallowing_within(awaitable: Any, timeout_s: float) -> Any:
    """MUTANT cancel-swallowed, part 1: bounds an await with Python 3.10/3.11's
    ``asyncio.wait_for``, which loses a cancellation that meets the reply."""
    return await asyncio.wait_for(awaitable, timeout_s)


def _unbounded(client: AsyncClient, call: Any, waiting_s: float = 0.0) -> Any:
    """MUTANT call-unbounded: a call waits as long as the client lets it (for
    ever without a socket_timeout)."""
    return call


def _cancel_eating_bound(client: AsyncClient, call: Any, waiting_s: float = 0.0) -> Any:
    """MUTANT bound-eats-cancel: the lock bounds its calls with a timeout that
    takes every cancellation it meets at its expiry for its own, as
    ``async_timeout`` does on Python 3.10 (where a task cannot count them)."""
    return _eat_cancel(call, protocol_module.CALL_TIMEOUT_S + waiting_s)


async def _eat_cancel(call: Any, timeout_s: float) -> Any:
    task = asyncio.current_task()
    assert task is not None
    fired = False

    def fire() -> None:
        nonlocal fired
        fired = True
        task.cancel()

    handle = asyncio.get_running_loop().call_later(timeout_s, fire)
    try:
        return await call
    except asyncio.CancelledError:
        if not fired:
            raise
        while task.cancelling():  # the mutation: the caller's cancellation too
            task.uncancel()
        raise asyncio.TimeoutError from None
    finally:
        handle.cancel()


def _never_cancelling() -> bool:
    """MUTANT cancel-swallowed, part 2: a lost cancellation goes unnoticed."""
    return False


class LoopBoundHub(Hub):
    """MUTANT hub-outlives-loop: a closing event loop leaves its hubs' own tasks
    running: a doorbell subscription (or withdrawal) started by a task that the
    loop's shutdown cancelled is destroyed pending, and stays subscribed on a
    client the caller keeps."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        # Part of the mutation: the loop does not close this hub's doorbell
        # on its own either (as it does for a hub dropped with its client).
        loop_context().doorbells.discard(self.doorbell)

    async def aclose(self) -> None:
        return  # the mutation: nothing is stopped


class EveryWithdrawalEachRoundHub(Hub):
    """MUTANT withdrawals-all-each-round: every round of retries sends every owed
    withdrawal (up to ``MAX_WITHDRAWALS``) at once, however many fail: a long
    outage costs a connection attempt per owed withdrawal twice a second, and
    their tasks hold the lock's own calls up behind them."""

    async def _withdraw_round(self) -> bool:
        owed = list(self._withdrawals.items())
        results = await asyncio.gather(*(self._withdraw_one(w) for _, w in owed))
        for (key, withdrawal), done in zip(owed, results, strict=True):
            if done and self._withdrawals.get(key) is withdrawal:
                self._forget(key)
                waiting_module._settle(withdrawal)
        return all(results)


class WithdrawalFirstLock(FifoLock):
    """MUTANT retry-waits-for-withdrawal: a same-token retry made while its first
    request's withdrawal is owed waits for that withdrawal to land (across the
    outage) before it is sent: the request is withdrawn first, and the retry
    queues again at the back, behind later callers (the bug before b4d35fb)."""

    async def _enqueue(
        self,
        hub: Hub,
        group: WaitGroup,
        waiter: Waiter,
        started: float,
        deadline: float | None,
        *,
        requeue: bool,
    ) -> Any:
        if not requeue:
            owed = [
                withdrawal.done
                for key, withdrawal in hub._withdrawals.items()
                if key[0] == self.keys and key[1] == waiter.token
            ]
            if owed:
                left_s = None if deadline is None else deadline - asyncio.get_running_loop().time()
                await asyncio.wait(owed, timeout=left_s)
        return await super()._enqueue(hub, group, waiter, started, deadline, requeue=requeue)


class RetryTrustingHub(Hub):
    """MUTANT retry-drops-withdrawals: the withdrawals a same-token retry held back
    are dropped when the retry ends, also when it ended with no reply from
    Redis: the first request stays queued (or its grant held) with nobody
    waiting for it, and the lock stalls for a lease (the bug in b4d35fb)."""

    def retry_ended(self, keys: LockKeys, token: str, *, answered: bool) -> None:
        super().retry_ended(keys, token, answered=True)


async def _floor_for_each_call(
    awaitable: Any, started: float, deadline: float | None, *, floor_s: float
) -> Any:
    """MUTANT attempt-floor-each-call: every script call of an acquire is given
    its attempt floor however little of its timeout is left (the bug before
    this change): on a link slower than the lease, each call made again after
    a late grant carries ``acquire`` further past its timeout."""
    if deadline is None:
        return await awaitable
    left_s = deadline - asyncio.get_running_loop().time()
    return await within(awaitable, max(left_s, floor_s))


class ErrorEndsWithdrawerHub(Hub):
    """MUTANT withdrawer-dies-on-error: a withdrawal's call that fails with an
    error that is neither an outage nor Redis's answer (redis-py's
    ``AttributeError`` for a client closed while it writes) ends the task that
    sends the owed withdrawals: they wait for the next one (the bug before
    3bf7663)."""

    def _withdrawal_broke(self, withdrawal: Any, error: Exception) -> bool:
        raise error


class KeyJudgedRoundHub(Hub):
    """MUTANT round-judged-by-key: a round of withdrawals counts as failed when a
    key it began with is owed again at its end, though what is owed is a new
    request for a withdrawal that landed (an acquire given up by its timeout,
    then by its caller's cancellation): the hub pauses for
    ``RETRY_AFTER_ERROR_S`` and the withdrawals owed meanwhile wait (the bug
    before 8d736dd)."""

    async def _withdraw_round(self) -> bool:
        owed = [key for key, withdrawal in self._withdrawals.items() if not withdrawal.suspended]
        answered = await super()._withdraw_round()
        return answered and not any(key in self._withdrawals for key in owed)


class UnsentFailsHub(Hub):
    """MUTANT unsent-counts-as-failed: a withdrawal the hub did not send, or cut
    short, for a same-token retry (see ``Hub.reclaim``) counts as a failed
    try: the withdrawals of its lock owed meanwhile wait ``RETRY_AFTER_ERROR_S``
    (the bug before 5eb32de, and in its case of a retry that ends at once, when
    a failure paused the whole hub)."""

    async def _withdraw_one(self, withdrawal: Any) -> bool:
        failures = withdrawal.failures
        done = await super()._withdraw_one(withdrawal)
        if not done and withdrawal.failures == failures:
            self._failed_try(withdrawal)
        return done


class FailurePausesAllHub(Hub):
    """MUTANT failure-pauses-all: a round of withdrawals in which one try failed
    pauses every withdrawal for ``RETRY_AFTER_ERROR_S``, also when Redis
    answered the others and the failure is about one lock's keys: a lock whose
    withdrawals keep failing holds up every other lock's (the bug before this
    change)."""

    async def _withdraw_round(self) -> bool:
        owed = [withdrawal for withdrawal in self._withdrawals.values() if not withdrawal.suspended]
        failures = sum(withdrawal.failures for withdrawal in owed)
        answered = await super()._withdraw_round()
        return answered and sum(withdrawal.failures for withdrawal in owed) == failures


def _only_wrongtype_about_keys(error: BaseException | None) -> bool:
    """MUTANT script-error-server-wide: only WRONGTYPE is taken for an error about
    a lock's keys; a script's Lua failing on what it read there is taken for
    one about all of Redis, and pauses every withdrawal (the bug before this
    change)."""
    return isinstance(error, ResponseError) and "WRONGTYPE" in str(error)


class WaitForWithdrawerHub(Hub):
    """MUTANT withdrawer-wait-for: the withdrawer waits for its next try with
    Python 3.10/3.11's ``asyncio.wait_for``, which loses a cancellation that
    comes once the awaited event is set: a loop closing just as a new
    withdrawal woke it, while one lock's withdrawal keeps failing, never
    closes (the bug in e4d39eb)."""

    async def _wait_for_next_try(self, wait_s: float) -> None:
        with suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._owed_anew.wait(), wait_s)


def _subclasses_about_keys(error: BaseException | None) -> bool:
    """MUTANT subclass-errors-about-keys: any error whose text places it inside a
    script (``user_script:``) and names no server-wide code is taken for one
    about the lock's keys, also the ``OutOfMemoryError`` and ``ReadOnlyError``
    that redis-py raises with the code cut off: an OOM makes every round try
    every lock's oldest withdrawal (the bug in 07ec95d)."""
    if not isinstance(error, ResponseError):
        return False
    text = str(error)
    return "WRONGTYPE" in text or (
        "user_script:" in text
        and not any(code in text.split() for code in waiting_module.SERVER_ERRORS)
    )


@dataclass(frozen=True)
class Mutant:
    """One deliberately broken lock (or, for ``REAL``, the lock itself)."""

    name: str
    summary: str
    lua: tuple[Substitution, ...] = ()
    lock_class: type[FifoLock] = FifoLock
    protocol_class: type[Protocol] = Protocol
    group_class: type[WaitGroup] | None = None
    doorbell_class: type[Doorbell] | None = None
    hub_class: type[Hub] | None = None
    call_ids_class: type[CallIds] | None = None
    patches: tuple[tuple[Any, str, Any], ...] = ()
    requires: tuple[tuple[object, str], ...] = field(default=())

    def check(self) -> None:
        """Build every part once, so an outdated mutant fails before any scenario runs."""
        for function, snippet in self.requires:
            require_source(self.name, function, snippet)
        self.protocol()

    def protocol(self) -> Protocol:
        """The scripts of this variant, as a ``Protocol``."""
        by_script: dict[str, list[Substitution]] = {}
        for edit in self.lua:
            for script in edit.scripts:
                by_script.setdefault(script, []).append(edit)
        overrides = {
            script: substituted(self.name, script, edits) for script, edits in by_script.items()
        }
        return self.protocol_class(**overrides)

    def lock(self, client: Redis, name: str, **settings: int) -> FifoLock:
        """A lock of this variant on ``client`` (settings as for ``FifoLock``)."""
        lock = self.lock_class(client, name, **settings)
        if self.lua or self.protocol_class is not Protocol:
            lock._protocol = self.protocol()
        return lock

    @contextmanager
    def installed(self) -> Iterator[None]:
        """Swap in this variant's ``WaitGroup``, ``Doorbell`` and ``Hub`` classes,
        its process-wide ``CallIds`` and its ``patches`` (module, name, value)
        (if any) while the block runs."""
        swaps = {
            "WaitGroup": self.group_class,
            "Doorbell": self.doorbell_class,
            "Hub": self.hub_class,
        }
        originals = {name: getattr(waiting_module, name) for name in swaps}
        for name, replacement in swaps.items():
            if replacement is not None:
                setattr(waiting_module, name, replacement)
        call_ids = calls_module._call_ids
        if self.call_ids_class is not None:
            calls_module._call_ids = self.call_ids_class()
        patched = [(module, name, getattr(module, name)) for module, name, _ in self.patches]
        for module, name, replacement in self.patches:
            setattr(module, name, replacement)
        try:
            yield
        finally:
            for name, original in originals.items():
                setattr(waiting_module, name, original)
            calls_module._call_ids = call_ids
            for module, name, original in patched:
                setattr(module, name, original)


def _all(old: str, new: str) -> Substitution:
    """A substitution in ``lib.lua``'s text, so in every script."""
    return Substitution(SCRIPTS, old, new)


REAL = Mutant("real", "the lock as shipped")

MUTANTS: dict[str, Mutant] = {
    mutant.name: mutant
    for mutant in (
        Mutant(
            "grant-not-head",
            "acquire takes a free lock for the caller without checking it heads the queue",
            lua=(
                Substitution(
                    ("acquire",),
                    "local granted = not held[1] and grant_next(now, now_us, doorbell, token, "
                    "false, true)",
                    "local granted = nil\n"
                    "if redis.call('EXISTS', K_LEASE) == 0 then -- MUTANT grant-not-head\n"
                    "    redis.call('ZREM', K_QUEUE, token)\n"
                    "    redis.call('HDEL', K_WAITERS, token)\n"
                    "    local last = redis.call('HGET', K_COUNTERS, 'fence')\n"
                    "    local fence = next_number(last, now_us)\n"
                    "    redis.call('HSET', K_LEASE, 'token', token, 'fence', int(fence),\n"
                    "        'ticket', int(ticket), 'session', session, 'call', call,\n"
                    "        'deadline', int(now + max_hold_ms))\n"
                    "    redis.call('PEXPIRE', K_LEASE, lease_ms)\n"
                    "    redis.call('HSET', K_COUNTERS, 'fence', int(fence), 'holder', token,\n"
                    "        'holder_call', call)\n"
                    "    granted = {token, fence, ticket, lease_ms}\n"
                    "end",
                ),
            ),
        ),
        Mutant(
            "split-grant",
            "the grant is a read round trip (is it free?) then a write round trip (grant)",
            lua=(
                _all(
                    "local function grant_next(now, now_us, doorbell, caller_token, "
                    "caller_session, lease_gone)\n",
                    "local function grant_next(now, now_us, doorbell, caller_token, "
                    "caller_session, lease_gone)\n"
                    "    do return nil end -- MUTANT split-grant: granted from Python\n",
                ),
            ),
            protocol_class=SplitGrantProtocol,
        ),
        Mutant(
            "release-no-owner-check",
            "release frees the lock whoever holds it",
            lua=(
                Substitution(
                    ("release",),
                    "if held[1] == token and tonumber(held[2]) == fence and held[3] == call then",
                    "if held[1] then -- MUTANT release-no-owner-check",
                ),
            ),
        ),
        Mutant(
            "release-trusts-lease-gone",
            "release hands the lock on without looking at the lease: a re-sent "
            "release, or one of a lost lease, grants over a live holder",
            lua=(
                Substitution(
                    ("release",),
                    "grant_next(now, now_us, doorbell, false, session)",
                    "grant_next(now, now_us, doorbell, false, session, true) -- MUTANT",
                ),
            ),
        ),
        Mutant(
            "renew-no-owner-check",
            "renewal extends whatever lease exists",
            lua=(
                Substitution(
                    ("renew",),
                    "if held[1] ~= token or tonumber(held[2]) ~= fence then",
                    "if not held[1] then -- MUTANT renew-no-owner-check",
                ),
            ),
        ),
        Mutant(
            "fence-not-incremented",
            "the hand-off in release reuses the last fence instead of issuing a new one",
            lua=(
                Substitution(
                    ("release",),
                    "local fence = next_number(last[3], now_us)",
                    "local fence = tonumber(last[3]) or 0 -- MUTANT",
                ),
            ),
        ),
        Mutant(
            "fence-restarts-at-1",
            "tickets and fences are last + 1 with no clock: once the keys are gone "
            "(expired, FLUSHDB) they restart at 1",
            lua=(
                _all(
                    "return math.max((tonumber(last) or 0) + 1, now_us)",
                    "return (tonumber(last) or 0) + 1 -- MUTANT",
                ),
            ),
        ),
        Mutant(
            "cancel-without-withdraw",
            "a request cancelled while queued (or once granted) is not withdrawn",
            lock_class=CancelWithoutWithdrawLock,
            requires=(
                (FifoLock._acquire, "except asyncio.CancelledError"),
                (FifoLock._acquire, "self._give_up("),
                (FifoLock._give_up, "hub.withdraw("),
            ),
        ),
        Mutant(
            "retry-waits-for-withdrawal",
            "a same-token retry waits for its first request's owed withdrawal to land",
            lock_class=WithdrawalFirstLock,
            requires=((FifoLock._enqueue, "hub.reclaim(self.keys, waiter.token)"),),
        ),
        Mutant(
            "retry-drops-withdrawals",
            "the withdrawals a retry held back are dropped though the retry got no reply",
            hub_class=RetryTrustingHub,
            requires=(
                (FifoLock._enqueue, "hub.retry_ended(self.keys, waiter.token, answered=False)"),
            ),
        ),
        Mutant(
            "withdrawals-all-each-round",
            "each round of retries while Redis is unreachable sends every owed withdrawal",
            hub_class=EveryWithdrawalEachRoundHub,
            requires=(
                (Hub._withdraw_pending, "await self._withdraw_round()"),
                (Hub._withdraw_round, "len(withdrawn) >= WITHDRAW_PROBES_PER_ROUND"),
            ),
        ),
        Mutant(
            "attempt-floor-each-call",
            "every script call of an acquire gets ATTEMPT_FLOOR_S, however little of its "
            "timeout is left",
            patches=((lock_module, "_within", _floor_for_each_call),),
            requires=((FifoLock._claim, "await _within("),),
        ),
        Mutant(
            "withdrawer-dies-on-error",
            "a withdrawal's call failing with an unexpected error ends the withdrawer task",
            hub_class=ErrorEndsWithdrawerHub,
            requires=((Hub._withdraw_one, "return self._withdrawal_broke(withdrawal, exc)"),),
        ),
        Mutant(
            "round-judged-by-key",
            "a round of withdrawals fails when a key it landed is owed again at its end",
            hub_class=KeyJudgedRoundHub,
            requires=((Hub._withdraw_round, "return _failures(owed) == failures"),),
        ),
        Mutant(
            "unsent-counts-as-failed",
            "a withdrawal not sent, or cut short, for a same-token retry counts as failed",
            hub_class=UnsentFailsHub,
            requires=((Hub._withdrawal_failed, "self._failed_try(withdrawal)"),),
        ),
        Mutant(
            "failure-pauses-all",
            "a failed withdrawal pauses every lock's withdrawals, though Redis answered",
            hub_class=FailurePausesAllHub,
            requires=((Hub._withdraw_round, "return True  # Redis answers"),),
        ),
        Mutant(
            "script-error-server-wide",
            "a withdrawal's script failing on its lock's data is taken for Redis failing",
            patches=((waiting_module, "_about_its_keys", _only_wrongtype_about_keys),),
            requires=((waiting_module._about_its_keys, '"user_script:" in text'),),
        ),
        Mutant(
            "withdrawer-wait-for",
            "the withdrawer waits for its next try with asyncio.wait_for (3.10, 3.11)",
            hub_class=WaitForWithdrawerHub,
            requires=((Hub._wait_for_next_try, "due = self.loop.call_later("),),
        ),
        Mutant(
            "subclass-errors-about-keys",
            "an OOM or READONLY met inside a script is taken for an error about its keys",
            patches=((waiting_module, "_about_its_keys", _subclasses_about_keys),),
            requires=((waiting_module._about_its_keys, "type(error) is ResponseError"),),
        ),
        Mutant(
            "abandoned-not-withdrawn",
            "an acquire whose fate is unknown (no reply: RedisUnavailable, timeout, "
            "cancellation during the call) is never withdrawn",
            lock_class=AbandoningLock,
            requires=(
                (FifoLock._enqueue, "hub.withdraw(group, waiter.token, 0, waiter.call)"),
                (FifoLock._enqueue, "await asyncio.shield(self._give_up(hub, group, waiter))"),
            ),
        ),
        Mutant(
            "withdraw-keeps-grant",
            "a request cancelled after its grant landed keeps the grant (no give-back)",
            lua=(
                Substitution(
                    ("withdraw",),
                    "elseif held[1] == token and is_this(held[3], tonumber(held[2]), held[4]) then",
                    "elseif false then -- MUTANT withdraw-keeps-grant",
                ),
            ),
        ),
        Mutant(
            "withdraw-by-token-alone",
            "withdraw ignores the ticket and the session: a late withdraw gives away a "
            "later request (or grant) of the same token",
            lua=(
                Substitution(
                    ("withdraw",),
                    "local function is_this(its_session, its_ticket, its_call)\n",
                    "local function is_this(its_session, its_ticket, its_call)\n"
                    "    do return true end -- MUTANT withdraw-by-token-alone\n",
                ),
            ),
        ),
        Mutant(
            "history-by-count",
            "the record of finished requests keeps the last 64 entries, not those "
            "their processes still speak of",
            lua=(
                _all(
                    "    redis.call('ZADD', K_FINISHED, '0', record)\n",
                    "    redis.call('ZADD', K_FINISHED, '0', record)\n"
                    "    redis.call('ZREMRANGEBYRANK', K_FINISHED, 0, -65) -- MUTANT\n",
                ),
            ),
        ),
        Mutant(
            "young-loss-swept",
            "a floor sweeps every record below it, also a loss recorded a moment ago: "
            "a floor sent while the request waited, read after its grant was lost, "
            "turns the holder's LeaseLost into 'already released'",
            lua=(
                _all(
                    "        if not lost_at or lost_at < now - keep_ms then\n",
                    "        if true then -- MUTANT young-loss-swept\n",
                ),
            ),
        ),
        Mutant(
            "held-unvouched",
            "a floor's held requests are taken as told, also one Redis has no grant "
            "or record of: a copy sent during a hold, read after the release, makes a "
            "re-sent release answer lease-lost",
            lua=(
                _all(
                    "            held = vouched(session, held, old[4])\n",
                    "            held = held -- MUTANT held-unvouched\n",
                ),
            ),
        ),
        Mutant(
            "resent-release-no-handover",
            "a re-sent release answers 'already released' without the hand-over its "
            "first copy made to a waiter of the same process (in a reply that was lost)",
            lua=(
                Substitution(
                    ("release",),
                    "if result == 0 then\n    -- A re-sent release",
                    "if false then -- MUTANT resent-release-no-handover\n    -- A re-sent release",
                ),
            ),
        ),
        Mutant(
            "kept-held-swept",
            "a floor below the kept one sweeps the records of requests the kept one "
            "lists as held: a late copy sent before their grant makes a re-sent clean "
            "release answer lease-lost",
            lua=(
                _all(
                    "        for seq in pairs(old[4]) do\n            spared[seq] = true\n",
                    "        for seq in pairs({}) do -- MUTANT kept-held-swept\n"
                    "            spared[seq] = true\n",
                ),
            ),
        ),
        Mutant(
            "granted-taken-as-settled",
            "a request below its process's floor counts as settled even when it is "
            "the grant no script ended: the release of a lease that ran out, "
            "composed before its process knew of the grant, answers 'already released'",
            lua=(
                _all(
                    "        if unended_grant_call() == call then\n",
                    "        if false then -- MUTANT granted-taken-as-settled\n",
                ),
            ),
        ),
        Mutant(
            "floor-ignored",
            "records below a session's floor are dropped, but a late copy of a call "
            "below the floor is not refused: it queues an ended request again",
            lua=(
                _all(
                    "    if floor and seq < floor[1] and not floor[4][seq] then\n",
                    "    if false then -- MUTANT floor-ignored\n",
                ),
            ),
        ),
        Mutant(
            "no-dead-waiter-skipping",
            "the hand-off treats every queued waiter as alive",
            lua=(
                _all(
                    "local alive_until = waiter and tonumber(redis.call('ZSCORE', K_ALIVE, "
                    "waiter[1]))",
                    "local alive_until = waiter and now + waiter[2] -- MUTANT",
                ),
            ),
        ),
        Mutant(
            "pubsub-races-unhandled",
            "the doorbell takes only connection errors for a broken subscription, not "
            "the RuntimeError / AttributeError redis-py raises when a SUBSCRIBE and the "
            "reader meet its reconnection",
            patches=((doorbell_module, "PUBSUB_FAILURES", doorbell_module.FAILURES),),
        ),
        Mutant(
            "poll-retry-paused",
            "a poll that met a dead pooled connection waits RETRY_AFTER_ERROR_S before "
            "it is tried again, though the next call would open a new connection",
            group_class=PausedRetryGroup,
            requires=((WaitGroup._poll_once, "if not self._poll_failed:"),),
        ),
        Mutant(
            "polls-for-nobody",
            "a poll is sent though every waiter of its group left while it waited for a call slot",
            group_class=PollForNobodyGroup,
            requires=((WaitGroup._poll_once, "if not self.waiters:"),),
        ),
        Mutant(
            "doorbell-only",
            "waiting processes never poll; only the doorbell wakes them",
            group_class=DoorbellOnlyGroup,
            requires=((WaitGroup._poll_loop, "await self._poll_once()"),),
        ),
        Mutant(
            "lease-dated-from-ring",
            "a rung waiter takes the ring as its grant without claiming it, dating its "
            "lease from when it read the ring",
            lock_class=RingDatedLock,
            group_class=RingKeepingGroup,
            requires=(
                (FifoLock._acquire, "await self._claim("),
                (WaitGroup.ring, "waiter.hint()"),
            ),
        ),
        Mutant(
            "call-id-entered-late",
            "a call id is issued, then counted in flight in a second step: a floor "
            "read on another thread in between passes it",
            call_ids_class=LateEnteringCallIds,
            requires=((CallIds.start, "self.enter(keys, call)"),),
        ),
        Mutant(
            "hub-outlives-loop",
            "a closing event loop leaves its hubs' doorbell readers, subscriptions "
            "and withdrawers running",
            hub_class=LoopBoundHub,
            requires=(
                (Hub.aclose, "await self.doorbell.aclose()"),
                (Hub.__init__, "loop_context().doorbells.add(self.doorbell)"),
            ),
        ),
        Mutant(
            "owed-dropped-at-close",
            "a closing event loop drops the releases and withdrawals its shutdown "
            "cancelled before they ran",
            hub_class=ForgetfulClosingHub,
            requires=((Hub.finish, "self._owed()"),),
        ),
        Mutant(
            "call-unbounded",
            "the lock leaves its calls to the client's socket_timeout, which a client may not have",
            patches=((protocol_module, "bounded", _unbounded),),
            requires=((Protocol._call, "await bounded("),),
        ),
        Mutant(
            "bound-eats-cancel",
            "the lock's call bound takes a cancellation of the caller that meets its "
            "expiry for its own expiry (async_timeout on Python 3.10)",
            patches=((protocol_module, "bounded", _cancel_eating_bound),),
            requires=((Protocol._call, "await bounded("),),
        ),
        Mutant(
            "cancel-swallowed",
            "renewals bound their call with asyncio.wait_for and never look for a "
            "cancellation lost on the way",
            patches=(
                (renewal_module, "within", _swallowing_within),
                (renewal_module, "cancelling", _never_cancelling),
            ),
            requires=((Renewal._run, "await within("), (Renewal._run, "cancelling()")),
        ),
        Mutant(
            "ring-proof-unchecked",
            "a ring naming the waiter's acquire call is its grant, proof unchecked",
            group_class=UncheckedRingGroup,
            requires=((WaitGroup.ring, "if waiter.signed(grant):"),),
        ),
        Mutant(
            "malformed-ring-ends-reader",
            "a ring whose proof is not ASCII makes its handler raise, and the raise "
            "ends the doorbell's reader: waiters fall back to their poll",
            group_class=TextProofGroup,
            doorbell_class=UnguardedDoorbell,
            requires=(
                (Doorbell._dispatch, "if not _PROOF.fullmatch(proof):"),
                (Doorbell._dispatch, "except Exception:"),
            ),
        ),
        Mutant(
            "probe-skipped",
            "a wait on a lingering doorbell channel trusts its kept connection without "
            "a check: rings lost on a connection that died silently wait for a poll",
            doorbell_class=ProbelessDoorbell,
            requires=((Doorbell.watch, "await self._send_probe(channel)"),),
        ),
        Mutant(
            "unconfirmed-subscribe-trusted",
            "a new doorbell channel's SUBSCRIBE left unconfirmed by a connection that "
            "reads nothing is waited for without end: rings wait for polls",
            doorbell_class=ConfirmBlindDoorbell,
            requires=((Doorbell.watch, 'self._rebuild(pubsub, "a SUBSCRIBE"'),),
        ),
        Mutant(
            "quiet-subscription-trusted",
            "a doorbell subscription that reads nothing while channels are watched is "
            "never probed: a reader stuck in a reconnection leaves waits to their polls",
            doorbell_class=QuietTrustingDoorbell,
            requires=((Doorbell.watch, "self._check_idle_later()"),),
        ),
        Mutant(
            "unbounded-pubsub-send",
            "a doorbell SUBSCRIBE or UNSUBSCRIBE waits as long as redis-py does: a "
            "reconnection inside it with a lost handshake holds every watch up for ever",
            doorbell_class=UnboundedSendDoorbell,
            requires=((Doorbell._sent, "await within(command, timeout_s)"),),
        ),
        Mutant(
            "slow-answer-taken-for-dead",
            "the idle probe of a quiet doorbell subscription must be answered within "
            "PROBE_TIMEOUT_S: a slow link is rebuilt after every quiet period",
            doorbell_class=HastyIdleProbeDoorbell,
            requires=((Doorbell._probe_idle, "IDLE_PROBE_TIMEOUT_S"),),
        ),
        Mutant(
            "reconnect-taken-for-answer",
            "a reconnection of the doorbell's connection while a probe is on its way "
            "goes unnoticed: its confirmation is taken for the probe's answer",
            doorbell_class=ReconnectBlindDoorbell,
            requires=((Doorbell._track, "register(self._reconnected)"),),
        ),
        Mutant(
            "signed-ring-dated-at-read",
            "a signed ring's lease is dated from when the ring was read",
            group_class=ReadDatedRingGroup,
            requires=((WaitGroup.ring, "waiter.granted = (grant, waiter.sent_at)"),),
        ),
        Mutant(
            "renewal-never-started",
            "the holder never renews its lease",
            lock_class=NoRenewalLock,
            requires=(
                (FifoLock._enqueue, "self._lease_if_in_time("),
                (FifoLock._lease_if_in_time, "self._start_lease("),
            ),
        ),
        Mutant(
            "renewal-unbounded",
            "a renewal waits for its reply past the lease's expiry, and the lease has "
            "no local deadline",
            lock_class=UnboundedRenewalLock,
            requires=(
                (Renewal._run, "lock._renew_once("),
                (Lease, "time.monotonic() >= self.expires_at"),
            ),
        ),
        Mutant(
            "max-hold-ignored",
            "renewal ignores the max_hold_ms deadline",
            lua=(
                Substitution(("renew",), "if remaining <= 0 then", "if false then -- MUTANT"),
                Substitution(
                    ("renew",), "local ttl = math.min(lease_ms, remaining)", "local ttl = lease_ms"
                ),
            ),
        ),
        Mutant(
            "acquire-not-idempotent",
            "a re-sent acquire with the same token takes a new ticket at the back",
            lua=(
                Substitution(
                    ("acquire",),
                    "local ticket = queued\n",
                    "local ticket = nil -- MUTANT acquire-not-idempotent\n",
                ),
            ),
        ),
    )
}


def variant(name: str) -> Mutant:
    """The mutant called ``name``, or ``REAL`` for ``"real"``."""
    if name == REAL.name:
        return REAL
    try:
        return MUTANTS[name]
    except KeyError:
        raise ValueError(f"no mutant {name!r}; known: {', '.join(MUTANTS)}") from None
