"""The Celery app of the test project, configured from its Django settings.

Its task locks the plain name ``"invoices"``, as the invoice view does with
``cache.fifo_lock("invoices")``: under Django the two are one lock (see
``fifolock_celery.under_django``). A worker runs it as ``-A django_app.tasks``
with ``DJANGO_SETTINGS_MODULE=django_app.settings``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery, current_task
from django.core.cache import cache

from fifolock_celery import current_lease, fifo_locked

from . import record
from .views import INVOICES, ISSUED

app = Celery("django_app")
app.config_from_object("django.conf:settings", namespace="CELERY")


@app.task
def ping() -> dict[str, Any]:
    """Readiness probe (see ``tests.support.celery_worker.running_worker``)."""
    return {"hostname": current_task.request.hostname, "pid": os.getpid(), "warmed_up_in": None}


@app.task
@fifo_locked(INVOICES)
def issue_invoice(hold_s: float) -> int:
    """Issue an invoice from a task, holding the lock ``"invoices"``; return its fence."""
    lease = current_lease()
    record.enter("task", lease)
    value = cache.get(ISSUED, 0)
    time.sleep(hold_s)  # the slow work the lock protects
    cache.set(ISSUED, value + 1)
    record.leave("task", lease)
    return lease.fence
