"""The OS's own threads and locks, even in a process gevent or eventlet monkey-patched.

Under Celery's ``--pool gevent`` or ``--pool eventlet`` the worker patches
``threading``: a thread it starts is a greenlet (green thread) of the hub, and
a ``threading.Lock`` is a green lock. The portal (``portal``) must be an OS
thread all the same, so that a body blocking the hub does not stop the
renewals; ``green()`` tells which library patched, and ``natives()`` gives
the unpatched means of starting one and of waiting for its sockets.

The guards of this package's shared state are taken by the callers (greenlets)
and by the portal thread alike. gevent's green locks work across OS threads;
eventlet's do not (a release wakes the waiter on the releaser's hub), so
``lock()`` and ``rlock()`` give the OS's locks under eventlet. Nothing is
awaited, nor any green call made, while one of them is held.
"""

from __future__ import annotations

import selectors
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Green = Literal["gevent", "eventlet"]


def green() -> Green | None:
    """Which library monkey-patched ``threading`` in this process, or None
    (never imports either)."""
    monkey: Any = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("threading"):
        return "gevent"
    patcher: Any = sys.modules.get("eventlet.patcher")
    if patcher is not None and patcher.is_monkey_patched("thread"):
        return "eventlet"
    return None


@dataclass(frozen=True)
class Natives:
    """The unpatched means of running an event loop in an OS thread.

    Attributes:
        start_new_thread: ``_thread.start_new_thread``, starting an OS thread.
        get_ident: ``_thread.get_ident``, the calling OS thread's id.
        selector: a selector class on the unpatched ``select`` module.
    """

    start_new_thread: Callable[..., int]
    get_ident: Callable[[], int]
    selector: type[selectors.BaseSelector]


def natives(library: Green) -> Natives:
    """The unpatched ``Natives`` of a process ``library`` monkey-patched."""
    if library == "gevent":
        monkey: Any = sys.modules["gevent.monkey"]
        start, get_ident = monkey.get_original("_thread", ["start_new_thread", "get_ident"])
        return Natives(start, get_ident, monkey.get_original("selectors", "DefaultSelector"))
    patcher: Any = sys.modules["eventlet.patcher"]
    thread, select = patcher.original("_thread"), patcher.original("select")

    class PollSelector(selectors._PollLikeSelector):  # eventlet drops epoll
        _selector_cls = select.poll
        _EVENT_READ = select.POLLIN
        _EVENT_WRITE = select.POLLOUT

    return Natives(thread.start_new_thread, thread.get_ident, PollSelector)


def _eventlet_thread() -> Any:
    """The unpatched ``_thread`` under eventlet."""
    patcher: Any = sys.modules["eventlet.patcher"]
    return patcher.original("_thread")


def lock() -> threading.Lock:
    """A lock usable across OS threads and greenlets (see the module)."""
    if green() == "eventlet":
        lock: threading.Lock = _eventlet_thread().allocate_lock()
        return lock
    return threading.Lock()


def rlock() -> threading.RLock:
    """A re-entrant lock usable across OS threads and greenlets (see the module)."""
    if green() == "eventlet":
        lock: threading.RLock = _eventlet_thread().RLock()
        return lock
    return threading.RLock()
