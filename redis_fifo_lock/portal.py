"""The portal: one event loop per process, in a daemon thread, for sync callers.

``SyncFifoLock`` runs every call of the asyncio ``FifoLock`` on it, and a lease
whose own event loop closes before it is released (as after an
``async_to_sync`` call) is renewed there until released.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .errors import LockUsageError

T = TypeVar("T")

CANCEL_GRACE_S = 5.0
"""Seconds an interrupted sync call waits for its withdrawal to reach Redis."""


class Portal:
    """An event loop in a daemon thread that runs coroutines for sync callers.

    The loop, its thread and every task it runs for a caller live in empty
    ``contextvars`` contexts, never in a caller's: a task copies the context it
    is created in, and a callback or socket handler registered on the loop
    keeps the context it was registered in for as long as it stays registered
    (the loop's own wake-up pipe, a connection kept in a pool: for good). The
    context variables of a request that used the lock (ids, tracing spans, the
    objects they hold) are freed when the request ends.
    """

    def __init__(self) -> None:
        self.loop = contextvars.Context().run(asyncio.new_event_loop)
        self.thread = threading.Thread(
            target=contextvars.Context().run,
            args=(self.loop.run_forever,),
            name="fifolock-portal",
            daemon=True,
        )
        self.thread.start()

    def call_soon(self, callback: Callable[[], object]) -> None:
        """Run ``callback()`` on the portal loop, in an empty context; callable
        from any thread."""
        self.loop.call_soon_threadsafe(callback, context=contextvars.Context())

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
        the queue) first. If it finishes with a result anyway (it had finished
        already, or its cancellation was swallowed and it ran on), that result
        never reaches the caller, so ``undo(result)`` runs instead, however late
        (e.g. releasing a lease that was granted just as the caller was
        interrupted).

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
        # Bare locks, released when the task ends (and when an abandoned one was
        # undone): unlike threading.Event (a Condition underneath), acquiring
        # one can be interrupted by a signal handler's exception without
        # corrupting its state - a corrupted Event hung the portal thread.
        finished = threading.Lock()
        finished.acquire()
        undone = threading.Lock()  # released once the abandoned task is dealt with
        undone.acquire()
        started: list[asyncio.Task[T]] = []
        abandoned = False

        def start() -> None:
            if abandoned:
                return
            task = self.loop.create_task(func())
            task.add_done_callback(lambda _: finished.release())
            started.append(task)

        def give_back(task: asyncio.Task[T]) -> None:
            # Whenever the abandoned task ends - also long after its cancellation
            # was swallowed (Python 3.10's wait_for can do that) - a result that
            # never reaches the caller is undone (a late grant is released).
            if undo is None or task.cancelled() or task.exception() is not None:
                undone.release()
                return
            undoing = contextvars.Context().run(self.loop.create_task, undo(task.result()))
            undoing.add_done_callback(lambda _: undone.release())

        def abandon() -> None:
            nonlocal abandoned
            abandoned = True
            if not started:
                finished.release()  # interrupted before the task began: nothing to wait for
                undone.release()
                return
            started[0].add_done_callback(give_back)
            started[0].cancel()

        try:
            self.call_soon(start)
            finished.acquire()
        except BaseException:
            # Callbacks run in order: abandon() runs after start() if that was queued.
            self.call_soon(abandon)
            if not (started and started[0].done()):
                finished.acquire(timeout=CANCEL_GRACE_S)
            undone.acquire(timeout=CANCEL_GRACE_S)
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


def is_portal_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """True if ``loop`` is this process's portal loop (never starts the portal)."""
    return _portal is not None and _portal_pid == os.getpid() and _portal.loop is loop


def portal() -> Portal:
    """The portal of this process, started on first use (and again after fork)."""
    global _portal, _portal_pid
    with _portal_guard:
        if _portal is None or _portal_pid != os.getpid():
            _portal, _portal_pid = Portal(), os.getpid()
        return _portal
