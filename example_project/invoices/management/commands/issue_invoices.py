"""The command surface: ``manage.py issue_invoices COUNT``.

The whole run holds the lock (``fifo_locked_command``), so its COUNT invoices
get consecutive numbers - a batch no task or request can split. That is the
point of locking a command as a whole; the cost is that everybody else waits
while the batch runs, so keep such batches short. (To interleave, take
``invoice_lock()`` per invoice instead.)
"""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from example_project.invoices.models import Invoice, Source
from example_project.invoices.services import INVOICE_LOCK, LOCK_TIMEOUT_S, issue_invoice
from fifolock_django.commands import fifo_locked_command
from redis_fifo_lock import Lease


class Command(BaseCommand):
    """Issue COUNT invoices with consecutive numbers, holding the invoice lock."""

    help = "Issue COUNT invoices with consecutive numbers, holding the invoice lock."
    fifo_lease: Lease
    """Set by ``fifo_locked_command`` while ``handle`` runs."""
    # No system checks between execute() and handle(): the lock wait is timed
    # from execute(). (The annotation is Django's own.)
    requires_system_checks: list[str] = []  # noqa: RUF012

    def add_arguments(self, parser: CommandParser) -> None:
        """Declare COUNT."""
        parser.add_argument("count", type=int, help="how many invoices to issue")

    def execute(self, *args: Any, **options: Any) -> Any:
        """Connect to the database, note the time, then run ``handle``.

        ``handle`` first waits for the lock. Connecting (and the first query's
        one-off set-up) happens before, so the lock is not held while this
        fresh process warms up.
        """
        Invoice.objects.exists()
        self.started_ns = time.monotonic_ns()
        return super().execute(*args, **options)

    @fifo_locked_command(INVOICE_LOCK, timeout=LOCK_TIMEOUT_S)
    def handle(self, *args: Any, **options: Any) -> None:
        """Issue the invoices; runs holding the lock, whose lease is ``self.fifo_lease``."""
        lease = self.fifo_lease
        waited_ms = (time.monotonic_ns() - self.started_ns) / 1e6
        numbers = [
            issue_invoice(Source.COMMAND, lease, waited_ms=waited_ms).number
            for _ in range(options["count"])
        ]
        self.stdout.write(
            f"issued {len(numbers)} invoices {numbers[0] if numbers else '-'}.."
            f"{numbers[-1] if numbers else '-'} under fence {lease.fence} "
            f"(waited {waited_ms:.1f} ms)"
        )
