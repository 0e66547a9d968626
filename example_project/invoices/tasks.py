"""The Celery surface: one task, one invoice, under ``@fifo_locked``.

The task takes ``INVOICE_LOCK`` by its plain name, as the view and the command
do: in a Django project ``fifolock_celery`` locks on the cache that
``FIFOLOCK['CACHE']`` names, with its server, namespace and key function (see
``fifolock_celery.under_django``), so the three queue on one lock with no
Celery lock setting.
"""

from __future__ import annotations

import time
from typing import Any

from celery import Task
from celery.signals import task_postrun, task_prerun

from example_project.celery import app
from fifolock_celery import current_lease, fifo_locked

from .models import Source
from .services import INVOICE_LOCK, LOCK_TIMEOUT_S, issue_invoice

_started_ns: dict[str, int] = {}
"""When each running task of this process started (task id to monotonic ns)."""


@task_prerun.connect
def _note_start(task_id: str, task: Task[Any, Any], **kwargs: Any) -> None:
    """Note when the task starts: ``@fifo_locked`` takes the lock right after."""
    if task.name == issue_invoice_task.name:
        _started_ns[task_id] = time.monotonic_ns()


@task_postrun.connect
def _forget_start(task_id: str, **kwargs: Any) -> None:
    """Drop the note, also when the task failed before its body ran."""
    _started_ns.pop(task_id, None)


@app.task(bind=True)
@fifo_locked(INVOICE_LOCK, timeout=LOCK_TIMEOUT_S)
def issue_invoice_task(self: Task[Any, Any]) -> dict[str, Any]:
    """Issue one invoice; returns its number, fence, ticket and the lock wait (ms)."""
    entered_ns = time.monotonic_ns()
    started_ns = _started_ns.get(self.request.id or "", entered_ns)
    lease = current_lease()
    invoice = issue_invoice(Source.TASK, lease, waited_ms=(entered_ns - started_ns) / 1e6)
    return {
        "number": invoice.number,
        "fence": lease.fence,
        "ticket": lease.ticket,
        "waited_ms": invoice.waited_ms,
    }
