"""``plain_job WHO [--hold-until KEY] [--fail]``: a command that knows nothing of locks.

It records its run in the shared record (see ``django_app.record``) without a
lease, so ``fifolock run`` is what serialises it. With ``--hold-until KEY`` it
keeps running until an item is pushed on the Redis list ``KEY`` (or 30 s
pass); with ``--fail`` it ends with a ``CommandError`` (exit status 3).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ... import record
from .locked_job import ENTERED


class Command(BaseCommand):
    help = "Record a run; no lock of its own."
    requires_system_checks: list[str] = []  # noqa: RUF012 - Django's own annotation

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("who")
        parser.add_argument("--hold-until", metavar="KEY", default=None)
        parser.add_argument("--fail", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        client = record.redis()
        record.enter(options["who"], None)
        client.rpush(ENTERED, options["who"])
        if options["hold_until"]:
            client.blpop([options["hold_until"]], timeout=record.HOLD_LIMIT_S)
        record.leave(options["who"], None)
        if options["fail"]:
            raise CommandError(f"{options['who']} failed on purpose", returncode=3)
        self.stdout.write(f"{options['who']} ran")
