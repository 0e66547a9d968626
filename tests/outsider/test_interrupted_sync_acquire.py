"""Found by an outside attack: sync acquires interrupted by a signal handler at random moments
leave the lock held (and requests queued) well past a few round trips.

README (``No stall from giving up``): "A timed-out or cancelled ``acquire``
leaves the queue, and if its grant landed meanwhile, hands it on at once."
``Portal.call`` promises the same for a sync caller interrupted by a signal
handler (KeyboardInterrupt, Celery's soft time limit). The suite's own
``test_an_interrupted_sync_acquire_never_leaves_the_lock_held`` checks this
right after the loop; here the lock gets 3 s (five leases) to become free, and
still did not on Python 3.10 (3 of 20 seeds per run typically; 3.11/3.12 pass):
a task dump of the portal shows several ``SyncFifoLock.acquire.<locals>.run``
tasks still pending after their callers were interrupted (the cancellation
from ``Portal.call``'s ``abandon()`` was swallowed, bpo-42130 style), waiting on
with ``timeout=None``; one of them gets the grant, nobody will ever release it,
and the portal renews it (``renewal.Renewal``) until ``max_hold_ms`` (30 min by
default). The portal now undoes such a task's result whenever it ends; on 3.10 the
test still fails for 1-2 of 20 seeds (open; run it there with
``.tox/py310-*/bin/python -m pytest tests/outsider/test_interrupted_sync_acquire.py``).
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from redis_fifo_lock import SyncFifoLock

pytestmark = pytest.mark.timeout(120)


class Interrupted(Exception):
    pass


@pytest.mark.skipif(
    not os.environ.get("FIFOLOCK_SIGNAL_TESTS"),
    reason="its SIGALRM handler displaces pytest-timeout's, so a hang here would hang the "
    "whole run; set FIFOLOCK_SIGNAL_TESTS=1 to run it",
)
@pytest.mark.xfail(
    strict=False,
    reason="open: now and then (1-2 of 20 seeds, 3.10 more than 3.11) an interrupted "
    "sync acquire's portal task still ends up holding the lock past 3 s",
)
@pytest.mark.parametrize("seed", range(20))
def test_interrupted_sync_acquires_leave_the_lock_free_within_a_few_leases(
    redis_url: str, seed: int
) -> None:
    lock = SyncFifoLock(redis_url, f"interrupted-{seed}", lease_ms=600, poll_ms=100)

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    rng = random.Random(seed)
    try:
        for _ in range(100):
            lease = None
            try:
                try:
                    signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.0001, 0.003))
                    lease = lock.acquire()
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except Interrupted:
                pass
            if lease is not None:
                lock.release(lease)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    deadline = time.monotonic() + 3.0
    status = lock.status()
    while (status.held or status.waiting) and time.monotonic() < deadline:
        time.sleep(0.1)
        status = lock.status()
    assert (status.held, status.waiting) == (False, 0), status
