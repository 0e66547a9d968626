"""``locked_job WHO [--hold-until KEY]``: a management command under a FIFO lock.

It records its hold in the shared record (see ``django_app.record``); with
``--hold-until KEY`` it keeps the lock until an item is pushed on the Redis
list ``KEY`` (or 30 s pass).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from fifolock_django.commands import fifo_locked_command

from ... import record

JOB_LOCK = "nightly-job"
ENTERED = "record:entered"
"""Redis list on which each run pushes its name once it holds the lock."""


class Command(BaseCommand):
    help = "Record a hold of the FIFO lock 'nightly-job'."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("who")
        parser.add_argument("--hold-until", metavar="KEY", default=None)

    @fifo_locked_command(JOB_LOCK)
    def handle(self, *args: Any, **options: Any) -> None:
        lease = self.fifo_lease  # type: ignore[attr-defined]
        redis = record.redis()
        record.enter(options["who"], lease)
        redis.rpush(ENTERED, options["who"])
        if options["hold_until"]:
            redis.blpop([options["hold_until"]], timeout=record.HOLD_LIMIT_S)
        record.leave(options["who"], lease)
        self.stdout.write(f"{options['who']} held fence {lease.fence}")
