"""``manage.py fifolock``: look at FIFO locks, break a stuck one, or run any command under one.

::

    manage.py fifolock list [--cache ALIAS] [--json]
    manage.py fifolock status NAME [--cache ALIAS] [--key-version N] [--json]
    manage.py fifolock release --force NAME [--fence N] [--cache ALIAS] [--key-version N]
    manage.py fifolock run NAME [--cache ALIAS] [--key-version N]
                               [--lock-timeout SECONDS | --no-wait] -- COMMAND [ARGS...]

``list`` prints one line per lock that has keys in the cache's namespace (held,
waited for, or used within ``keep_ms``): its name, holder fence, live waiters
and the holder's description. It walks the keys with ``SCAN``, never ``KEYS``.
A key there that no lock can have, or of a lock Redis refuses to read (a key
another program wrote with the wrong type), is skipped with a one-line note on
stderr.

``status`` prints whether the lock is held, by whom (the holder's recorded
description: host, process id, and the task, command or request path), the
holder's fence and ticket, how long its lease lasts unless renewed, how many
live requests wait and the last fence granted; ``--json`` prints the same as
one JSON object. A name Redis has no key of is reported as "no such lock
(never used, or expired)". It never joins the queue.

``release --force`` frees a lock whose holder is stuck: the next waiter is
granted at once with a higher fence, and the evicted holder's next renewal is
refused (its ``lease.lost`` becomes True). ``--fence N`` evicts only the grant
with fence N, so a lock that changed hands since you looked is left alone.

``run`` takes the lock (``NAME`` is turned into a cache key like
``cache.fifo_lock(NAME)`` does), runs ``COMMAND ARGS`` in this process with
``call_command`` and releases the lock when it ends, however it ends: any
existing management command is serialised across hosts without editing it. A
COMMAND whose ``handle`` is decorated with ``@fifo_locked_command`` for the
same lock takes the lock itself: it is run without taking it twice (which would
wait for itself for ever); one that takes it in its body is refused with a
``CommandError`` saying so: at once, or, if it asks with a timeout, when that
timeout has run out (the core lets a timed request wait, see ``reentry``). A
wait that runs out exits with status 1 and a message naming the holder's fence;
the command's own failure keeps its own exit status.

Django's common options (``--settings``, ``--pythonpath``, ``-v``/
``--verbosity``, ``--traceback``, ``--no-color``, ``--force-color``) are
accepted before or after the subcommand. A Redis that cannot be reached, or
refuses a command, ends the command with a one-line ``CommandError`` saying
what to check (the traceback only with ``--traceback``); so do an invalid lock
name, a ``--cache`` that is not in ``CACHES`` and a cache the lock cannot use
(at most ``MAX_MESSAGE_CHARS`` characters: a long name is cut short).
"""

from __future__ import annotations

import argparse
import inspect
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command, get_commands, load_command_class
from django.core.management.base import BaseCommand, CommandError, CommandParser
from redis.exceptions import NoPermissionError, ResponseError

from redis_fifo_lock import (
    LockStatus,
    LockTimeout,
    LockUsageError,
    RedisUnavailable,
    describing,
)
from redis_fifo_lock.inventory import lock_names_sync
from redis_fifo_lock.settings import shown_value

from ...commands import (
    LockedHandle,
    add_lock_arguments,
    busy_message,
    cache_where,
    lock_timeout_option,
    one_line,
    redis_errors,
)
from ...conf import fifolock_settings
from ...lock import CacheFifoLock, FifoLockMixin, SupportsFifoLock, lock_cache, namespace_of

NO_SUCH_LOCK = "no such lock (never used, or expired)"
"""What ``status`` says of a name Redis has no key of."""

MAX_MESSAGE_CHARS = 500
"""The most characters of a bad-input ``CommandError`` (longer ones are cut)."""


def _common_options(parser: CommandParser) -> None:
    """Accept Django's common options after a subcommand too (argparse gives a
    subcommand's parser only its own options). Their defaults are left to the
    main parser, so an option given before the subcommand is kept."""
    keep = argparse.SUPPRESS
    parser.add_argument(
        "-v", "--verbosity", type=int, choices=[0, 1, 2, 3], default=keep, help="as above"
    )
    parser.add_argument("--settings", default=keep, help="as above")
    parser.add_argument("--pythonpath", default=keep, help="as above")
    parser.add_argument("--traceback", action="store_true", default=keep, help="as above")
    parser.add_argument("--no-color", action="store_true", default=keep, help="as above")
    parser.add_argument("--force-color", action="store_true", default=keep, help="as above")


def _cache_argument(parser: CommandParser) -> None:
    parser.add_argument(
        "--cache",
        metavar="ALIAS",
        default=None,
        help="the CACHES alias whose fifo_lock() is used (default: FIFOLOCK['CACHE'])",
    )


def _lock_arguments(parser: CommandParser) -> None:
    parser.add_argument("name", help="the lock name, as given to cache.fifo_lock()")
    _cache_argument(parser)
    parser.add_argument(
        "--key-version",
        metavar="N",
        type=int,
        default=None,
        help="the cache key version of the lock name (default: the cache's VERSION)",
    )


def _fence(text: str) -> int:
    """``--fence``: a positive int, as fences are (argparse words the error).

    Raises:
        argparse.ArgumentTypeError: ``text`` is not a positive int.
    """
    try:
        fence = int(text)
    except ValueError:
        fence = 0
    if fence < 1:
        raise argparse.ArgumentTypeError(
            f"expected a positive int (a fence, as shown by fifolock status), got {_short(text)!r}"
        )
    return fence


def _short(text: str) -> str:
    """``text`` on one line, cut to ``MAX_MESSAGE_CHARS`` characters."""
    line = one_line(text)
    if len(line) <= MAX_MESSAGE_CHARS:
        return line
    return line[: MAX_MESSAGE_CHARS - 3] + "..."


@contextmanager
def input_errors(action: str) -> Iterator[None]:
    """Turn the refusal of a bad lock name (``ValueError``) or of the cache's
    settings (``ImproperlyConfigured``) in the block into a one-line
    ``CommandError`` of at most ``MAX_MESSAGE_CHARS`` characters, naming
    ``fifolock <action>`` (the core's messages already cut a long name)."""
    try:
        yield
    except ValueError as exc:
        raise CommandError(_short(f"fifolock {action}: invalid lock name: {exc}")) from exc
    except ImproperlyConfigured as exc:
        raise CommandError(_short(f"fifolock {action}: {exc}")) from exc


def _check_alias(action: str, alias: str | None) -> None:
    """Refuse a ``--cache`` that is not an alias in ``CACHES``.

    Raises:
        CommandError: naming the alias (cut short) and the aliases there are.
    """
    if alias is not None and alias not in settings.CACHES:
        raise CommandError(
            f"fifolock {action}: --cache {shown_value(alias)} is not an alias in CACHES; "
            f"use one of {sorted(settings.CACHES)}"[:MAX_MESSAGE_CHARS]
        )


class Command(BaseCommand):
    """``fifolock list``, ``status NAME``, ``release --force NAME`` and ``run NAME --
    COMMAND [ARGS...]``."""

    help = (
        "List FIFO locks, show one's state and holder, break a stuck one, or run another "
        "management command holding a lock."
    )
    requires_system_checks: list[str] = []  # noqa: RUF012 - Django's own annotation

    def add_arguments(self, parser: CommandParser) -> None:
        """Declare the ``list``, ``status``, ``release`` and ``run`` subcommands."""
        actions = parser.add_subparsers(
            dest="action", metavar="{list,status,release,run}", required=True
        )
        listing = actions.add_parser(
            "list", help="print every lock in the cache's namespace: holder, fence, waiters"
        )
        _cache_argument(listing)
        listing.add_argument("--json", action="store_true", help="print one JSON list")
        status = actions.add_parser(
            "status", help="print whether the lock is held and by whom, its fence and waiters"
        )
        _lock_arguments(status)
        status.add_argument("--json", action="store_true", help="print one JSON object")
        release = actions.add_parser(
            "release", help="--force: free a stuck lock; its holder's next renewal fails"
        )
        _lock_arguments(release)
        release.add_argument(
            "--force",
            action="store_true",
            help="required: say that you mean to take the lock from its holder",
        )
        release.add_argument(
            "--fence",
            type=_fence,
            default=None,
            metavar="N",
            help="evict only the grant with this fence (as shown by status)",
        )
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
        for sub in (listing, status, release, run):
            _common_options(sub)

    def handle(self, *args: Any, **options: Any) -> None:
        """Dispatch to ``list``, ``status``, ``release`` or ``run``.

        Raises:
            CommandError: unknown COMMAND, the lock could not be had in time,
                ``release`` without ``--force``, or Redis failed (one line);
                a ``--cache`` that is not in ``CACHES``, a cache the lock
                cannot use, or an invalid lock name (one line of at most
                ``MAX_MESSAGE_CHARS`` characters, a long name cut short).
        """
        action = options["action"]
        _check_alias(action, options["cache"])
        with input_errors(action):
            cache = lock_cache(options["cache"])
            where = cache_where(cache, options["cache"])
        if action == "list":
            with redis_errors(where):
                self.list_locks(cache, options)
            return
        with input_errors(action):
            lock = cache.fifo_lock(
                options["name"],
                lock_timeout_option(options, None),
                version=options["key_version"],
            )
        if options["action"] == "status":
            with redis_errors(where):
                self.status(lock, options)
        elif options["action"] == "release":
            self.release(lock, options, where)
        else:
            self.run(lock, options, where)

    def list_locks(self, cache: SupportsFifoLock, options: dict[str, Any]) -> None:
        """Print every lock with keys in the cache's namespace, one line each
        (or a JSON list of ``status --json`` objects with ``--json``).

        A key of the namespace that no lock can have (an invalid lock name),
        or a lock whose keys Redis refuses to read as a lock's (another
        program wrote a key of the wrong type), is skipped with a one-line
        note on stderr of at most ``MAX_MESSAGE_CHARS`` characters.

        Raises:
            LockError, RedisError: Redis failed (``handle`` words them).
            CommandError: the cache is not built on ``FifoLockMixin``, or its
                ``KEY_PREFIX`` cannot prefix lock keys (one short line).
        """
        if not isinstance(cache, FifoLockMixin):
            raise CommandError(
                f"fifolock list needs a cache backend built on FifoLockMixin, not "
                f"{type(cache).__qualname__}"
            )
        with input_errors("list"):
            namespace = namespace_of(cache)
        clients = cache.fifo_lock_clients
        settings = fifolock_settings().lock
        rows = []
        for redis_name in lock_names_sync(clients, namespace):
            try:
                lock = CacheFifoLock(clients, redis_name, None, settings, namespace)
                rows.append(status_fields(redis_name, options["cache"], lock.status()))
            except ValueError as exc:
                # A foreign key in the namespace, named like no lock can be.
                self.stderr.write(_short(f"fifolock list: skipped a key of no lock: {exc}"))
            except RedisUnavailable as exc:
                if not _refused_for_this_lock(exc):
                    raise
                self.stderr.write(_short(f"fifolock list: skipped {exc}"))
        if options["json"]:
            self.stdout.write(json.dumps(rows))
            return
        if not rows:
            self.stdout.write("no locks in this cache's namespace")
            return
        self.stdout.write(f"{'lock':<30} {'holder fence':>17} {'live waiters':>12}  holder")
        for row in rows:
            fence = row["holder_fence"] if row["held"] else "-"
            holder = row["holder"] if row["held"] else "(free)"
            self.stdout.write(
                f"{row['redis_lock']:<30} {fence!s:>17} {row['live_waiting']:>12}  {holder}"
            )

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

    def release(self, lock: CacheFifoLock, options: dict[str, Any], where: str) -> None:
        """Forcibly release the lock (only with ``--force``).

        Raises:
            CommandError: without ``--force``; when nothing was evicted (the
                lock is free, or ``--fence`` does not hold it); Redis failed.
        """
        name = options["name"]
        if not options["force"]:
            raise CommandError(
                f"fifolock release takes FIFO lock {name!r} from whoever holds it; pass "
                "--force to confirm (and --fence N, from fifolock status, to evict only "
                "that grant)"
            )
        with redis_errors(where):
            evicted = lock.sync_lock().force_release(options["fence"])
        if evicted is None:
            wanted = f" with fence {options['fence']}" if options["fence"] else ""
            raise CommandError(
                f"FIFO lock {name!r} (Redis lock {lock.name!r}) was not held{wanted}: "
                "nothing was released; see fifolock status"
            )
        self.stdout.write(
            f"released FIFO lock {name!r} (Redis lock {lock.name!r}) held by fence {evicted}; "
            "its holder's next renewal fails"
        )

    def run(self, lock: CacheFifoLock, options: dict[str, Any], where: str) -> None:
        """Run the named command in this process while holding ``lock``; release
        the lock however the command ends.

        Raises:
            CommandError: unknown COMMAND (before any waiting), the wait ran out
                (naming the holder's fence), Redis failed, the lease was lost
                while the command ran, the command took the same lock itself
                (at once without a timeout; when its timeout ran out with one),
                or the command's own error.
        """
        name: str = options["command"]
        args: list[str] = list(options["command_args"])
        if args[:1] == ["--"]:  # argparse versions differ on keeping the separator
            args = args[1:]
        try:
            app = get_commands()[name]
        except KeyError:
            raise CommandError(f"Unknown command: {name!r}") from None
        command = app if isinstance(app, BaseCommand) else load_command_class(app, name)
        if _takes_itself(command, lock):
            # It takes this very lock in its handle(): holding it here too would
            # make it wait for itself. Its own lock options come from ours.
            if options["verbosity"] >= 2:
                self.stderr.write(f"fifolock: {name} takes {lock.name!r} itself")
            call_command(command, *args, *_lock_options(options))
            return
        with redis_errors(where):
            try:
                with describing(f"manage.py fifolock run -- {name}"):
                    lease = lock.acquire()
            except LockTimeout as exc:
                raise CommandError(busy_message(options["name"], lock, exc, where)) from exc
        try:
            if options["verbosity"] >= 2:
                self.stderr.write(f"fifolock: {lock.name!r} held with fence {lease.fence}")
            call_command(command, *args)
        except LockUsageError as exc:
            if exc.name != lock.name:
                raise
            # It took the lock held here itself, not through a decorator that
            # could be seen beforehand: refused, not hung (see reentry).
            raise CommandError(
                f"{name} takes FIFO lock {options['name']!r} itself, and fifolock run "
                f"already holds it; run it without fifolock run ({exc.message})"
            ) from exc
        except LockTimeout as exc:
            if exc.name != lock.name:
                raise
            # It took the lock with a timeout: the core lets such a request
            # wait (see reentry), here for this very run, until it ran out.
            raise CommandError(
                f"{name} takes FIFO lock {options['name']!r} itself, and fifolock run "
                f"already holds it: it waited {exc.waited:.2f} s for itself until its "
                "timeout ran out; run it without fifolock run"
            ) from exc
        finally:
            with redis_errors(where):
                lock.release(lease)


def _refused_for_this_lock(exc: RedisUnavailable) -> bool:
    """Whether Redis answered but refused a script for this one lock (a key of
    the wrong type, say), as opposed to being out of reach or refusing the
    lock user a command (an ACL ``NOPERM``), which every lock would meet."""
    return isinstance(exc.cause, ResponseError) and not isinstance(exc.cause, NoPermissionError)


def _takes_itself(command: BaseCommand, lock: CacheFifoLock) -> bool:
    """Whether ``command``'s ``handle`` is a ``@fifo_locked_command`` of ``lock``."""
    handle = inspect.getattr_static(type(command), "handle", None)
    if not isinstance(handle, LockedHandle):
        return False
    own = lock_cache(handle.cache).fifo_lock(handle.name)
    return (own.name, own.namespace) == (lock.name, lock.namespace)


def _lock_options(options: dict[str, Any]) -> list[str]:
    """``--lock-timeout``/``--no-wait`` as given to ``run``, for a command that
    takes the lock itself."""
    if options.get("no_wait"):
        return ["--no-wait"]
    if options.get("lock_timeout") is not None:
        return ["--lock-timeout", str(options["lock_timeout"])]
    return []


def status_fields(name: str, cache: str | None, state: LockStatus) -> dict[str, Any]:
    """The ``status --json`` object: ``name``, ``cache`` (None for
    ``FIFOLOCK['CACHE']``), ``redis_lock``, ``exists`` (bool: False for a name
    Redis has no key of), ``held`` (bool), ``holder`` (str description, None
    when free), ``holder_fence``, ``holder_ticket``, ``lease_left_ms`` (int ms;
    None when free), ``waiting`` (int, queued), ``live_waiting`` (int, queued
    by live processes) and ``last_fence`` (the last fence granted, int)."""
    return {
        "name": name,
        "cache": cache,
        "redis_lock": state.name,
        "exists": state.known,
        "held": state.held,
        "holder": state.holder,
        "holder_fence": state.holder_fence,
        "holder_ticket": state.holder_ticket,
        "lease_left_ms": state.lease_left_ms,
        "waiting": state.waiting,
        "live_waiting": state.live_waiting,
        "last_fence": state.last_fence,
    }


def status_text(name: str, cache: str | None, state: LockStatus) -> str:
    """The ``status`` text: one ``label  value`` line per fact."""
    where = f"cache {cache!r}" if cache else "FIFOLOCK['CACHE']"
    lock = ("lock", f"{name} (Redis lock {state.name!r}, {where})")
    if not state.known:
        lines = [lock, ("state", NO_SUCH_LOCK)]
        return "\n".join(f"{label:<11} {value}" for label, value in lines)
    if state.held:
        held = f"yes, by fence {state.holder_fence} (ticket {state.holder_ticket})"
        holder = state.holder or "(not recorded)"
        lease = f"{(state.lease_left_ms or 0) / 1000:.3f} s unless renewed"
    else:
        held, holder, lease = "no", "-", "-"
    dead = state.waiting - state.live_waiting
    waiting = str(state.live_waiting) + (f" (and {dead} of dead processes)" if dead else "")
    lines = [
        lock,
        ("held", held),
        ("holder", holder),
        ("lease left", lease),
        ("waiting", waiting),
        ("last fence", str(state.last_fence)),
    ]
    return "\n".join(f"{label:<11} {value}" for label, value in lines)
