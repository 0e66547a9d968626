"""What a holder gets back: the ``Lease``, and ``LockStatus`` for onlookers."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from .errors import LockUsageError


class Lease:
    """Proof that the caller holds a lock, returned by ``acquire()``.

    Ownership travels with this object: only the holder of the ``Lease`` can
    release or renew the grant, never another task that shares the lock object.

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
        self.released = False
        self.releasing = False  # set when release() starts: later refusals are expected
        self.lost_reason: str | None = None
        self._lost_waiters: list[asyncio.Future[None]] = []
        self._renewal: Renewal | None = None

    @property
    def lost(self) -> bool:
        """True once Redis refused a renewal, or the lease's ``expires_at`` passed
        before it was released (renewals unanswered, or the event loop blocked,
        for that long): the lock may already belong to someone else. Readable
        from any thread. ``lost_reason`` (str) says why."""
        if self.lost_reason is None and not self.released and time.monotonic() >= self.expires_at:
            self.mark_lost("its lease ran out before it was renewed or released")
        return self.lost_reason is not None

    def mark_lost(self, reason: str) -> None:
        """Record that the lease is lost (first reason wins). For the lock's use;
        callable from any thread."""
        if self.lost_reason is None:
            self.lost_reason = reason
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


class Renewal:
    """The background renewal of one lease: a timer until the first renewal is
    due, then a task running ``start()``.

    A timer costs a fraction of a task, and most holds end before their first
    renewal (a third of ``lease_ms``), so a grant and its release create no task
    at all. Use only on ``loop``'s thread.

    Args:
        loop: the event loop that renews.
        first_at: when the first renewal is due, in ``time.monotonic()`` seconds.
        start: called with this object when the first renewal is due; returns
            the renewal coroutine.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        first_at: float,
        start: Callable[[Renewal], Coroutine[Any, Any, None]],
    ) -> None:
        self.loop = loop
        self.first_at = first_at
        self._start = start
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._timer = loop.call_later(max(0.0, first_at - time.monotonic()), self._fire)

    def _fire(self) -> None:
        if not self._stopped:
            self._task = self.loop.create_task(self._start(self))

    @property
    def stopped(self) -> bool:
        """True once ``cancel()`` was called (the lease is being released)."""
        return self._stopped

    def cancel(self) -> asyncio.Task[None] | None:
        """Stop renewing: no renewal starts from now on, and a running one is
        cancelled (its reply, if any, is ignored). Returns the cancelled task, if
        one ran, for the caller to await."""
        self._stopped = True
        self._timer.cancel()
        if self._task is not None:
            self._task.cancel()
        return self._task


@dataclass(frozen=True)
class LockStatus:
    """A snapshot of a lock, from ``FifoLock.status()``.

    Attributes:
        name: the lock name (str).
        held: whether someone holds the lock now (bool).
        fence: the last fence ever granted for this name (int; 0 if never).
        waiting: how many requests are queued (int; may include waiters whose
            process died and that will be skipped at the next hand-off).
        holder_fence: fence (int) of the current holder, None when not held.
        holder_ticket: ticket (int) of the current holder, None when not held.
        lease_left_ms: milliseconds (int) before the current lease expires
            unless renewed, None when not held.
    """

    name: str
    held: bool
    fence: int
    waiting: int
    holder_fence: int | None = None
    holder_ticket: int | None = None
    lease_left_ms: int | None = None
