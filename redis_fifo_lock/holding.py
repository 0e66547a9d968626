"""The end of a ``hold()`` block: a release that is retried, and that never
hides the error the block raised.

Shared by ``FifoLock.hold`` and ``SyncFifoLock.hold`` (which runs
``release_retrying`` on the portal loop, as a duty of its hub).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from functools import partial
from typing import TYPE_CHECKING

from .errors import RedisUnavailable
from .timeouts import within

if TYPE_CHECKING:
    from .lease import Lease
    from .lock import FifoLock

log = logging.getLogger("redis_fifo_lock")

RELEASE_RETRY_PAUSES_S: tuple[float, ...] = (0.1, 0.3, 0.9)
"""Pauses in seconds before each new try of a hold's release that could not
reach Redis: four tries at most, 1.3 s of pauses in all (plus each try's own
client timeouts). Only ``RedisUnavailable`` is retried; Redis recognises a
release it already ran, so a retry after a lost reply is harmless."""

RELEASE_TRY_S = 1.0
"""Longest wait, in seconds, for one try of a hold's release: a server that does
not answer (frozen, or behind a dead network path, with no client
``socket_timeout``) must not keep the caller inside ``hold()``."""

RELEASE_ERROR_ATTRIBUTE = "fifolock_release_error"
"""Name of the attribute set on the exception a hold's block raised when the
release that followed failed as well; its value is the release's exception."""


async def release_retrying(lock: FifoLock, lease: Lease) -> None:
    """Release ``lease`` with ``lock``, trying again (after the pauses of
    ``RELEASE_RETRY_PAUSES_S``) while Redis cannot be reached, so that a short
    outage does not leave the lock held until ``lease_ms`` runs out.

    Each try waits at most ``RELEASE_TRY_S``; no try starts once the lease's own
    deadline passed (Redis frees the lock by itself then).

    Raises:
        RedisUnavailable: every try failed or went unanswered; the lease expires
            by itself within ``lease_ms``.
        LeaseLost, LockUsageError: as ``FifoLock.release`` (never retried);
            ``LeaseLost`` also for a try that went unanswered, when the lease
            had been lost while held.
    """
    for pause in RELEASE_RETRY_PAUSES_S:
        try:
            await _release_once(lock, lease)
            return
        except RedisUnavailable as exc:
            if time.monotonic() + pause >= lease.expires_at:
                raise
            log.warning(
                "FIFO lock %r: releasing lease fence %d failed (%s); trying again in %.1f s",
                lock.name,
                lease.fence,
                exc.reason,
                pause,
            )
        await asyncio.sleep(pause)
    await _release_once(lock, lease)


async def _release_once(lock: FifoLock, lease: Lease) -> None:
    try:
        await within(lock.release(lease), RELEASE_TRY_S)
    except asyncio.TimeoutError:
        if lease.released:
            return  # the time ran out after Redis had answered (see FifoLock.release)
        failure = RedisUnavailable(
            lock.name,
            f"releasing lease fence {lease.fence} got no reply within {RELEASE_TRY_S:g} s; "
            "the lease expires by itself within lease_ms. Check that Redis is reachable",
        )
        raise (lease.unreleased(failure) or failure) from None


async def release_when_cancelled(name: str, lease: Lease, release: asyncio.Task[None]) -> None:
    """For a ``hold()`` whose block was cancelled: wait for the ``release`` task
    of ``lease`` (a duty of the loop's hub, running ``release_retrying``) at
    most ``RELEASE_TRY_S``, so that a cancelled caller (a loop's shutdown among
    them) is not kept for every retry while Redis does not answer. The retries
    go on in the background; a closing loop gives them at most its
    ``CLOSING_S`` (``Hub.finish``), and a final failure is logged as a warning.

    Raises:
        What ``release_retrying`` raised, if it ended within that time.
        LeaseLost: it did not end in time, and the lease had been lost while
            held (``Lease.lost_while_held``): that is known whatever the
            release comes to.
    """
    done, _ = await asyncio.wait({release}, timeout=RELEASE_TRY_S)
    if done:
        release.result()
        return
    keep_releasing(name, release)
    if lease.lost_while_held:
        raise lease.lost_error("its release goes on in the background")


def keep_releasing(name: str, release: asyncio.Task[None]) -> None:
    """Nobody waits for the ``release`` task (of a lease of lock ``name``) any
    more: its caller was cancelled or interrupted. It goes on in the
    background; a final failure is logged as a warning."""
    release.add_done_callback(partial(_report_late_failure, name))


def _report_late_failure(name: str, release: asyncio.Task[None]) -> None:
    if release.cancelled() or release.exception() is None:
        return
    log.warning(
        "FIFO lock %r: the release of an interrupted or cancelled hold failed: %s",
        name,
        release.exception(),
    )


def attach_release_error(error: BaseException, failure: Exception, name: str) -> None:
    """Record on ``error`` (what a hold's block raised, and what propagates)
    that the release of lock ``name`` after it failed with ``failure``.

    ``failure`` becomes ``error.fifolock_release_error`` (see
    ``RELEASE_ERROR_ATTRIBUTE``), is added as a note on Python 3.11+ (shown in
    the traceback), and is logged as a warning, which Python 3.10 shows
    nowhere else.
    """
    setattr(error, RELEASE_ERROR_ATTRIBUTE, failure)
    note = (
        f"FIFO lock {name!r}: the release after this error failed too: "
        f"{type(failure).__name__}: {failure}"
    )
    if sys.version_info >= (3, 11):
        error.add_note(note)
    log.warning("%s (the block raised %s: %s)", note, type(error).__name__, error)
