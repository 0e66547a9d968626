"""No waiting for yourself: a lock is not reentrant, and asking for it again is an error.

A caller that holds a lock, or waits for it, and asks for the same lock again
(same name and namespace) from the same flow of control would wait for itself
for ever: the second request queues behind the first, which is never released.
``claim()`` refuses that at once with ``LockUsageError`` - when the second
request has no timeout. One with a timeout cannot wait for ever: it keeps its
meaning of old, waits, and ends in ``LockTimeout`` (unless the first lease is
lost or forcibly released meanwhile).

"The same flow of control" is what a ``ContextVar`` follows - the same thread,
or the same asyncio task, and code its caller blocks on that carries the
context along (``async_to_sync``, ``sync_to_async``, ``asyncio.to_thread``) -
less one case: a *different* live task on the event loop of the task that
holds the lock. That task inherited the context if the holder started it, but
it may well be meant to wait its turn (a background job, a test's contender),
so it is not refused and queues like any other request. The price: a task the
holder itself awaits (``asyncio.gather``, a ``TaskGroup``, and ``wait_for`` on
Python 3.10 and 3.11, which run the awaited call in a task of its own) is not
recognised, and waits until its or the holder's timeout.

A claim ends when its request fails or its lease is released, wherever that
happens (another thread, another loop), so nothing that inherited it is
refused after that. The sync facade checks in the caller's thread (its portal
loop runs every call in an empty context), so a ``with`` nested in a ``with``
of the same lock is refused before anything is sent to Redis.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from contextvars import ContextVar
from dataclasses import dataclass, field

from .errors import LockUsageError
from .lease import Lease
from .protocol import LockKeys


@dataclass(eq=False)
class Claim:
    """One request of this flow of control for one lock, from its acquire to its
    release.

    Attributes:
        keys: the lock's keys (its name and namespace).
        where: the flow of control that made it, for messages (str).
        holder: the description its request records (str, see ``holder.py``).
        task: a weak reference to the asyncio task that made it, if any.
        lease: a weak reference to the lease once granted; None while
            waiting. (Weak: a claim never keeps a dropped lease, and so its
            lock, alive; see ``renewal.Renewal``.)
        ended: True once the request failed (timeout, error, cancellation).
        pid: the process that made it (int). A child forked meanwhile inherits
            the claim with its parent's context, but it is another process:
            its own request waits for the parent's lease like any other.
    """

    keys: LockKeys
    where: str
    holder: str
    task: weakref.ref[asyncio.Task[object]] | None = field(default=None, repr=False)
    lease: weakref.ref[Lease] | None = None
    ended: bool = False
    pid: int = field(default_factory=os.getpid)

    @property
    def active(self) -> bool:
        """True while the request waits or its lease is held: no release asked
        for (one that goes on in the background after its caller was
        interrupted ends the lease within ``lease_ms`` whatever happens), not
        released, and not lost (a lost lease - refused renewal, or expired after a release
        that could not reach Redis - no longer keeps anyone out), in the
        process that made it."""
        if self.ended or self.pid != os.getpid():
            return False
        if self.lease is None:
            return True
        lease = self.lease()
        return lease is not None and not (lease.released or lease.release_asked or lease.lost)

    def granted(self, lease: Lease) -> None:
        """The request was granted ``lease``: the claim lasts until it is released."""
        self.lease = weakref.ref(lease)
        _kept_by[lease] = self

    def failed(self) -> None:
        """The request ended without a lease (timeout, error, cancellation)."""
        self.ended = True


_claims: ContextVar[tuple[weakref.ref[Claim], ...]] = ContextVar("fifolock_claims", default=())
"""The claims of this flow of control, held weakly: a waiting claim lives while
its acquire call holds it, a granted one while its lease lives (``_kept_by``),
so one whose caller was interrupted before it could call ``failed()`` (a
signal handler raising just as ``claim()`` returned) vanishes with it."""

_kept_by: weakref.WeakKeyDictionary[Lease, Claim] = weakref.WeakKeyDictionary()


def _running_task() -> asyncio.Task[object] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running event loop: sync code
        return None


def _another_task(mine: Claim, task: asyncio.Task[object] | None) -> bool:
    """Whether ``task`` is another live task of the loop running ``mine``'s task."""
    other = mine.task() if mine.task is not None else None
    if task is None or other is None or other is task or other.done():
        return False
    return other.get_loop() is task.get_loop()


def claim(
    keys: LockKeys, holder: str, *, token: str | None = None, timeout: float | None = None
) -> Claim:
    """Record that this flow of control asks for lock ``keys``.

    Args:
        keys: the lock's keys.
        holder: the description of the caller (str) for messages.
        token: the request token asked for (str), if the caller gave one: a
            retry of a request this flow already holds (same token) is not
            refused - Redis returns the same grant.
        timeout: the request's timeout in seconds (float), None for none. Only
            a request without one is refused: it would wait for ever, while a
            timed one ends in ``LockTimeout`` as it always did (and is
            recorded, so that an untimed request nested in it is refused).

    Returns:
        the ``Claim``; call ``granted()`` or ``failed()`` on it.

    Raises:
        LockUsageError: ``timeout`` is None and this thread or task already
            holds the lock or waits for it; the message names the lock and
            where it is held.
    """
    task = _running_task()
    live = tuple(
        mine for mine in (ref() for ref in _claims.get()) if mine is not None and mine.active
    )
    for mine in live if timeout is None else ():
        if mine.keys != keys:
            continue
        held = mine.lease() if mine.lease is not None else None
        if token is not None and held is not None and held.token == token:
            continue
        if _another_task(mine, task):
            continue  # it may wait for the holder in the ordinary way
        state = f"held (fence {held.fence})" if held is not None else "being waited for"
        raise LockUsageError(
            keys.name,
            f"already {state} by {mine.where} ({mine.holder}), and asked for again "
            "there: the lock is not reentrant, so this request would wait for itself "
            "for ever. Use the lease already held, or release it first",
        )
    if task is not None:
        where = f"asyncio task {task.get_name()!r}"
    else:
        where = f"thread {threading.current_thread().name!r}"
    new = Claim(keys, where, holder, weakref.ref(task) if task is not None else None)
    _claims.set((*(weakref.ref(mine) for mine in live), weakref.ref(new)))
    return new
