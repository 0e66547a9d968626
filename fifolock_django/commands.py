"""``fifo_locked_command``: run a management command's ``handle`` under a FIFO lock.

::

    class Command(BaseCommand):
        @fifo_locked_command("nightly-invoices", timeout=600)
        def handle(self, *args, **options):
            print("fence", self.fifo_lease.fence)

Two runs of the command (any hosts sharing the Redis cache) are served one
after the other in the order they reached Redis. The decorator also gives the
command two options: ``--lock-timeout SECONDS`` (overrides ``timeout``) and
``--no-wait`` (give up at once if the lock is held).
"""

from __future__ import annotations

import argparse
import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

from django.core.management.base import BaseCommand, CommandError, CommandParser
from redis.exceptions import NoPermissionError, RedisError

from redis_fifo_lock import LockError, LockTimeout, describing
from redis_fifo_lock.acl import refusal
from redis_fifo_lock.lock import check_timeout
from redis_fifo_lock.settings import check_name

from .lock import CacheFifoLock, FifoLockMixin, SupportsFifoLock, lock_cache

Handle = TypeVar("Handle", bound=Callable[..., Any])

ADDED = "fifolock_lock_arguments"
"""Attribute ``add_lock_arguments`` sets on a parser it has extended."""


def fifo_locked_command(
    name: str, timeout: float | None = None, *, cache: str | None = None
) -> Callable[[Handle], Handle]:
    """Decorate a command's ``handle`` so that it runs holding FIFO lock ``name``.

    Args:
        name: the lock name (str, no ``{``/``}``); it becomes a key of the cache,
            so the cache's ``KEY_PREFIX`` and ``VERSION`` apply.
        timeout: seconds (float) a run waits for the lock; None (default) waits
            as long as it takes. ``--lock-timeout``/``--no-wait`` override it.
        cache: alias (str) of the cache whose ``fifo_lock()`` is used; default
            ``FIFOLOCK['CACHE']`` (read when the command runs).

    While ``handle`` runs, the command's ``fifo_lease`` attribute is the
    ``Lease`` (``.fence`` is the fencing token to hand to what you protect).
    ``name``, fixed in the code, is also the lock's ``name_template`` in its
    OpenTelemetry metrics (``redis_fifo_lock.metrics``).
    The grant records ``manage.py <command>`` as its holder (``fifolock
    status`` shows it). Locks are not reentrant: ``handle`` taking the same
    lock again without a timeout raises ``LockUsageError`` at once.

    Raises:
        ValueError: at decoration, for a bad ``name`` or ``timeout``.
        TypeError: when the decorated function is not in a ``BaseCommand`` class
            (Python < 3.12 raises it as the cause of a ``RuntimeError``).

    When the command runs, a ``LockTimeout`` becomes ``CommandError`` (exit
    status 1) naming the lock, the wait in seconds and the holder's fence;
    ``RedisUnavailable`` (taking or releasing the lock) and ``LeaseLost`` (at
    the release) become a one-line ``CommandError`` naming the lock, the cache
    and server and what to check (see ``redis_errors``). An error raised by
    ``handle`` itself propagates unchanged.
    """
    check_name(name)
    check_timeout(timeout)

    def decorate(handle: Handle) -> Handle:
        return cast(Handle, LockedHandle(handle, name, timeout, cache))

    return decorate


def add_lock_arguments(parser: CommandParser, default_timeout: float | None) -> None:
    """Add ``--lock-timeout SECONDS`` (float >= 0) and ``--no-wait`` to ``parser``.

    They are mutually exclusive, and land in the options as ``lock_timeout``
    (None when not given) and ``no_wait`` (bool); ``lock_timeout_option`` turns
    them into a timeout. ``default_timeout`` (seconds, None for no limit) is
    only shown in the help. A parser gets them once: a second call on the
    same parser does nothing.
    """
    if getattr(parser, ADDED, False):
        return
    setattr(parser, ADDED, True)
    group = parser.add_mutually_exclusive_group()
    shown = "wait as long as it takes" if default_timeout is None else f"{default_timeout:g} s"
    group.add_argument(
        "--lock-timeout",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help=f"seconds to wait for the command's FIFO lock (default: {shown})",
    )
    group.add_argument(
        "--no-wait",
        action="store_true",
        help="fail at once if another run holds the command's FIFO lock",
    )


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
        check_timeout(seconds)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}") from exc
    return seconds


class LockedHandle:
    """A ``handle`` method wrapped by ``fifo_locked_command`` (a method descriptor).

    ``__set_name__`` - Python's hook called when the class body that defines
    ``handle`` is turned into a class - extends that class's ``add_arguments``
    with ``add_lock_arguments``, so the one decorator is all a command needs.
    In a class hierarchy with several decorated ``handle`` methods whose
    ``add_arguments`` call ``super()``, the options are added once, their help
    showing the timeout of the ``handle`` the command runs.
    """

    def __init__(
        self, handle: Callable[..., Any], name: str, timeout: float | None, cache: str | None
    ) -> None:
        functools.update_wrapper(self, handle)
        self.handle = handle
        self.name = name
        self.timeout = timeout
        self.cache = cache

    def __set_name__(self, owner: type, attribute: str) -> None:
        if not issubclass(owner, BaseCommand):
            raise TypeError(
                f"@fifo_locked_command decorates the handle() of a management command, "
                f"but {owner.__qualname__} is not a django BaseCommand"
            )
        declared = owner.add_arguments
        default_timeout = self.timeout

        def add_arguments(command: BaseCommand, parser: CommandParser) -> None:
            declared(command, parser)
            runs = inspect.getattr_static(type(command), "handle", None)
            shown = runs.timeout if isinstance(runs, LockedHandle) else default_timeout
            add_lock_arguments(parser, shown)

        functools.update_wrapper(add_arguments, declared)
        setattr(owner, "add_arguments", add_arguments)  # noqa: B010 - mypy: method-assign

    def __get__(self, command: BaseCommand | None, owner: type | None = None) -> Any:
        if command is None:
            return self
        return functools.partial(self, command)

    def __call__(self, command: BaseCommand, *args: Any, **options: Any) -> Any:
        """Run ``handle`` holding the lock (see ``fifo_locked_command``).

        Raises:
            CommandError: the wait ran out, Redis failed taking or releasing
                the lock, or the lease was lost by the release (one line).
        """
        timeout = lock_timeout_option(options, self.timeout)
        cache = lock_cache(self.cache)
        lock = cache.fifo_lock(self.name, timeout, name_template=self.name)
        where = cache_where(cache, self.cache)
        with redis_errors(where):
            try:
                with describing(f"manage.py {command_name(command)}"):
                    lease = lock.__enter__()
            except LockTimeout as exc:
                raise CommandError(busy_message(self.name, lock, exc, where)) from exc
        command.fifo_lease = lease  # type: ignore[attr-defined]
        try:
            result = self.handle(command, *args, **options)
        except BaseException as error:
            # The lock's exit releases, attaches a failed release to the
            # error, and lets the error propagate as it is.
            lock.__exit__(type(error), error, error.__traceback__)
            raise
        with redis_errors(where):
            lock.__exit__(None, None, None)
        return result


def cache_where(cache: SupportsFifoLock, alias: str | None) -> str:
    """Which cache (``alias``, None for ``FIFOLOCK['CACHE']``) and server, for
    error messages (passwords never shown)."""
    name = f"cache {alias!r}" if alias else "FIFOLOCK['CACHE']"
    if isinstance(cache, FifoLockMixin):
        return f"{name} at {cache.fifo_lock_connection().describe()}"
    return name


@contextmanager
def redis_errors(where: str) -> Iterator[None]:
    """Turn a lock's ``LockError`` (``RedisUnavailable``, ``LeaseLost``...) or a
    redis-py error raised in the block into a one-line ``CommandError`` naming
    ``where`` (str: the cache and server, see ``cache_where``) and what to check:
    for an ACL refusal (``NOPERM``), the command refused and the rule to add.

    Raises:
        CommandError: in place of those errors.
    """
    try:
        yield
    except LockError as exc:
        raise CommandError(one_line(f"{exc} ({where})")) from exc
    except NoPermissionError as exc:
        refused = refusal(str(exc)) or str(exc)
        raise CommandError(
            one_line(
                f"Redis's ACL refused a command ({where}): {refused}; the rules a lock "
                "user needs are in Running with least privilege (docs/security.md)"
            )
        ) from exc
    except RedisError as exc:
        raise CommandError(
            one_line(
                f"Redis failed ({where}): {type(exc).__name__}: {exc}; check that the "
                "server is running and reachable, and the cache's LOCATION and credentials"
            )
        ) from exc


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines too) made one space."""
    return " ".join(text.split())


def command_name(command: BaseCommand) -> str:
    """The name ``manage.py`` knows ``command`` by: its module's last part (str)."""
    return type(command).__module__.rpartition(".")[2]


def lock_timeout_option(options: dict[str, Any], default: float | None) -> float | None:
    """The lock timeout in seconds (float, or None to wait forever) that the
    options of ``add_lock_arguments`` ask for: 0 for ``--no-wait``, else
    ``--lock-timeout`` if given, else ``default``."""
    if options.get("no_wait"):
        return 0.0
    given: float | None = options.get("lock_timeout")
    return default if given is None else given


def busy_message(name: str, lock: CacheFifoLock, exc: LockTimeout, where: str) -> str:
    """The ``CommandError`` text for a timed-out wait on ``lock`` (called ``name``
    by the command): the lock, the wait in seconds and the holder's fence; or,
    when Redis answered neither the wait nor a question about the holder, that
    Redis did not answer, ``where`` (str, see ``cache_where``) and what to check."""
    fence = exc.holder_fence
    if fence is None:
        # With a zero timeout the wait can end before this process has polled,
        # so the error may not know the holder: ask Redis.
        try:
            fence = lock.sync_lock().status().holder_fence
        except LockError:
            # No busy lock: Redis did not answer (frozen, or overloaded).
            return (
                f"FIFO lock {name!r} (Redis lock {lock.name!r}) was not acquired within "
                f"{lock.timeout or 0:g} s: Redis did not answer ({where}), neither while "
                "waiting nor when asked who held the lock after it; check that the server "
                "is running, reachable and not overloaded, then run again"
            )
    holder = "nobody held it when the wait ended" if fence is None else f"held by fence {fence}"
    return (
        f"FIFO lock {name!r} (Redis lock {lock.name!r}) is busy: not acquired "
        f"within {lock.timeout or 0:g} s (waited {exc.waited:.2f} s); {holder}. "
        "Run again later or pass --lock-timeout SECONDS to wait longer."
    )
