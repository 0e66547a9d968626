"""``cache_locked_job NAME [--timeout SECONDS]``: a command that takes
``cache.fifo_lock(NAME)`` in its body (waiting at most SECONDS).

It has no ``@fifo_locked_command``, so ``fifolock run NAME -- cache_locked_job
NAME`` cannot see beforehand that it takes the lock ``run`` holds.
"""

from __future__ import annotations

from typing import Any

from django.core.cache import cache
from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Take the FIFO lock NAME with cache.fifo_lock() and print its fence."
    requires_system_checks: list[str] = []  # noqa: RUF012 - Django's own annotation

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS")

    def handle(self, *args: Any, **options: Any) -> None:
        with cache.fifo_lock(options["name"], timeout=options["timeout"]) as lease:
            self.stdout.write(f"held fence {lease.fence}")
