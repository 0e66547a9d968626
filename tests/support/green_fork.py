"""A sync lock used before and after ``fork()`` in an eventlet-patched process.

``python -m tests.support.green_fork URL [MUTANT]`` monkey-patches the process as
``celery worker --pool eventlet`` does, takes and releases a ``SyncFifoLock``
``ROUNDS`` times, forks, and does it again in the child and in the parent at
once. The child shares the parent's hub (its epoll), whose registrations a
wait of either process can undo. Prints one JSON line: what each side
managed; either exits 1 through ``faulthandler`` if it hangs for ``HANG_S``.
``MUTANT`` names a mutant of ``tests.celery_tests.test_celery_green`` to apply
first.
"""

from __future__ import annotations

import eventlet

eventlet.monkey_patch()

import faulthandler  # noqa: E402  (after the monkey-patching, as in a green worker)
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import uuid  # noqa: E402

from redis_fifo_lock import SyncFifoLock  # noqa: E402

ROUNDS = 20
HANG_S = 6.0
"""Seconds after which the process counts as hung (a run takes about 2 s)."""


def waker_never_rearms() -> None:
    """MUTANT waker-never-rearms: the ``EventletWaker`` waits on its pipe with
    no timeout, as first written: a wait the forked child unregistered from the
    shared epoll is never registered again."""
    from redis_fifo_lock import portal

    portal.REARM_S = None  # type: ignore[assignment]


MUTANTS = {"waker-never-rearms": waker_never_rearms}


def use(lock: SyncFifoLock) -> int:
    """Take and release ``lock`` ``ROUNDS`` times; how many times it was held."""
    held = 0
    for _ in range(ROUNDS):
        with lock.hold(timeout=HANG_S / 2):
            held += 1
    return held


def main() -> None:
    """Use a lock before and after a fork; print what each side did."""
    if len(sys.argv) > 2:
        MUTANTS[sys.argv[2]]()
    faulthandler.dump_traceback_later(HANG_S, exit=True)
    lock = SyncFifoLock(sys.argv[1], f"green-fork-{uuid.uuid4().hex[:8]}", poll_ms=200)
    before = use(lock)
    child = os.fork()
    if child == 0:
        # SIGALRM ends a hung child (faulthandler's watchdog thread stayed in the parent).
        signal.alarm(int(HANG_S))
        try:
            os._exit(0 if use(lock) == ROUNDS else 3)
        finally:
            os._exit(4)  # whatever happened: never the parent's exit path
    after = use(lock)
    _, status = os.waitpid(child, 0)
    print(
        json.dumps({"before": before, "after": after, "child": os.waitstatus_to_exitcode(status)})
    )


if __name__ == "__main__":
    main()
