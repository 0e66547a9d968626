"""Issuing invoice numbers: the one piece of code that must run under the lock.

The Celery task, the view and the management command all call
``issue_invoice`` while holding the same lock; see each of them for how they
take it.

One lock, one name: every surface takes ``INVOICE_LOCK``. The Django side
(``cache.fifo_lock`` and ``fifo_locked_command``) turns it into a cache key -
``":1:invoices"`` in Redis with the default ``KEY_PREFIX`` and ``VERSION`` - and
``@fifo_locked`` does the same on the same cache, as the project runs Django.
"""

from __future__ import annotations

import os
import time

from django.db import transaction

from fifolock_django.lock import CacheFifoLock, lock_cache
from redis_fifo_lock import Lease

from .models import Invoice, Source

INVOICE_LOCK = "invoices"
"""The lock every surface takes before issuing an invoice number (Django's name)."""

LOCK_TIMEOUT_S = 60.0
"""Seconds a caller waits for the lock before giving up."""


def invoice_lock(timeout: float | None = LOCK_TIMEOUT_S) -> CacheFifoLock:
    """The invoice lock of the ``FIFOLOCK['CACHE']`` cache, for ``with``/``async with``.

    Its ``.name`` is the lock's name in Redis (the cache key of ``INVOICE_LOCK``).
    """
    return lock_cache().fifo_lock(INVOICE_LOCK, timeout, name_template=INVOICE_LOCK)


class StaleLease(RuntimeError):
    """The lease can no longer be trusted, so no invoice was written.

    Either renewal was refused (``lease.lost``), or an invoice with a higher
    fence exists: a later holder has already written, so this holder was paused
    past its lease - or took another lock than the writers before it. This is
    the fencing check a protected resource should make; in a healthy run it
    never fires.
    """


def issue_invoice(source: Source | str, lease: Lease, *, waited_ms: float) -> Invoice:
    """Issue the next invoice number. Call it only while holding ``lease``.

    Reads the highest number and inserts the next one: without the lock two
    callers could read the same maximum, and one of them would fail on the
    unique constraint (or, without that constraint, issue a duplicate).

    Args:
        source: which surface is calling (``Source`` value).
        lease: the lease of ``INVOICE_LOCK`` the caller holds; its fence and
            ticket are stored with the invoice.
        waited_ms: how long the caller waited for the lock (milliseconds).

    Returns:
        The new invoice, with ``exited_ns`` set.

    Raises:
        StaleLease: the lease is lost or older than the last writer's; nothing
            was written.
    """
    entered_ns = time.monotonic_ns()
    with transaction.atomic():
        last = Invoice.objects.order_by("-number").only("number", "fence").first()
        if lease.lost:
            raise StaleLease(f"lease fence {lease.fence} was lost: {lease.lost_reason}")
        if last is not None and last.fence > lease.fence:
            raise StaleLease(
                f"invoice {last.number} was written under fence {last.fence}, "
                f"later than this lease's fence {lease.fence}"
            )
        invoice: Invoice = Invoice.objects.create(
            number=1 if last is None else last.number + 1,
            source=Source(source),
            fence=lease.fence,
            ticket=lease.ticket,
            pid=os.getpid(),
            entered_ns=entered_ns,
            waited_ms=waited_ms,
        )
    # Stamped after the commit, so [entered_ns, exited_ns] covers the whole write.
    invoice.exited_ns = time.monotonic_ns()
    Invoice.objects.filter(pk=invoice.pk).update(exited_ns=invoice.exited_ns)
    return invoice
