"""``manage.py fifolock``: look at a FIFO lock, or run any command under one.

::

    manage.py fifolock status NAME [--cache ALIAS] [--key-version N] [--json]
    manage.py fifolock run NAME [--cache ALIAS] [--key-version N]
                               [--lock-timeout SECONDS | --no-wait] -- COMMAND [ARGS...]

``status`` prints whether the lock is held, the holder's fence and ticket, how
long its lease lasts unless renewed, how many requests wait and the last fence
granted; ``--json`` prints the same as one JSON object. It never joins the
queue.

``run`` takes the lock (``NAME`` is turned into a cache key like
``cache.fifo_lock(NAME)`` does), runs ``COMMAND ARGS`` in this process with
``call_command`` and releases the lock when it ends, however it ends: any
existing management command is serialised across hosts without editing it. A
wait that runs out exits with status 1 and a message naming the holder's fence;
the command's own failure keeps its own exit status.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from django.core.management import call_command, get_commands, load_command_class
from django.core.management.base import BaseCommand, CommandError, CommandParser

from redis_fifo_lock import LockStatus, LockTimeout

from ...commands import add_lock_arguments, busy_message, lock_timeout_option
from ...lock import CacheFifoLock, lock_cache


def _lock_arguments(parser: CommandParser) -> None:
    parser.add_argument("name", help="the lock name, as given to cache.fifo_lock()")
    parser.add_argument(
        "--cache",
        metavar="ALIAS",
        default=None,
        help="the CACHES alias whose fifo_lock() is used (default: FIFOLOCK['CACHE'])",
    )
    parser.add_argument(
        "--key-version",
        metavar="N",
        type=int,
        default=None,
        help="the cache key version of the lock name (default: the cache's VERSION)",
    )


class Command(BaseCommand):
    """``fifolock status NAME`` and ``fifolock run NAME -- COMMAND [ARGS...]``."""

    help = "Show a FIFO lock's state, or run another management command holding the lock."
    requires_system_checks: list[str] = []  # noqa: RUF012 - Django's own annotation

    def add_arguments(self, parser: CommandParser) -> None:
        """Declare the ``status`` and ``run`` subcommands."""
        actions = parser.add_subparsers(dest="action", metavar="{status,run}", required=True)
        status = actions.add_parser(
            "status", help="print whether the lock is held, its fence, waiters and lease"
        )
        _lock_arguments(status)
        status.add_argument("--json", action="store_true", help="print one JSON object")
        run = actions.add_parser(
            "run", help="run COMMAND [ARGS...] holding the lock (put -- before COMMAND)"
        )
        _lock_arguments(run)
        add_lock_arguments(run, None)
        run.add_argument("command", metavar="COMMAND", help="the management command to run")
        run.add_argument(
            "command_args",
            metavar="ARGS",
            nargs=argparse.REMAINDER,
            help="its arguments and options",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        """Dispatch to ``status`` or ``run``.

        Raises:
            CommandError: unknown COMMAND, or the lock could not be had in time.
            LockError: ``RedisUnavailable`` when Redis cannot be reached.
        """
        lock = lock_cache(options["cache"]).fifo_lock(
            options["name"],
            lock_timeout_option(options, None),
            version=options["key_version"],
        )
        if options["action"] == "status":
            self.status(lock, options)
        else:
            self.run(lock, options)

    def status(self, lock: CacheFifoLock, options: dict[str, Any]) -> None:
        """Print the lock's state (text, or JSON with ``--json``).

        Raises:
            LockError: ``RedisUnavailable`` when Redis cannot be reached.
        """
        state = lock.status()
        if options["json"]:
            self.stdout.write(json.dumps(status_fields(options["name"], options["cache"], state)))
        else:
            self.stdout.write(status_text(options["name"], options["cache"], state))

    def run(self, lock: CacheFifoLock, options: dict[str, Any]) -> None:
        """Run the named command in this process while holding ``lock``; release
        the lock however the command ends.

        Raises:
            CommandError: unknown COMMAND (before any waiting), the wait ran out
                (naming the holder's fence), or the command's own error.
            LockError: ``RedisUnavailable`` or ``LeaseLost`` from the lock.
        """
        name: str = options["command"]
        args: list[str] = list(options["command_args"])
        if args[:1] == ["--"]:  # argparse versions differ on keeping the separator
            args = args[1:]
        try:
            app = get_commands()[name]
        except KeyError:
            raise CommandError(f"Unknown command: {name!r}") from None
        command = name if isinstance(app, BaseCommand) else load_command_class(app, name)
        try:
            lease = lock.acquire()
        except LockTimeout as exc:
            raise CommandError(busy_message(options["name"], lock, exc)) from exc
        try:
            if options["verbosity"] >= 2:
                self.stderr.write(f"fifolock: {lock.name!r} held with fence {lease.fence}")
            call_command(command, *args)
        finally:
            lock.release(lease)


def status_fields(name: str, cache: str | None, state: LockStatus) -> dict[str, Any]:
    """The ``status --json`` object: ``name``, ``cache`` (None for
    ``FIFOLOCK['CACHE']``), ``redis_lock``, ``held`` (bool), ``holder_fence``,
    ``holder_ticket``, ``lease_left_ms`` (int ms; None when free), ``waiting``
    (int) and ``last_fence`` (the last fence granted, int)."""
    return {
        "name": name,
        "cache": cache,
        "redis_lock": state.name,
        "held": state.held,
        "holder_fence": state.holder_fence,
        "holder_ticket": state.holder_ticket,
        "lease_left_ms": state.lease_left_ms,
        "waiting": state.waiting,
        "last_fence": state.last_fence,
    }


def status_text(name: str, cache: str | None, state: LockStatus) -> str:
    """The ``status`` text: one ``label  value`` line per fact."""
    if state.held:
        held = f"yes, by fence {state.holder_fence} (ticket {state.holder_ticket})"
        lease = f"{(state.lease_left_ms or 0) / 1000:.3f} s unless renewed"
    else:
        held, lease = "no", "-"
    where = f"cache {cache!r}" if cache else "FIFOLOCK['CACHE']"
    lines = [
        ("lock", f"{name} (Redis lock {state.name!r}, {where})"),
        ("held", held),
        ("lease left", lease),
        ("waiting", str(state.waiting)),
        ("last fence", str(state.last_fence)),
    ]
    return "\n".join(f"{label:<11} {value}" for label, value in lines)
