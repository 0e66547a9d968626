"""``@fifo_locked``: run a Celery task body holding a FIFO lock.

Usage (``@app.task`` goes on top)::

    @app.task(bind=True)
    @fifo_locked("invoice-{invoice_id}", lease_ms=30_000)
    def send_invoice(self, invoice_id: int) -> None:
        fence = current_lease().fence
        ...

The lock is taken when the body runs, in the worker, so tasks sent by name
(``app.send_task``) are covered. Each execution queues with a fresh token:
two executions of one task id (a redelivery while the first still runs) take
turns like any two tasks.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar, cast

from celery import Task
from celery._state import get_current_task

from redis_fifo_lock import LockUsageError, SyncFifoLock
from redis_fifo_lock.lock import check_timeout

from .clients import lock_for
from .lease import holding
from .names import NameTemplate
from .settings import check_ms

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class LockSpec:
    """What ``@fifo_locked`` was given, checked: how a task body is locked.

    Attributes:
        name: the lock name or its template (``NameTemplate``).
        timeout: seconds (float) to wait for the lock, or None to wait forever.
        lease_ms, poll_ms, max_hold_ms: per-task overrides (int milliseconds) of
            the app's ``fifo_lock_*`` settings, or None to use the app's.
    """

    name: NameTemplate
    timeout: float | None
    lease_ms: int | None
    poll_ms: int | None
    max_hold_ms: int | None

    def lock(
        self, task: Task[Any, Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> SyncFifoLock:
        """The lock for one execution of ``task`` with these arguments.

        Raises:
            LockUsageError: no Redis URL configured for ``task.app``.
            ValueError: a formatted name or a timing setting is invalid.
            TypeError: the arguments do not fit the task function.
        """
        return lock_for(
            task.app,
            self.name.format(args, kwargs),
            lease_ms=self.lease_ms,
            poll_ms=self.poll_ms,
            max_hold_ms=self.max_hold_ms,
        )


def _running_task(args: tuple[Any, ...], spec: LockSpec) -> Task[Any, Any]:
    """The task executing the body: ``self`` of a bound task, else ``current_task``."""
    if args and isinstance(args[0], Task):
        return args[0]
    task = cast("Task[Any, Any] | None", get_current_task())
    if task is None:
        raise LockUsageError(
            spec.name.template,
            "a @fifo_locked function was called outside a Celery task; run it as a task "
            "(.delay(), .apply_async(), .apply() or by calling the task object)",
        )
    return task


def fifo_locked(
    name: str,
    timeout: float | None = None,
    *,
    lease_ms: int | None = None,
    poll_ms: int | None = None,
    max_hold_ms: int | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a Celery task function so that its body runs holding a FIFO lock.

    Put it under ``@app.task`` (or ``@shared_task``). While the body runs the
    lease is renewed in the background, and ``current_lease()`` returns it. The
    lock is released when the body returns or raises anything, including the
    ``celery.exceptions.Retry`` raised by ``self.retry()`` (the retry waits its
    turn like any other execution). A task waiting for the lock occupies its
    worker slot (process or thread) while it waits.

    Args:
        name: the lock name (str), or a template whose ``{fields}`` name the
            function's parameters, e.g. ``"invoice-{invoice_id}"``: arguments are
            bound with their defaults applied, so positional, keyword and default
            calls give the same name.
        timeout: seconds (float) to wait for the lock; None (default) waits
            forever. When it runs out the task fails with
            ``redis_fifo_lock.LockTimeout`` (a ``TimeoutError``).
        lease_ms, poll_ms, max_hold_ms: overrides (int milliseconds) of the app's
            ``fifo_lock_lease_ms`` / ``fifo_lock_poll_ms`` / ``fifo_lock_max_hold_ms``
            for this task; None (default) uses the app's (see
            ``fifolock_celery.settings``).

    The decorated function carries its ``LockSpec`` as ``fifo_lock_spec``
    (e.g. ``task.run.fifo_lock_spec.name.template``) and keeps the signature of
    ``func``, so Celery still checks call arguments.

    Raises (at decoration):
        ValueError: a template naming a parameter the function does not take, a
            positional ``{}`` field, a name that can never be valid, a bad
            ``timeout`` or a timing option that is not a positive int.
        TypeError: applied on top of ``@app.task`` or to an ``async def``.

    The task then raises (at run time), besides what the body raises:
        LockTimeout: ``timeout`` ran out; nothing is left queued.
        RedisUnavailable: Redis could not be reached to acquire or release.
        LeaseLost: at release, the lease had been lost while the body ran (it
            outlived ``max_hold_ms``, or the process stalled beyond ``lease_ms``):
            another execution may have overlapped. This failure is deliberately
            loud; it replaces the body's own exception, which stays attached as
            ``__context__``.
        LockUsageError: no Redis URL configured (the message names
            ``fifo_lock_redis_url``), or the body re-entered its own lock.
        ValueError: the formatted name or the merged timing settings are invalid.
    """
    checked_timeout = check_timeout(timeout)
    options = {"lease_ms": lease_ms, "poll_ms": poll_ms, "max_hold_ms": max_hold_ms}
    for option, value in options.items():
        if value is not None:
            check_ms(f"@fifo_locked({option}=...)", value)

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        if isinstance(func, Task):
            raise TypeError(
                f"@fifo_locked({name!r}) was applied to the task {func.name}; put it under "
                "@app.task, directly on the function"
            )
        if inspect.iscoroutinefunction(func):
            raise TypeError(
                f"@fifo_locked({name!r}) cannot lock the async function {func.__qualname__}: "
                "Celery runs task bodies synchronously"
            )
        spec = LockSpec(NameTemplate(name, func), checked_timeout, lease_ms, poll_ms, max_hold_ms)

        @functools.wraps(func)
        def locked(*args: P.args, **kwargs: P.kwargs) -> R:
            lock = spec.lock(_running_task(args, spec), args, kwargs)
            with holding(lock, spec.timeout):
                return func(*args, **kwargs)

        # Celery checks call arguments against the function's signature; give it
        # the real one rather than (*args, **kwargs).
        locked.__signature__ = spec.name.signature  # type: ignore[attr-defined]
        locked.fifo_lock_spec = spec  # type: ignore[attr-defined]
        return locked

    return decorate
