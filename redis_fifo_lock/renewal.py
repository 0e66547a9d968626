"""A lease's background renewal: ``Renewal``, started by ``start_renewal``.

A holder renews its lease every ``lease_ms / 3`` through its hub's ``urgent``
lane (never behind enqueues and polls), each renewal bounded by the lease's
remaining life: a holder cut off from Redis learns that it lost the lock
(``lease.lost``, ``wait_lost``) when its lease runs out, never later. A lease
acquired through a ``LoopClients`` is handed over to the process's portal loop
when its own loop closes, and renewed there until released.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import weakref
from typing import TYPE_CHECKING

from .alarms import alarms
from .errors import RedisUnavailable
from .loops import loop_context
from .portal import is_portal_loop, portal
from .protocol import RENEWED, RenewReply
from .timeouts import cancelling, within
from .waiting import Hub, hub_for

if TYPE_CHECKING:
    from .lease import Lease
    from .lock import FifoLock

log = logging.getLogger("redis_fifo_lock")

RENEW_REPLY_FLOOR_S = 0.05
"""Shortest wait for a renewal's reply, in seconds, even when the lease is about
to end (at ``max_hold_ms`` Redis's answer says why)."""
RENEW_RETRY_S = 0.5
"""Pause before a renewal that could not reach Redis is tried again, in seconds."""
RENEWAL_END_RECHECK_S = 0.02
"""Seconds between checks, after a release, that its cancelled renewal ended."""
RENEWAL_END_WAIT_S = 1.0
"""Longest wait, in seconds, of a release for its cancelled renewal to end."""
CLOCK_STEP_S = 0.25
"""Margin, in seconds: a refused renewal is put down to a step of Redis's clock
only if by this process's clock the lease still had this long to live."""


def start_renewal(lock: FifoLock, hub: Hub, lease: Lease, first_at: float) -> None:
    """Renew ``lease`` of ``lock`` through ``hub`` (of the running loop), first at
    ``first_at`` (``time.monotonic()`` seconds)."""
    hub.leases[(lock.keys, lease.token)] = lease
    lease.renewing(Renewal(lock, lease, hub, first_at))


class Renewal:
    """The background renewal of one lease: an alarm (see ``alarms``) until the
    first renewal is due, then a task running the renewals until the lease is
    released or lost.

    An alarm costs a fraction of a task (and of a timer of its own), and most
    holds end before their first renewal (a third of ``lease_ms``), so a grant
    and its release create no task and arm no timer. Created on the loop that
    renews (the running one).

    Args:
        lock: the ``FifoLock`` that granted the lease.
        lease: the ``Lease`` to keep alive.
        hub: the ``Hub`` whose ``urgent`` lane the renewals take.
        first_at: when the first renewal is due, in ``time.monotonic()`` seconds.
    """

    def __init__(self, lock: FifoLock, lease: Lease, hub: Hub, first_at: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.lock = lock
        # Weakly: a lease its caller dropped without releasing it (a sync
        # caller interrupted just as acquire returned, say) can be released by
        # nobody else; the renewal must not keep it, and so the lock, for ever.
        self._lease = weakref.ref(lease)
        self._grant = (lease.token, lease.fence, lease.call)
        self.first_at = first_at
        self.granted_at = time.monotonic()  # the grant's reply is in hand now
        self._hub = hub
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._alarms = alarms(self.loop)
        self._alarms.set(self.loop, self.loop.time() + first_at - time.monotonic(), self._fire)
        weakref.finalize(lease, self._dropped)
        if lock.clients is not None and not is_portal_loop(self.loop):
            loop_context().renewals.add(self)

    @property
    def lease(self) -> Lease | None:
        """The lease renewed, or None once its holder dropped it."""
        return self._lease()

    def _fire(self) -> None:
        if not self._stopped:
            self._task = self.loop.create_task(self._run())

    def _dropped(self) -> None:
        # The lease was garbage-collected, in any thread. Unless it was released
        # or lost (the renewal stopped then), its lock is still held for it:
        # release it on the renewing loop.
        if self._stopped or self.loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            self.loop.call_soon_threadsafe(self._release_dropped)

    def _release_dropped(self) -> None:
        if self._stopped:
            return
        self.stop()
        token, fence, call = self._grant
        log.warning(
            "FIFO lock %r: the lease of fence %d was dropped without being released "
            "(garbage-collected while held); releasing it now. Release every lease, "
            "or use hold() / a with block",
            self.lock.name,
            fence,
        )
        self._hub.duty(
            ("dropped", self.lock.keys, token),
            functools.partial(self.lock._release_dropped, self._hub, token, fence, call),
        )

    def stop(self) -> asyncio.Task[None] | None:
        """Stop renewing, from a coroutine or callback on any loop: no renewal
        starts from now on, and a running one is cancelled (its reply, if any,
        is ignored). On the renewing loop, returns the cancelled task, if one
        ran, for the caller to await. From another loop, the renewing loop
        stops it soon and None is returned (a renewal cut off then never reads
        its reply, and Redis refuses a renewal that runs after the release); a
        closed renewing loop (an ``async_to_sync`` call's) renews nothing."""
        if self.loop is not asyncio.get_running_loop():
            if not self.loop.is_closed():
                with contextlib.suppress(RuntimeError):  # closed meanwhile: nothing runs there
                    self.loop.call_soon_threadsafe(self.stop)
            return None
        self._stopped = True
        self._alarms.cancel(self._fire)
        if self._task is not None:
            self._task.cancel()
        return self._task

    async def hand_over(self) -> None:
        """The renewing loop is closing: renew the lease on the portal loop from now on."""
        lease = self.lease
        if self._stopped or lease is None or lease.released or lease.lost:
            return
        running = self.stop()
        if running is not None:
            await asyncio.gather(running, return_exceptions=True)
        portal().call_soon(lambda: self._resume_on_portal(lease))

    def _resume_on_portal(self, lease: Lease) -> None:
        if not (lease.releasing or lease.lost):
            start_renewal(self.lock, hub_for(self.lock.client), lease, time.monotonic())

    async def _run(self) -> None:
        """Keep the lease alive until released; mark it lost when Redis refuses,
        or when its ``expires_at`` passes with no renewal answered."""
        lock = self.lock
        settings = lock.settings
        interval = settings.renew_every_s
        next_at = self.first_at
        failure = "no reply"  # why the latest renewals failed, for the loss's reason
        replied_at = self.granted_at  # when the latest reply (the grant's, at first) was read
        capped = False  # the last renewal was cut short by the max-hold deadline
        renewed: tuple[float, RenewReply] | None = None  # the last renewal: (sent, reply)
        while True:
            lease = self._lease()
            if lease is None:
                return  # dropped: see _dropped
            # Never past the lease's own deadline: a retry pause after a failed
            # renewal must not let the lease lapse unnoticed (``wait_lost``).
            due = min(next_at, lease.expires_at)
            del lease  # not kept while asleep: its holder may drop it
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            lease = self._lease()
            if lease is None:
                return
            sent = time.monotonic()
            self._warn_if_late(sent - max(due, replied_at), replied_at - due)
            if sent >= lease.expires_at:
                self._lose(
                    f"max_hold_ms ({settings.max_hold_ms}) reached"
                    if capped
                    else f"no renewal succeeded before the lease expired ({failure})",
                )
                return
            try:
                # Bounded by the lease's remaining life: a holder cut off from
                # Redis must learn it lost the lock when the lease expires, not
                # whenever the client's own timeouts give up.
                reply = await within(
                    lock._renew_once(self._hub, lease),
                    max(RENEW_REPLY_FLOOR_S, lease.expires_at - sent),
                )
            except (RedisUnavailable, asyncio.TimeoutError) as exc:
                replied_at = time.monotonic()
                if self._stopped or cancelling():
                    raise asyncio.CancelledError from None  # see below
                # NotReplicated has no redis-py cause: its message says why.
                failure = str(getattr(exc, "cause", None) or getattr(exc, "message", failure))
                next_at = time.monotonic() + min(RENEW_RETRY_S, interval)
                continue
            if self._stopped or cancelling():
                # Stopped or cancelled while the renewal was on its way, and the
                # cancellation lost below (redis-py can swallow one): carrying
                # on would keep a closing loop waiting for this task for ever.
                raise asyncio.CancelledError
            if reply.outcome != RENEWED:
                self._lose(
                    f"max_hold_ms ({settings.max_hold_ms}) reached"
                    if reply.outcome != 0
                    else "Redis refused the renewal: the lease expired or was taken"
                    + clock_step_note(renewed, reply.server_ms)
                )
                return
            replied_at = time.monotonic()
            renewed = (sent, reply)
            lease.renewed(sent + reply.pttl_ms / 1000)
            capped = reply.pttl_ms < settings.lease_ms
            next_at = sent + min(interval, reply.pttl_ms / 2000)
            del lease

    def _warn_if_late(self, loop_late_s: float, reply_late_s: float) -> None:
        """Warn if this renewal runs more than a third of a lease late, naming why:
        it ran ``loop_late_s`` seconds after it was due and the reply before it
        (the grant's, or the last renewal's) was read (the event loop ran
        nothing meanwhile), or that reply was read ``reply_late_s`` seconds
        after the renewal was due."""
        lock = self.lock
        bound_s = lock.settings.lease_ms / 3000
        if loop_late_s > bound_s:
            log.warning(
                "FIFO lock %r: lease renewal ran %.1f s late (lease_ms is %d); the "
                "event loop was blocked - raise lease_ms or stop blocking the loop",
                lock.name,
                loop_late_s,
                lock.settings.lease_ms,
            )
        elif reply_late_s > bound_s:
            log.warning(
                "FIFO lock %r: lease renewal ran %.1f s late (lease_ms is %d): the reply "
                "to the grant or to the last renewal came that late (Redis or the "
                "network slow, or this event loop busy) - check Redis's latency, or "
                "raise lease_ms",
                lock.name,
                reply_late_s,
                lock.settings.lease_ms,
            )

    def _lose(self, reason: str) -> None:
        self._stopped = True  # nothing to release if it is dropped now
        lease = self.lease
        if lease is not None and lease.lose(reason):
            name, fence = self.lock.name, lease.fence
            log.warning("FIFO lock %r: lease fence %d lost: %s", name, fence, reason)


def clock_step_note(renewed: tuple[float, RenewReply] | None, server_ms: int) -> str:
    """Why a refused renewal came, when Redis's clock says so: ``renewed`` is the
    last successful renewal (``time.monotonic()`` when it was sent, and Redis's
    reply), ``server_ms`` the server's clock at the refusal, whose reply is read
    now. The note (else "") says that Redis's clock was stepped ahead when by
    it the lease had run out since that renewal, and by this process's clock it
    could not have, by over ``CLOCK_STEP_S``: Redis expires keys by its clock,
    so the step ended the lease early."""
    if renewed is None:
        return ""
    sent, reply = renewed
    local_s = time.monotonic() - sent
    server_s = (server_ms - reply.server_ms) / 1000
    lease_s = reply.pttl_ms / 1000
    if server_s < lease_s or local_s > lease_s - CLOCK_STEP_S:
        return ""
    return (
        f" early: Redis's clock moved {server_s:.1f} s since the last renewal, this "
        f"process's {local_s:.1f} s; the server's clock was stepped ahead, and Redis "
        "expires keys by it - keep it synchronised by slewing (NTP), not stepping"
    )


async def end_renewal(task: asyncio.Task[None]) -> None:
    """Wait for the cancelled renewal ``task`` of a released lease to end, for at
    most ``RENEWAL_END_WAIT_S`` seconds.

    On Python 3.10 and 3.11, ``asyncio.wait_for`` swallows a cancellation that
    arrives as the call it waits for completes (bpo-42130): the renewal then
    carries on and sleeps until its next renewal is due (``lease_ms / 3``).
    So the task is cancelled again whenever it is found still running; its
    next await (that sleep) ends it. Past the bound the task is left to end by
    itself: Redis refuses a renewal of a released lease, and a refusal after
    the release does not mark the lease lost.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + RENEWAL_END_WAIT_S
    while not task.done() and loop.time() < deadline:
        task.cancel()
        await asyncio.wait({task}, timeout=RENEWAL_END_RECHECK_S)
