"""A read-modify-write of a cached counter under ``cache.fifo_lock``, sync and async.

Without the lock, concurrent requests read the same value and all but one
increment are lost. ``?hold=SECONDS`` is how long the work takes (default 0.3).
"""

from __future__ import annotations

import asyncio
import time

from asgiref.sync import sync_to_async
from django.core.cache import cache
from django.http import HttpRequest, JsonResponse

from . import record

COUNTER = "counter"
LOCK = "counter"


def sync_increment(request: HttpRequest) -> JsonResponse:
    """Increment the counter from a sync view, holding the lock."""
    hold_s = float(request.GET.get("hold", "0.3"))
    with cache.fifo_lock(LOCK) as lease:
        record.enter("sync", lease)
        value = cache.get(COUNTER, 0)
        time.sleep(hold_s)  # the slow work the lock protects
        cache.set(COUNTER, value + 1)
        record.leave("sync", lease)
    return JsonResponse({"fence": lease.fence, "ticket": lease.ticket, "value": value + 1})


async def async_increment(request: HttpRequest) -> JsonResponse:
    """Increment the counter from an async view, holding the lock."""
    hold_s = float(request.GET.get("hold", "0.3"))
    async with cache.fifo_lock(LOCK) as lease:
        await sync_to_async(record.enter)("async", lease)
        value = await cache.aget(COUNTER, 0)
        await asyncio.sleep(hold_s)  # the slow work the lock protects
        await cache.aset(COUNTER, value + 1)
        await sync_to_async(record.leave)("async", lease)
    return JsonResponse({"fence": lease.fence, "ticket": lease.ticket, "value": value + 1})


def holder(request: HttpRequest) -> JsonResponse:
    """What ``status()`` says of the holder while this sync view holds ``?lock=``."""
    lock = cache.fifo_lock(request.GET["lock"], timeout=5)
    with lock:
        return JsonResponse({"holder": lock.status().holder})


async def aholder(request: HttpRequest) -> JsonResponse:
    """What ``astatus()`` says of the holder while this async view holds ``?lock=``."""
    lock = cache.fifo_lock(request.GET["lock"], timeout=5)
    async with lock:
        return JsonResponse({"holder": (await lock.astatus()).holder})


def nested(request: HttpRequest) -> JsonResponse:
    """Take ``?lock=`` inside itself: refused with ``LockUsageError``."""
    with cache.fifo_lock(request.GET["lock"]), cache.fifo_lock(request.GET["lock"]):
        return JsonResponse({})


INVOICES = "invoices"
"""The lock of the invoice view and of ``django_app.tasks.issue_invoice``: a plain name."""
ISSUED = "issued"
"""The cached count of invoices issued, by views and tasks together."""


def issue_invoice(request: HttpRequest) -> JsonResponse:
    """Issue an invoice from a view, holding ``cache.fifo_lock("invoices")``."""
    hold_s = float(request.GET.get("hold", "0.2"))
    with cache.fifo_lock(INVOICES) as lease:
        record.enter("view", lease)
        value = cache.get(ISSUED, 0)
        time.sleep(hold_s)  # the slow work the lock protects
        cache.set(ISSUED, value + 1)
        record.leave("view", lease)
    return JsonResponse({"fence": lease.fence, "value": value + 1})
