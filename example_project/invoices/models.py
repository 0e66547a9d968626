"""The ``Invoice`` model: one row per issued invoice number."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class Source(models.TextChoices):
    """Which surface issued an invoice."""

    TASK = "task"
    VIEW = "view"
    COMMAND = "command"


class Invoice(models.Model):
    """An invoice number, and the lock grant under which it was issued.

    ``number`` is what the business cares about: 1, 2, 3... with no gap and no
    duplicate. The other columns record the grant (``fence``, ``ticket``) and
    when the critical section ran, so that the demo can check from the data
    alone that the lock did its job. ``entered_ns`` and ``exited_ns`` are
    ``time.monotonic_ns()`` readings: one clock for every process on the
    machine, so they compare across processes (not across machines).
    """

    number = models.PositiveBigIntegerField(unique=True)
    source = models.CharField(max_length=8, choices=Source.choices)
    fence = models.BigIntegerField(db_index=True, help_text="fence of the lease held")
    ticket = models.BigIntegerField(help_text="arrival order of the lock request")
    pid = models.IntegerField(help_text="process that issued the invoice")
    entered_ns = models.BigIntegerField(help_text="monotonic clock when issuing began")
    exited_ns = models.BigIntegerField(
        null=True, help_text="monotonic clock after the invoice was committed"
    )
    waited_ms = models.FloatField(help_text="how long the caller waited for the lock")
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("number",)

    def __str__(self) -> str:
        return f"Invoice {self.number} ({self.source}, fence {self.fence})"
