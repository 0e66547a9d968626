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
turns like any two tasks. ``FifoLockedTask`` (``fifolock_celery.task``) offers
the same through ``base=``; both run ``run_locked`` below.
"""

from __future__ import annotations

import enum
import functools
import inspect
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar, cast, overload

from celery import Celery, Task
from celery._state import get_current_task

from redis_fifo_lock import LockOptions, LockTimeout, LockUsageError, SyncFifoLock, describing
from redis_fifo_lock.lock import check_timeout
from redis_fifo_lock.settings import Spelling, given_options

from .lease import acquire, published
from .names import NameTemplate
from .policies import DEFAULT_COUNTDOWN_S, Policy, check_countdown, check_policy, contended, granted
from .settings import LockConfig

if TYPE_CHECKING:
    from typing_extensions import Unpack

P = ParamSpec("P")
R = TypeVar("R")


class Unset(enum.Enum):
    """Type of ``UNSET``, the default of ``timeout`` that depends on the policy."""

    UNSET = "UNSET"


UNSET = Unset.UNSET
"""``timeout`` not given: None (wait forever) for ``wait``, 0 (try once) otherwise."""


def decorator_spelling(option: str) -> str:
    """How ``@fifo_locked`` spells a lock option in messages: ``@fifo_locked(lease_ms=...)``."""
    return f"@fifo_locked({option}=...)"


def check_options(
    timeout: object,
    policy: object,
    countdown: object,
    options: Mapping[str, object],
    *,
    spell: Spelling = decorator_spelling,
) -> tuple[float | None, Policy, float, dict[str, int]]:
    """Check the lock options that do not depend on the function.

    Args:
        timeout, policy, countdown: as for ``fifo_locked``.
        options: the lock options given (``redis_fifo_lock.LockOptions`` keys).
        spell: how an option is spelled by the user, for error messages
            (default: ``@fifo_locked(lease_ms=...)``).

    Returns:
        ``(timeout, policy, countdown, options)``: the timeout in seconds
        (float, or None to wait forever) with ``UNSET`` resolved for the
        policy, the policy, the countdown in seconds (float), and the lock
        options given (None ones left out), each checked on its own.

    Raises:
        ValueError: naming the option, for any value ``fifo_locked`` refuses.
        TypeError: an option that is not a lock option.
    """
    checked_policy = check_policy(policy)
    checked_timeout: float | None
    if timeout is UNSET:
        checked_timeout = None if checked_policy == "wait" else 0.0
    elif timeout is None and checked_policy != "wait":
        raise ValueError(
            f"{spell('timeout')} is None, which waits forever, so the {checked_policy!r} "
            "policy would never apply; give a number of seconds (0 tries once)"
        )
    else:
        checked_timeout = check_timeout(timeout)
    checked_countdown = check_countdown(countdown)
    return checked_timeout, checked_policy, checked_countdown, given_options(options, spell)


@dataclass(frozen=True)
class LockSpec:
    """How a task body is locked: the checked options of ``@fifo_locked`` or
    of a ``FifoLockedTask``.

    Attributes:
        name: the lock name or its template (``NameTemplate``).
        timeout: seconds (float) to wait for the lock, or None to wait forever.
        policy: what to do when ``timeout`` runs out: "wait" (fail with
            ``LockTimeout``), "retry" or "skip" (see ``fifolock_celery.policies``).
        countdown: seconds (float) before a task republished by "retry" runs.
        options: the task's own lock options (``lease_ms``, ``poll_ms``,
            ``max_hold_ms``, ``replica_wait_ms`` in int milliseconds,
            ``replicas``), overriding the app's ``fifo_lock_*`` settings; the
            options not given are absent.
        spell: how the task spells an option, for messages.

    Build it with ``LockSpec.build``, which checks every value.
    """

    name: NameTemplate
    timeout: float | None
    policy: Policy
    countdown: float
    options: dict[str, int]
    spell: Spelling = field(default=decorator_spelling, repr=False, compare=False)

    @classmethod
    def build(
        cls,
        name: str,
        func: Callable[..., Any],
        *,
        timeout: float | Unset | None = UNSET,
        policy: Policy = "wait",
        countdown: float = DEFAULT_COUNTDOWN_S,
        spell: Spelling = decorator_spelling,
        **options: Unpack[LockOptions],
    ) -> LockSpec:
        """Check the options for ``func`` and return them as a ``LockSpec``.

        Args:
            name: lock name or template (str), see ``NameTemplate``.
            func: the task function (its signature fills the template).
            timeout, policy, countdown, and the lock options: as for
                ``fifo_locked``.
            spell: how an option is spelled by the user, for error messages.

        Raises:
            ValueError: naming the option, for any value ``fifo_locked``
                refuses (see there).
            TypeError: an option that is not a lock option.
        """
        checked_timeout, checked_policy, checked_countdown, given = check_options(
            timeout, policy, countdown, options, spell=spell
        )
        return cls(
            NameTemplate(name, func),
            checked_timeout,
            checked_policy,
            checked_countdown,
            given,
            spell,
        )

    def config(self, app: Celery, name: str) -> LockConfig:
        """The app's lock settings with this task's options, for the lock ``name``.

        Raises:
            LockUsageError, ValueError: as ``LockConfig.from_app``.
        """
        return LockConfig.from_app(app, name, spell=self.spell, **self.options)

    def lock(self, task: Task[Any, Any], name: str) -> SyncFifoLock:
        """The lock named ``name`` for one execution of ``task``.

        Raises:
            LockUsageError: no Redis URL configured for ``task.app``.
            ValueError: the name or a lock setting is invalid (or ``replicas``
                is above 0 on a Redis Cluster).
        """
        return self.config(task.app, name).lock(name, self.name.template)


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


def run_locked(
    spec: LockSpec, func: Callable[..., R], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> R | str:
    """Run ``func(*args, **kwargs)`` as the body of the current task, holding its lock.

    Returns:
        What ``func`` returns, or ``SKIPPED`` when the "skip" policy skipped it.

    Raises:
        What ``func`` raises, and what ``fifo_locked`` documents.
    """
    task = _running_task(args, spec)
    lock = spec.lock(task, spec.name.format(args, kwargs, task.name))
    started = time.monotonic()
    try:
        with describing(f"celery task {task.name}[{task.request.id}]"):
            lease = acquire(lock, spec.timeout)
    except LockTimeout as busy:
        return contended(task, spec.policy, spec.countdown, busy)
    with published(lock, lease):
        granted(task, spec.policy, lease, time.monotonic() - started)
        return func(*args, **kwargs)


def locked_function(func: Callable[P, R], spec: LockSpec) -> Callable[P, R | str]:
    """``func`` wrapped to run under ``spec``'s lock (the work of ``@fifo_locked``).

    The wrapper keeps ``func``'s signature (Celery checks call arguments with
    it) and carries ``spec`` as its ``fifo_lock_spec`` attribute.
    """

    @functools.wraps(func)
    def locked(*args: P.args, **kwargs: P.kwargs) -> R | str:
        return run_locked(spec, func, args, kwargs)

    # Give Celery the real signature rather than (*args, **kwargs).
    locked.__signature__ = spec.name.signature  # type: ignore[attr-defined]
    locked.fifo_lock_spec = spec  # type: ignore[attr-defined]
    return locked


@overload
def fifo_locked(
    name: str,
    timeout: float | Unset | None = ...,
    *,
    policy: Literal["wait", "retry"] = ...,
    countdown: float = ...,
    **options: Unpack[LockOptions],
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


@overload
def fifo_locked(
    name: str,
    timeout: float | Unset | None = ...,
    *,
    policy: Policy,
    countdown: float = ...,
    **options: Unpack[LockOptions],
) -> Callable[[Callable[P, R]], Callable[P, R | str]]: ...


def fifo_locked(
    name: str,
    timeout: float | Unset | None = UNSET,
    *,
    policy: Policy = "wait",
    countdown: float = DEFAULT_COUNTDOWN_S,
    **options: Unpack[LockOptions],
) -> Callable[[Callable[P, R]], Callable[P, R]] | Callable[[Callable[P, R]], Callable[P, R | str]]:
    """Decorate a Celery task function so that its body runs holding a FIFO lock.

    Put it under ``@app.task`` (or ``@shared_task``). While the body runs the
    lease is renewed in the background, and ``current_lease()`` returns it. The
    lock is released when the body returns or raises anything, including the
    ``celery.exceptions.Retry`` raised by ``self.retry()`` (the retry waits its
    turn like any other execution). A task waiting for the lock occupies its
    worker slot (process or thread) while it waits. The grant records
    ``celery task <name>[<id>]`` as its holder (``LockStatus.holder``). Locks
    are not reentrant: the body taking its own lock again (another locked task
    run inline, or the core's lock without a timeout) raises ``LockUsageError``
    at once.

    Args:
        name: the lock name (str), or a template whose ``{fields}`` name the
            function's parameters, e.g. ``"invoice-{invoice_id}"``: arguments are
            bound with their defaults applied, so positional, keyword and default
            calls give the same name.
        timeout: seconds (float) to wait for the lock before ``policy`` applies;
            None waits forever (``wait`` only). Default: None for ``wait``, 0
            (try once) for ``retry`` and ``skip``.
        policy: what a task does when the lock stays busy for ``timeout``:
            ``"wait"`` (default) fails with ``LockTimeout``; ``"retry"``
            republishes the task to run after ``countdown`` seconds without
            spending ``max_retries``; ``"skip"`` returns ``SKIPPED`` without
            running the body. See ``fifolock_celery.policies``.
        countdown: seconds (float) before a task republished by ``"retry"``
            runs again; default 5.0.
        lease_ms, poll_ms, max_hold_ms: overrides (int milliseconds) of the app's
            ``fifo_lock_lease_ms`` / ``fifo_lock_poll_ms`` / ``fifo_lock_max_hold_ms``
            for this task; None (default) uses the app's (see
            ``fifolock_celery.settings``).
        replicas: override (int, 0 to 1000) of the app's ``fifo_lock_replicas``:
            how many replicas must acknowledge each grant and renewal (for
            Sentinel set-ups; not on Redis Cluster). None (default) uses the
            app's.
        replica_wait_ms: override (int milliseconds) of the app's
            ``fifo_lock_replica_wait_ms``: how long each grant and renewal waits
            for those acknowledgements. None (default) uses the app's.

    The decorated function carries its ``LockSpec`` as ``fifo_lock_spec``
    (e.g. ``task.run.fifo_lock_spec.name.template``) and keeps the signature of
    ``func``, so Celery still checks call arguments.

    Raises (at decoration):
        ValueError: a template naming a parameter the function does not take, a
            positional ``{}`` field, a name that can never be valid, an unknown
            ``policy``, a bad ``timeout`` or ``countdown``, ``timeout=None``
            with ``retry`` or ``skip``, a timing option that is not a positive
            int, or ``replicas`` that is not an int of 0 to 1000.
        TypeError: applied on top of ``@app.task`` or to an ``async def``, or
            an option that is not a lock option.

    The task then raises (at run time), besides what the body raises:
        LockTimeout: ``timeout`` ran out under the ``wait`` policy (or under
            ``retry`` in an eager call); nothing is left queued.
        celery.exceptions.Retry: the ``retry`` policy republished the task.
        RedisUnavailable: Redis could not be reached to acquire, or to release
            after a body that returned (the release is tried again first, for
            about 1.5 to 5 s, as ``SyncFifoLock.hold`` does). After a body that
            raised, the body's exception is what the task raises, with the
            release's failure attached as its ``fifolock_release_error``.
        NotReplicated: (a ``RedisUnavailable``) with ``replicas`` above 0, fewer
            replicas acknowledged the grant in time; the body did not run.
        LeaseLost: at release, the lease had been lost while the body ran (it
            outlived ``max_hold_ms``, or the process stalled or was cut off from
            Redis beyond ``lease_ms``; also when the release cannot reach
            Redis then): another execution may have overlapped. This failure is
            deliberately loud; it replaces the body's own exception, which stays attached as
            ``__context__``.
        LockUsageError: no Redis URL configured (the message names
            ``fifo_lock_redis_url``), the body re-entered its own lock, or the
            name cannot be filled from the call (the message names the task).
        ValueError: the formatted name or the merged lock settings are invalid,
            or ``replicas`` is above 0 on a Redis Cluster lock server.
    """

    def decorate(func: Callable[P, R]) -> Callable[P, R | str]:
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
        spec = LockSpec.build(
            name, func, timeout=timeout, policy=policy, countdown=countdown, **options
        )
        return locked_function(func, spec)

    # Checked before any function is seen, so a bad option fails at the
    # decorator's own line.
    check_options(timeout, policy, countdown, options)
    return decorate
