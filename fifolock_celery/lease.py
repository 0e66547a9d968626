"""The lease of the running task body: ``current_lease()``.

A ``ContextVar`` holds the leases held by the current context (innermost
last). It is set only while a locked body runs, so a worker thread that runs
many tasks never sees a previous task's lease.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from redis_fifo_lock import Lease, LeaseLost, LockUsageError, SyncFifoLock, metrics
from redis_fifo_lock.holding import attach_release_error

_held: ContextVar[tuple[Lease, ...]] = ContextVar("fifolock_celery_held", default=())

NO_LOCK = "(none)"
"""The lock name in errors that are about no particular lock."""


def current_lease() -> Lease:
    """The ``Lease`` of the innermost locked task body running in this context.

    Use ``current_lease().fence`` to fence writes to the resource the lock
    guards, and ``current_lease().lost`` (bool) to notice that the lease was
    lost while the body runs. Works for ``@fifo_locked`` functions and
    ``FifoLockedTask`` tasks alike.

    Raises:
        LockUsageError: when no locked body is running (outside a task, or in a
            task that is not locked).
    """
    held = _held.get()
    if not held:
        raise LockUsageError(
            NO_LOCK,
            "current_lease() was called outside the body of a @fifo_locked task; call it "
            "from the task function (or code it calls) while the task runs",
        )
    return held[-1]


def acquire(lock: SyncFifoLock, timeout: float | None) -> Lease:
    """Acquire ``lock`` unless this context already holds it.

    Args:
        lock: the lock to take.
        timeout: seconds (float) to wait for it; None waits forever.

    Raises:
        LockUsageError: the same lock name is already held in this context
            (acquiring it again would wait for itself forever).
        LockTimeout, RedisUnavailable: from ``SyncFifoLock.acquire``.
    """
    for lease in _held.get():
        if lease.name == lock.name:
            raise LockUsageError(
                lock.name,
                f"already held in this task (fence {lease.fence}); acquiring it again "
                "would wait for itself forever - call the undecorated function instead",
            )
    return lock.acquire(timeout)


@contextmanager
def published(lock: SyncFifoLock, lease: Lease) -> Iterator[Lease]:
    """Publish ``lease`` to ``current_lease()`` for the block, then always release
    it, retrying while Redis cannot be reached (``SyncFifoLock.release_retrying``).

    Enter it as soon as ``lease`` is granted: whatever is raised into the task
    from then on (a soft time limit) still releases the lease.

    Args:
        lock: the lock that granted ``lease``.
        lease: the lease, as returned by ``acquire``.

    Raises:
        LeaseLost: on the way out, when the lease was lost while the block ran;
            it replaces an exception the block raised (which stays attached as
            ``__context__``): the body did not hold the lock all along.
        RedisUnavailable: the release could not reach Redis within its retries
            (the lease then expires within ``lease_ms``), when the block
            returned. When the block raised, its own exception propagates, with
            the release's failure as its ``fifolock_release_error`` attribute.
    """
    try:
        token = _held.set((*_held.get(), lease))
        try:
            with metrics.current(lease):  # the task body's spans are the hold's children
                yield lease
        finally:
            _held.reset(token)
    except BaseException as error:
        try:
            lock.release_retrying(lease)
        except LeaseLost:
            raise
        except Exception as failure:
            attach_release_error(error, failure, lock.name)
        raise
    lock.release_retrying(lease)
