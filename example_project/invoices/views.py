"""The HTTP surface: ``POST /invoices/`` issues one invoice.

The view is async: under uvicorn it waits for the lock on the server's event
loop with ``async with`` (no thread is blocked while it queues), and runs the
ORM work in a thread with ``sync_to_async``.
"""

from __future__ import annotations

import os
import time

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, JsonResponse

from redis_fifo_lock import LockTimeout

from .models import Source
from .services import invoice_lock, issue_invoice


async def create_invoice(request: HttpRequest) -> HttpResponse:
    """Issue the next invoice; answers 201 with its number, fence and ticket.

    Answers 503 when the lock could not be had within ``LOCK_TIMEOUT_S``.
    """
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    started_ns = time.monotonic_ns()
    try:
        async with invoice_lock() as lease:
            waited_ms = (time.monotonic_ns() - started_ns) / 1e6
            invoice = await sync_to_async(issue_invoice)(Source.VIEW, lease, waited_ms=waited_ms)
    except LockTimeout as exc:
        return JsonResponse({"error": str(exc)}, status=503)
    return JsonResponse(
        {
            "number": invoice.number,
            "fence": lease.fence,
            "ticket": lease.ticket,
            "waited_ms": waited_ms,
        },
        status=201,
    )


async def healthz(request: HttpRequest) -> HttpResponse:
    """Answer 200 with the server's process id (the demo's readiness check uses it
    to make sure the server answering is the one it started)."""
    return JsonResponse({"ok": True, "pid": os.getpid()})
