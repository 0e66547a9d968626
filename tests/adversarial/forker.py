"""A holder that forks inside ``with lock.hold()`` (the ``fork-in-hold`` scenario).

Run as ``python -m tests.adversarial.forker <url> <record> <hold_ms>``. It
enters the lock through the sync facade (``SyncFifoLock``, whose portal is
rebuilt in a forked child), records the entry in the shared record, prints
``inside``, and waits for a ``fork`` line on stdin. Then it forks: the child
leaves the ``with`` block (so ``hold()`` releases, in the child) and exits at
once, writing nothing to the record; the parent waits for the child, stays
inside another ``hold_ms`` milliseconds, records its exit and releases.
(With ``FifoLock`` under ``asyncio`` the child cannot release at all on Python
3.11: ``asyncio.get_running_loop()`` refuses a loop of the parent's pid.)
"""

from __future__ import annotations

import os
import sys
import time

from redis_fifo_lock import LeaseLost, LockError, SyncFifoLock
from tests.support.record import Record

LEASE_MS, POLL_MS = 400, 100


def main(url: str, record_path: str, hold_ms: int) -> None:
    record = Record(record_path)
    lock = SyncFifoLock(url, "forked", lease_ms=LEASE_MS, poll_ms=POLL_MS)
    child: int | None = None  # 0 in the child once forked
    token = f"parent-{os.getpid()}"
    record.request(token, 10, "parent")
    try:
        with lock.hold(timeout=10, token=token) as lease:
            record.enter(lease, "parent")
            print("inside", flush=True)
            sys.stdin.readline()  # "fork"
            child = os.fork()
            if child == 0:
                return  # the child leaves the block: hold() releases here, in the child
            _, status = os.waitpid(child, 0)
            print(f"child exited with status {status}", flush=True)
            time.sleep(hold_ms / 1000)  # the parent is still inside
            record.exit(lease)
        record.released(lease, "ok")
    except LeaseLost:
        if child == 0:
            os._exit(0)
        record.exit(lease)
        record.released(lease, "leaselost")
    except LockError:
        if child == 0:
            os._exit(0)  # refused in the child: what the lock should do
        raise
    finally:
        if child == 0:
            os._exit(0)  # the child never outlives its block, nor runs the parent's cleanup


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
