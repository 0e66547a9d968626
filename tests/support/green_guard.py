"""A guard of ``redis_fifo_lock.native`` passed from a green thread to an OS thread.

``python -m tests.support.green_guard POOL [MUTANT]`` monkey-patches the
process as ``celery worker --pool POOL`` does, takes ``native.lock()`` in a
green thread, lets an OS thread (the portal's kind) block on it, releases it,
and prints one JSON line: ``handed`` (the OS thread got the lock within
``HANDOVER_S``). ``MUTANT`` names a mutant of
``tests.celery_tests.test_celery_green`` to apply first.
"""

from __future__ import annotations

import sys

from tests.support.green_patch import patch_as

POOL = sys.argv[1] if __name__ == "__main__" else ""
patch_as(POOL)

import json  # noqa: E402  (after the monkey-patching, as in a green worker)
import threading  # noqa: E402
import time  # noqa: E402

from redis_fifo_lock import native  # noqa: E402

HANDOVER_S = 5.0
BLOCKED_S = 0.3
"""Seconds the OS thread gets to block on the guard: nothing tells when it has."""


def green_guards() -> threading.Lock:
    """MUTANT green-guards: the guards are the patched ``threading.Lock``, as
    before the fix - under eventlet a green lock, whose release wakes an OS
    thread's waiter on the releaser's hub, which cannot switch to it."""
    return threading.Lock()


def main() -> None:
    """Apply the mutant named, hand the guard over, print the JSON line."""
    if len(sys.argv) > 2 and sys.argv[2] == "green-guards":
        native.lock = green_guards
    library = native.green()
    assert library is not None
    natives = native.natives(library)
    guard = native.lock()
    finished = _os_lock(library)  # released by the OS thread once it had the guard
    finished.acquire()
    guard.acquire()

    def take() -> None:
        with guard:
            finished.release()

    natives.start_new_thread(take, ())
    time.sleep(BLOCKED_S)  # patched: lets the green hub run meanwhile
    guard.release()
    print(json.dumps({"handed": _wait(finished, library)}))


def _os_lock(library: native.Green) -> threading.Lock:
    """An unpatched lock."""
    if library == "gevent":
        from gevent import monkey

        lock: threading.Lock = monkey.get_original("_thread", "allocate_lock")()
        return lock
    import eventlet.patcher

    lock = eventlet.patcher.original("_thread").allocate_lock()
    return lock


def _wait(lock: threading.Lock, library: native.Green) -> bool:
    """Whether ``lock`` is released within ``HANDOVER_S``, letting the hub run."""
    deadline = time.monotonic() + HANDOVER_S
    while not lock.acquire(False):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)  # patched: the hub runs; nothing green tells of an OS lock
    return True


if __name__ == "__main__":
    main()
