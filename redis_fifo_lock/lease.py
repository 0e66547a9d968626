"""What a holder gets back: the ``Lease``, and ``LockStatus`` for onlookers."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import metrics
from .errors import LeaseLost, LockUsageError, RedisUnavailable

if TYPE_CHECKING:
    from .renewal import Renewal


class Lease:
    """Proof that the caller holds a lock, returned by ``acquire()``.

    Ownership travels with this object: only the holder of the ``Lease`` can
    release or renew the grant, never another task that shares the lock object.

    Its state (``expires_at``, ``lost``, ``releasing``, ``released``) changes
    only through its own methods, which the lock and the renewal
    (``redis_fifo_lock.renewal``) call; the holder reads it.

    Attributes:
        name: the lock name (str).
        token: the request token (str) this grant answered.
        fence: fencing token (int), strictly increasing with every grant of this
            lock name. Pass it to the resource you protect so it can reject a
            holder whose lease expired while it was frozen.
        ticket: arrival order (int) of the request at Redis; grants of one name
            are made in ticket order.
        expires_at: the holder's own deadline, in ``time.monotonic()`` seconds
            (float): when the lease ends unless renewed. Counted from the moment
            the script call that granted (or last renewed) it was *sent*, so it
            is never later than Redis's expiry of the grant, however late the
            reply was read. ``lost`` is True from then on.
        call: id (str) of the acquire call the grant answered,
            ``"<session>/<seq>"``: it names the request in Redis's record of
            ended requests (``redis_fifo_lock.calls``).
        pid: id (int) of the process that acquired the lease. Only that process
            can release it: a child forked while the lease was held inherits
            this object but not the hold, and releasing it there raises
            ``LockUsageError`` without touching Redis.
    """

    def __init__(
        self,
        name: str,
        token: str,
        fence: int,
        ticket: int,
        expires_at: float = math.inf,
        *,
        call: str = "-",
        pid: int | None = None,
    ) -> None:
        self.name = name
        self.token = token
        self.fence = fence
        self.ticket = ticket
        self.expires_at = expires_at
        self.call = call
        self.pid = os.getpid() if pid is None else pid
        self.lost_reason: str | None = None
        self._released = False
        self._releasing = False
        self._release_asked = False
        self._lost_when_asked = False
        self._lost_waiters: list[asyncio.Future[None]] = []
        self._renewal: Renewal | None = None

    @property
    def released(self) -> bool:
        """True once Redis confirmed the release of this lease (bool)."""
        return self._released

    @property
    def releasing(self) -> bool:
        """True from the start of a release (bool): a renewal refused from then on
        says nothing about the lease. False again if the release failed."""
        return self._releasing

    @property
    def release_asked(self) -> bool:
        """True once its holder asked for its release (bool), whatever came of
        it, and also while that release goes on in the background: the lease
        is no longer renewed, so it ends within ``lease_ms`` even if the
        release never reaches Redis. Its holder no longer holds it as far as
        reentry is concerned (see ``reentry.Claim.active``)."""
        return self._release_asked

    def asked_to_release(self) -> None:
        """Its holder asked for its release (see ``release_asked``); callable
        from any thread. Whether the lease was lost by then is kept (see
        ``lost_while_held``)."""
        if not self._release_asked:
            self._lost_when_asked = self.lost
        self._release_asked = True

    @property
    def lost_while_held(self) -> bool:
        """True if the lease was already lost when its holder first asked for its
        release (bool): the block may have overlapped another holder's. A lease
        that ran out later, while its release could not reach Redis, was not
        lost while held."""
        return self._lost_when_asked

    def unreleased(self, failure: RedisUnavailable) -> LeaseLost | None:
        """The error a release that could not reach Redis (``failure``) raises
        instead, if the lease was lost while held: a ``LeaseLost`` saying so,
        for that is what the holder must hear; None otherwise (the release
        raises ``failure``, and can be tried again)."""
        if not self._lost_when_asked:
            return None
        return self.lost_error(
            f"its release could not reach Redis ({failure.reason}), and Redis frees the lock "
            "by itself"
        )

    def lost_error(self, then: str) -> LeaseLost:
        """The ``LeaseLost`` of this lease, given up for lost while held, saying
        what came of its release (``then``, str)."""
        return LeaseLost(
            self.name,
            f"lease fence {self.fence} had been given up for lost while held "
            f"({self.lost_reason}); {then}; the critical section may have overlapped with "
            "another holder",
            fence=self.fence,
            token=self.token,
        )

    @property
    def lost(self) -> bool:
        """True once Redis refused a renewal, or the lease's ``expires_at`` passed
        before it was released (renewals unanswered, or the event loop blocked,
        for that long): the lock may already belong to someone else. Readable
        from any thread. ``lost_reason`` (str) says why."""
        if self.lost_reason is None and not self._released and time.monotonic() >= self.expires_at:
            self.mark_lost("its lease ran out before it was renewed or released")
        return self.lost_reason is not None

    # --- transitions: for the lock and the renewal, not for the holder ---------

    def renewing(self, renewal: Renewal) -> None:
        """``renewal`` keeps the lease alive from now on (on its loop)."""
        self._renewal = renewal

    def renewed(self, expires_at: float) -> None:
        """A renewal succeeded: the lease now ends at ``expires_at``
        (``time.monotonic()`` seconds, counted from when the renewal was sent)."""
        self.expires_at = expires_at

    def lose(self, reason: str) -> bool:
        """A renewal found the lease gone (``reason``, str): mark it lost, unless
        its release has started - a renewal that ran on after it (its
        cancellation swallowed by Python 3.10/3.11's ``wait_for``, bpo-42130, or
        one on another loop) is refused by Redis, which says nothing about the
        lease. Returns whether it was marked lost."""
        if self._releasing:
            return False
        self.mark_lost(reason)
        return True

    def begin_release(self) -> asyncio.Task[None] | None:
        """A release starts: stop renewing (see ``Renewal.stop``). Returns the
        renewal task it cancelled on the running loop, if one ran, for the
        release to wait for once Redis answered."""
        self._releasing = True
        return None if self._renewal is None else self._renewal.stop()

    def release_failed(self) -> None:
        """The release did not reach Redis: the lease is still held (no longer
        renewed), and can be released again."""
        self._releasing = False

    def mark_released(self) -> None:
        """Redis confirmed the release."""
        self._released = True

    def mark_lost(self, reason: str) -> None:
        """Record that the lease is lost (first reason wins). For the lock's use;
        callable from any thread."""
        if self.lost_reason is None:
            self.lost_reason = reason
            metrics.lease_lost(self)
            waiters, self._lost_waiters = self._lost_waiters, []
            for waiter in waiters:
                with contextlib.suppress(RuntimeError):  # its loop closed: nobody waits
                    waiter.get_loop().call_soon_threadsafe(_wake, waiter)

    async def wait_lost(self) -> None:
        """Return when the lease is lost; useful to cancel work that must stop.
        Works on any event loop, whichever loop renews the lease."""
        if self.lost:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._lost_waiters.append(waiter)
        if self.lost:  # lost between the check and the append, on another thread
            return
        try:
            await waiter
        finally:
            with contextlib.suppress(ValueError):
                self._lost_waiters.remove(waiter)

    def check_owner(self) -> None:
        """Raise unless called in the process that acquired the lease.

        Raises:
            LockUsageError: naming the lock, in any other process (a child
                forked while the lease was held): the hold is the parent's.
        """
        if self.pid != os.getpid():
            raise LockUsageError(
                self.name,
                f"lease fence {self.fence} was acquired by process {self.pid}, and this is "
                f"process {os.getpid()} (forked while it was held); only the acquiring "
                "process can release it - nothing was changed in Redis",
            )

    def __repr__(self) -> str:
        state = "lost" if self.lost else "released" if self.released else "held"
        return (
            f"<Lease {self.name!r} fence={self.fence} ticket={self.ticket} "
            f"token={self.token!r} {state}>"
        )


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


@dataclass(frozen=True)
class LockStatus:
    """A snapshot of a lock, from ``FifoLock.status()``.

    Attributes:
        name: the lock name (str).
        held: whether someone holds the lock now (bool).
        last_fence: the last fence ever granted for this name (int; 0 if never;
            the holder's own fence is ``holder_fence``).
        waiting: how many requests are queued (int; may include waiters whose
            process died and that will be skipped at the next hand-off).
        holder_fence: fence (int) of the current holder, None when not held.
        holder_ticket: ticket (int) of the current holder, None when not held.
        lease_left_ms: milliseconds (int) before the current lease expires
            unless renewed, None when not held.
        holder: what the current holder recorded about itself (str: host,
            process id, and the task, command or request path where the
            integration knows it; at most 256 bytes, no control characters), ""
            if it recorded nothing, None when not held. For people to read:
            anyone who can write to Redis can write it, so never decide on it.
        live_waiting: how many of the ``waiting`` requests belong to a process
            that is still alive (int): it refreshed its liveness within the
            last ``lease_ms``.
        known: False when Redis has no key of this lock at all (bool): the name
            was never used, or has been idle longer than ``keep_ms``.
    """

    name: str
    held: bool
    last_fence: int
    waiting: int
    holder_fence: int | None = None
    holder_ticket: int | None = None
    lease_left_ms: int | None = None
    holder: str | None = None
    live_waiting: int = 0
    known: bool = True
