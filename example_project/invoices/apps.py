"""App configuration of ``invoices``."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

from example_project import telemetry


def use_sqlite_wal(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """Put SQLite into write-ahead-log mode on every new connection.

    With WAL, readers (the demo's progress line) never block the writer that
    holds the lock, and a commit needs no fsync with ``synchronous=NORMAL``.
    Other databases are left alone.
    """
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")


class InvoicesConfig(AppConfig):
    """Registers the SQLite connection set-up, and records the lock's metrics
    when the demo asks for them (``example_project.telemetry``)."""

    name = "example_project.invoices"
    label = "invoices"
    verbose_name = "Invoices"

    def ready(self) -> None:
        """Connect the SQLite set-up to new connections; start recording metrics."""
        connection_created.connect(use_sqlite_wal, dispatch_uid="invoices-sqlite-wal")
        telemetry.install()
