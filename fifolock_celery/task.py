"""``FifoLockedTask``: the FIFO lock as a Celery task base class.

For users who prefer ``base=`` to a decorator; the options are task
attributes, so they can be given to ``@app.task`` or set on a subclass::

    @app.task(base=FifoLockedTask, fifo_lock_name="invoice-{invoice_id}")
    def send_invoice(invoice_id: int) -> None:
        ...

    class LedgerTask(FifoLockedTask):
        fifo_lock_name = "ledger-{customer_id}"
        fifo_lock_policy = "retry"
        fifo_lock_countdown = 10

    @app.task(base=LedgerTask, bind=True)
    def post_entry(self, customer_id: int, amount: int) -> None:
        ...

The task's ``run`` is wrapped when its class is created (by ``@app.task`` or a
class statement), with exactly what ``@fifo_locked`` does, so a bad option or a
template naming a missing argument fails there, naming the task.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from celery import Task

from redis_fifo_lock.settings import LOCK_OPTIONS

from .decorator import UNSET, LockSpec, Unset, locked_function
from .policies import DEFAULT_COUNTDOWN_S, Policy

OPTIONS = (
    "fifo_lock_name",
    "fifo_lock_timeout",
    "fifo_lock_policy",
    "fifo_lock_countdown",
    "fifo_lock_lease_ms",
    "fifo_lock_poll_ms",
    "fifo_lock_max_hold_ms",
    "fifo_lock_replicas",
    "fifo_lock_replica_wait_ms",
)
"""The task attributes that configure the lock."""


if TYPE_CHECKING:
    _Task = Task[Any, Any]
else:
    _Task = Task  # Celery < 5.4 has no Task[...] at run time


class FifoLockedTask(_Task):
    """A Celery task whose body runs holding a FIFO lock.

    Attributes (set them on a subclass, or pass them to ``@app.task``):
        fifo_lock_name: the lock name or template (str), as ``@fifo_locked``'s
            ``name``. Required on every task that has a body.
        fifo_lock_timeout: seconds (float) to wait before the policy applies;
            None waits forever (``wait`` only). Default: None for ``wait``, 0
            for ``retry`` and ``skip``.
        fifo_lock_policy: "wait" (default), "retry" or "skip"; see
            ``fifolock_celery.policies``.
        fifo_lock_countdown: seconds (float) before a task republished by
            "retry" runs again; default 5.0.
        fifo_lock_lease_ms, fifo_lock_poll_ms, fifo_lock_max_hold_ms,
            fifo_lock_replica_wait_ms: per-task overrides (int milliseconds) of
            the app settings of the same names; None (default) uses the app's.
        fifo_lock_replicas: per-task override (int) of the app setting of the
            same name (replicas that must acknowledge each grant and renewal);
            None (default) uses the app's.
        fifo_lock_spec: the checked options (``LockSpec``), set on each class
            that has a body; None on the abstract ones.

    Raises (when a task class with a body is created, e.g. by ``@app.task``):
        TypeError: ``fifo_lock_name`` is not set, or the body is also decorated
            with ``@fifo_locked`` (it would lock twice).
        ValueError: a bad option or template, as for ``@fifo_locked``; the
            message names the task.

    At run time the task raises what ``@fifo_locked`` documents.
    ``current_lease()`` gives the body its lease.
    """

    fifo_lock_name: ClassVar[str | None] = None
    fifo_lock_timeout: ClassVar[float | Unset | None] = UNSET
    fifo_lock_policy: ClassVar[Policy] = "wait"
    fifo_lock_countdown: ClassVar[float] = DEFAULT_COUNTDOWN_S
    fifo_lock_lease_ms: ClassVar[int | None] = None
    fifo_lock_poll_ms: ClassVar[int | None] = None
    fifo_lock_max_hold_ms: ClassVar[int | None] = None
    fifo_lock_replicas: ClassVar[int | None] = None
    fifo_lock_replica_wait_ms: ClassVar[int | None] = None
    fifo_lock_spec: ClassVar[LockSpec | None] = None

    # The body as written, and whether it is a staticmethod (unbound task),
    # kept so that a subclass changing only options re-wraps the original.
    _fifo_lock_body: ClassVar[tuple[Callable[..., Any], bool] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("run")
        if own is not None:
            body = (own.__func__, True) if isinstance(own, staticmethod) else (own, False)
        elif cls._fifo_lock_body is not None and any(opt in cls.__dict__ for opt in OPTIONS):
            body = cls._fifo_lock_body
        else:
            return  # abstract, or inheriting a body locked with the same options
        func, static = body
        task = cls.__dict__.get("name") or f"{cls.__module__}.{cls.__qualname__}"
        where = f"FifoLockedTask {task}"
        if getattr(func, "fifo_lock_spec", None) is not None:
            raise TypeError(
                f"{where}: its function is also decorated with @fifo_locked, which would "
                "take the lock twice; use either base=FifoLockedTask or @fifo_locked"
            )
        if cls.fifo_lock_name is None:
            raise TypeError(
                f"{where} has no fifo_lock_name: pass fifo_lock_name='...' to @app.task "
                "or set it on the class"
            )
        try:
            spec = LockSpec.build(
                cls.fifo_lock_name,
                func,
                timeout=cls.fifo_lock_timeout,
                policy=cls.fifo_lock_policy,
                countdown=cls.fifo_lock_countdown,
                spell=lambda option: f"fifo_lock_{option}",
                **{option: getattr(cls, f"fifo_lock_{option}") for option in LOCK_OPTIONS},
            )
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        locked = locked_function(func, spec)
        cls.run = staticmethod(locked) if static else locked  # type: ignore[method-assign]
        cls._fifo_lock_body = body
        cls.fifo_lock_spec = spec
