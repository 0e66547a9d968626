"""``SyncFifoLock``: the FIFO lock for threads and sync code.

There is no second implementation: every call runs the asyncio ``FifoLock`` on
a background event loop (the portal), one per process, in a daemon thread named
``fifolock-portal``. The portal's loop keeps renewing a lease while the sync
caller's critical section runs, and uses its own client (from ``LoopClients``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from .clients import LoopClients
from .errors import LockUsageError
from .lease import Lease, LockStatus
from .lock import FifoLock
from .protocol import AsyncClient
from .settings import LockSettings, check_name

T = TypeVar("T")

CANCEL_GRACE_S = 5.0
"""Seconds an interrupted sync call waits for its withdrawal to reach Redis."""


class Portal:
    """An event loop in a daemon thread that runs coroutines for sync callers."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="fifolock-portal", daemon=True
        )
        self.thread.start()

    def call(
        self,
        name: str,
        func: Callable[[], Coroutine[Any, Any, T]],
        undo: Callable[[T], Coroutine[Any, Any, object]] | None = None,
    ) -> T:
        """Run ``func()`` on the portal loop and return its result in this thread.

        If this thread is interrupted while waiting (KeyboardInterrupt, a signal
        handler raising, Celery's soft time limit), the coroutine is cancelled
        and given up to ``CANCEL_GRACE_S`` seconds to clean up (withdraw from
        the queue) first. If it had already finished, its result never reaches
        the caller, so ``undo(result)`` runs instead (e.g. releasing a lease
        that was granted just as the caller was interrupted).

        Raises:
            LockUsageError: when called from the portal thread itself.
        """
        if threading.current_thread() is self.thread:
            raise LockUsageError(
                name,
                "the sync lock was called from its own event-loop thread, where it would "
                "deadlock; in async code use FifoLock and await it",
            )
        # The task is created and watched on the loop (not through a
        # concurrent future, whose cancel() would drop a result that lands at
        # the same moment), so an interrupted caller can see how it ended.
        # A bare lock, released when the task ends: unlike threading.Event (a
        # Condition underneath), acquiring it can be interrupted by a signal
        # handler's exception without corrupting its state.
        finished = threading.Lock()
        finished.acquire()
        started: list[asyncio.Task[T]] = []
        abandoned = False

        def start() -> None:
            if abandoned:
                return
            task = self.loop.create_task(func())
            task.add_done_callback(lambda _: finished.release())
            started.append(task)

        def abandon() -> None:
            nonlocal abandoned
            abandoned = True
            if started:
                started[0].cancel()
            else:
                finished.release()  # interrupted before the task began: nothing to wait for

        try:
            self.loop.call_soon_threadsafe(start)
            finished.acquire()
        except BaseException:
            # Callbacks run in order: abandon() runs after start() if that was queued.
            self.loop.call_soon_threadsafe(abandon)
            if not (started and started[0].done()):
                finished.acquire(timeout=CANCEL_GRACE_S)
            task = started[0] if started else None
            succeeded = task is not None and task.done() and not task.cancelled()
            if undo is not None and task is not None and succeeded and task.exception() is None:
                undone = asyncio.run_coroutine_threadsafe(undo(task.result()), self.loop)
                concurrent.futures.wait([undone], timeout=CANCEL_GRACE_S)
            raise
        return started[0].result()


_portal: Portal | None = None
_portal_pid = 0
_portal_guard = threading.Lock()


def _after_fork_in_child() -> None:
    # A fork while another thread held the guard would leave it locked forever
    # in the child; the parent's portal thread does not exist there either.
    global _portal_guard, _portal
    _portal_guard = threading.Lock()
    _portal = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def portal() -> Portal:
    """The portal of this process, started on first use (and again after fork)."""
    global _portal, _portal_pid
    with _portal_guard:
        if _portal is None or _portal_pid != os.getpid():
            _portal, _portal_pid = Portal(), os.getpid()
        return _portal


class SyncFifoLock:
    """The FIFO lock for threads and synchronous code.

    Args:
        connection: a Redis URL (str) or a ``LoopClients`` to share connection
            settings; the portal loop builds its own client from it.
        name: the lock name (str), as for ``FifoLock``.
        lease_ms, poll_ms, max_hold_ms: as for ``FifoLock`` (milliseconds).

    Raises:
        ValueError: naming the setting, for a bad name or settings.

    Methods mirror ``FifoLock`` without ``await``; ``timeout`` is in seconds.
    Safe to share between threads: ownership is the returned ``Lease``.
    """

    def __init__(
        self,
        connection: str | LoopClients,
        name: str,
        *,
        lease_ms: int = 60_000,
        poll_ms: int = 30_000,
        max_hold_ms: int = 1_800_000,
    ) -> None:
        self.name = check_name(name)
        self.settings = LockSettings(lease_ms=lease_ms, poll_ms=poll_ms, max_hold_ms=max_hold_ms)
        self.clients = (
            connection if isinstance(connection, LoopClients) else LoopClients(connection)
        )
        self._core: tuple[AsyncClient, FifoLock] | None = None

    def __repr__(self) -> str:
        return f"<SyncFifoLock {self.name!r} lease_ms={self.settings.lease_ms}>"

    def _lock(self) -> FifoLock:
        """The core lock on the running (portal) loop's client, built once per client."""
        client = self.clients.client()
        core = self._core
        if core is None or core[0] is not client:
            settings = self.settings
            core = self._core = (
                client,
                FifoLock(
                    client,
                    self.name,
                    lease_ms=settings.lease_ms,
                    poll_ms=settings.poll_ms,
                    max_hold_ms=settings.max_hold_ms,
                ),
            )
        return core[1]

    def acquire(self, timeout: float | None = None, *, token: str | None = None) -> Lease:
        """Block until granted; see ``FifoLock.acquire`` (same arguments and errors)."""

        async def run() -> Lease:
            return await self._lock().acquire(timeout, token=token)

        async def give_back(lease: Lease) -> None:
            await self._lock().release(lease)

        return portal().call(self.name, run, undo=give_back)

    def release(self, lease: Lease) -> None:
        """Release ``lease``; see ``FifoLock.release`` (same errors)."""

        async def run() -> None:
            await self._lock().release(lease)

        portal().call(self.name, run)

    def status(self) -> LockStatus:
        """A snapshot of the lock; see ``FifoLock.status``."""

        async def run() -> LockStatus:
            return await self._lock().status()

        return portal().call(self.name, run)

    @contextmanager
    def hold(self, timeout: float | None = None, *, token: str | None = None) -> Iterator[Lease]:
        """``with lock.hold(timeout=5) as lease:`` acquire, run the block, release.

        The lease is renewed by the portal while the block runs.
        """
        lease = self.acquire(timeout, token=token)
        try:
            yield lease
        finally:
            self.release(lease)
