"""The portal: one event loop per process, in a daemon thread, for sync callers.

``SyncFifoLock`` runs every call of the asyncio ``FifoLock`` on it, and a lease
whose own event loop closes before it is released (as after an
``async_to_sync`` call) is renewed there until released.

Under gevent's or eventlet's monkey-patching (Celery's ``--pool gevent`` or
``--pool eventlet``) the portal is still a real OS thread, started with the
unpatched ``_thread`` and running its loop on the unpatched ``select`` (see
``native``): a greenlet portal would share the hub with the callers, so a body
that blocks the hub (a CPU-bound loop, a C driver) would stop the renewals and
lose its lease, and every greenlet of the process would see the portal's loop
as its running loop (``asyncio.run()`` failing in unrelated code). A calling
greenlet waits for the portal's answer on its own hub (``GeventSignal``,
``EventletSignal``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import importlib
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

from . import native
from .errors import LockUsageError

T = TypeVar("T")

CANCEL_GRACE_S = 5.0
"""Seconds an interrupted sync call waits for its withdrawal to reach Redis."""
REARM_S = 1.0
"""Seconds between two registrations of an ``EventletWaker``'s pipe with the hub."""


class Signal(Protocol):
    """Released once by any thread; acquired (waited for) by the caller."""

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Wait until released (at most ``timeout`` seconds if not -1); whether it was."""

    def release(self) -> None:
        """Wake the waiter; callable from any thread."""


def _unreleased_lock() -> Signal:
    """A bare lock, acquired: unlike ``threading.Event`` (a Condition underneath),
    acquiring one can be interrupted by a signal handler's exception without
    corrupting its state - a corrupted Event hung the portal thread."""
    lock = threading.Lock()
    lock.acquire()
    return lock


class GeventSignal:
    """A ``Signal`` for a greenlet: released from the portal's OS thread through
    an async watcher of the greenlet's hub (a patched lock released from another
    thread leaves an idle hub nothing to wait for: ``LoopExit``)."""

    def __init__(self) -> None:
        gevent: Any = importlib.import_module("gevent")  # untyped, and optional
        self._event: Any = importlib.import_module("gevent.event").Event()
        self._watcher: Any = gevent.get_hub().loop.async_()
        self._watcher.start(self._fired)

    def _fired(self) -> None:
        self._watcher.close()
        self._event.set()

    def release(self) -> None:
        """Wake the waiter; callable from any thread."""
        self._watcher.send()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Wait in this greenlet until released (at most ``timeout`` s if not -1)."""
        return bool(self._event.wait(None if timeout == -1 else timeout))


class EventletWaker:
    """Wakes the green threads of one eventlet hub from any OS thread: a pipe
    whose reading green thread sends the events queued for it (eventlet has no
    thread-safe way into a hub; ``eventlet.tpool`` does the same)."""

    def __init__(self) -> None:
        self._eventlet: Any = importlib.import_module("eventlet")  # untyped, and optional
        self._pending: list[Any] = []  # eventlet Events to send
        self._guard = native.lock()
        self._pid = os.getpid()
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._os: Any = importlib.import_module("eventlet.patcher").original("os")
        self._hubs: Any = importlib.import_module("eventlet.hubs")
        self._eventlet.spawn(self._dispatch)

    def _dispatch(self) -> None:
        while True:
            # Re-armed every REARM_S: a forked child shares the hub's epoll, and
            # its copy of this wait unregisters the pipe there when it ends.
            with contextlib.suppress(self._eventlet.Timeout):
                self._hubs.trampoline(self._read, read=True, timeout=REARM_S)
            if os.getpid() != self._pid:
                return  # a forked child's copy: the wake-ups are the parent's
            with contextlib.suppress(BlockingIOError):
                self._os.read(self._read, 4096)
            with self._guard:
                pending, self._pending = self._pending, []
            for event in pending:
                event.send(True)

    def wake(self, event: Any) -> None:
        """Send ``event`` (an eventlet ``Event`` of this hub) soon; from any thread."""
        with self._guard:
            self._pending.append(event)
        with contextlib.suppress(BlockingIOError):  # full: a wake-up is pending anyway
            self._os.write(self._write, b"\0")


_wakers: dict[tuple[int, int], EventletWaker] = {}
"""The ``EventletWaker`` of each (process, hub), by the hub's id (hubs live for good)."""


class EventletSignal:
    """A ``Signal`` for an eventlet green thread: released from the portal's OS
    thread through its hub's ``EventletWaker``."""

    def __init__(self) -> None:
        hub = importlib.import_module("eventlet.hubs").get_hub()
        place = (os.getpid(), id(hub))
        with _wakers_guard:
            waker = _wakers.get(place)
            if waker is None:
                waker = _wakers[place] = EventletWaker()
        self._waker = waker
        self._event: Any = importlib.import_module("eventlet.event").Event()

    def release(self) -> None:
        """Wake the waiter; callable from any thread."""
        self._waker.wake(self._event)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Wait in this green thread until released (at most ``timeout`` s if not -1)."""
        return bool(self._event.wait(None if timeout == -1 else timeout))


class NativeThreadExecutor(concurrent.futures.ThreadPoolExecutor):
    """The portal loop's default executor under gevent or eventlet: each call in
    an OS thread of its own (a patched ``ThreadPoolExecutor`` would start
    greenlets of the portal thread's hub, which never runs: ``getaddrinfo``
    would hang)."""

    def __init__(self, start_new_thread: Callable[..., object]) -> None:
        super().__init__(max_workers=1)  # starts nothing: submit() is its own
        self._start = start_new_thread

    def submit(
        self, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[T]:
        """Run ``fn(*args, **kwargs)`` in a new OS thread; its future."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                future.set_exception(exc)

        self._start(run, ())
        return future


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
        self.thread: threading.Thread | None = None
        library = native.green()
        if library is None:
            self.loop = contextvars.Context().run(asyncio.new_event_loop)
            self.thread = threading.Thread(
                target=contextvars.Context().run,
                args=(self.loop.run_forever,),
                name="fifolock-portal",
                daemon=True,
            )
            self.thread.start()
            self.ident = self.thread.ident
            self._get_ident: Callable[[], int] = threading.get_ident
            self._signal: Callable[[], Signal] = _unreleased_lock
            return
        # Under gevent or eventlet: an OS thread all the same (see the module).
        natives = native.natives(library)
        self._get_ident = natives.get_ident
        self.loop = contextvars.Context().run(asyncio.SelectorEventLoop, natives.selector())
        self.loop.set_default_executor(NativeThreadExecutor(natives.start_new_thread))
        self._signal = GeventSignal if library == "gevent" else EventletSignal
        self.ident = natives.start_new_thread(contextvars.Context().run, (self.loop.run_forever,))

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
        if self._get_ident() == self.ident:
            raise LockUsageError(
                name,
                "the sync lock was called from its own event-loop thread, where it would "
                "deadlock; in async code use FifoLock and await it",
            )
        # The task is created and watched on the loop (not through a
        # concurrent future, whose cancel() would drop a result that lands at
        # the same moment), so an interrupted caller can see how it ended.
        # Signals (bare locks, or the green ones: see Signal), released
        # when the task ends (and when an abandoned one was undone).
        finished = self._signal()
        undone: Signal | None = None  # released once the abandoned task is dealt with
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
            signal = undone
            assert signal is not None  # made before abandon() was scheduled
            if undo is None or task.cancelled() or task.exception() is not None:
                signal.release()
                return
            undoing = contextvars.Context().run(self.loop.create_task, undo(task.result()))
            undoing.add_done_callback(lambda _: signal.release())

        def abandon() -> None:
            nonlocal abandoned
            abandoned = True
            assert undone is not None  # made before abandon() was scheduled
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
            undone = self._signal()
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
_wakers_guard = native.lock()


def _after_fork_in_child() -> None:
    # A fork while another thread held the guard would leave it locked forever
    # in the child; the parent's portal thread does not exist there either.
    global _portal_guard, _portal, _wakers_guard
    _portal_guard = threading.Lock()
    _wakers_guard = native.lock()
    _portal = None
    _wakers.clear()


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
