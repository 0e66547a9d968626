"""An example Django project that issues gap-free invoice numbers under one FIFO lock.

Three surfaces issue invoices, all through ``invoices.services.issue_invoice``
under the lock named ``invoices.services.INVOICE_LOCK``:

- a Celery task (``invoices.tasks.issue_invoice_task``, ``@fifo_locked``),
- an async view served by uvicorn (``POST /invoices/``, ``cache.fifo_lock``),
- a management command (``manage.py issue_invoices``, ``fifo_locked_command``).

``python -m example_project.demo`` runs all three at once against a real Redis
server, a real Celery worker and a real HTTP server, then checks the result.

Importing this package has no side effects (the Celery app lives in
``example_project.celery`` and is imported only by the code that needs it).
"""
