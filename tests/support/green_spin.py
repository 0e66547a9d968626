"""A sync lock held across a hub-blocking loop, in a gevent- or eventlet-patched process.

``python -m tests.support.green_spin POOL URL [MUTANT]`` monkey-patches the
process as ``celery worker --pool POOL`` does (gevent or eventlet), takes a
``SyncFifoLock`` (``lease_ms`` ``LEASE_MS``) in a greenlet, spins the CPU for
``SPIN_MS`` without yielding, and prints one JSON line: ``lost`` (the lease was
lost meanwhile), ``released`` (the release succeeded, or the error's class
name) and ``asyncio_run`` (whether ``asyncio.run()`` worked in the greenlet
while the portal ran). ``MUTANT`` names a mutant of
``tests.celery_tests.test_celery_green`` to apply first.
"""

from __future__ import annotations

import sys

from tests.support.green_patch import patch_as

POOL = sys.argv[1] if __name__ == "__main__" else ""
patch_as(POOL)

import asyncio  # noqa: E402  (after the monkey-patching, as in a green worker)
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from typing import Any  # noqa: E402

LEASE_MS = 1000
SPIN_MS = 2000


def greenlet_portal() -> str | None:
    """MUTANT greenlet-portal: the portal is started as before the fix, with the
    patched ``threading``: a greenlet of the caller's hub, not an OS thread."""
    return None


MUTANTS = {"greenlet-portal": ("redis_fifo_lock.native", "green", greenlet_portal)}
"""Mutant name: (module, attribute, replacement)."""


def run(url: str) -> dict[str, Any]:
    """Hold a lock across ``SPIN_MS`` of CPU in this greenlet; what happened."""
    from redis_fifo_lock import SyncFifoLock

    lock = SyncFifoLock(url, f"green-spin-{uuid.uuid4().hex[:8]}", lease_ms=LEASE_MS, poll_ms=200)
    lease = lock.acquire(timeout=10)
    end = time.monotonic() + SPIN_MS / 1000
    while time.monotonic() < end:
        pass
    lost = lease.lost
    try:
        asyncio.run(asyncio.sleep(0))
        ran: object = True
    except RuntimeError as exc:
        ran = str(exc)
    try:
        lock.release(lease)
        released = "ok"
    except Exception as exc:
        released = type(exc).__name__
    return {"pid": os.getpid(), "lost": lost, "released": released, "asyncio_run": ran}


def main() -> None:
    """Apply the mutant named, run ``run`` in a greenlet, print its JSON."""
    import importlib

    if len(sys.argv) > 3:
        module, attribute, replacement = MUTANTS[sys.argv[3]]
        setattr(importlib.import_module(module), attribute, replacement)
    if POOL == "gevent":
        import gevent

        result = gevent.spawn(run, sys.argv[2]).get()
    else:
        import eventlet

        result = eventlet.spawn(run, sys.argv[2]).wait()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
