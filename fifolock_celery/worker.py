"""What ``fifolock_celery`` does in a worker besides locking: its start checks.

The receiver is connected when ``fifolock_celery`` is imported, which every
module defining a locked task does, and a worker imports its task modules
before it starts. Nothing needs installing.

- ``celeryd_after_setup`` (the worker's main process, once its logging is set
  up): ``start_warnings(app)`` is logged, one WARNING per problem, on the
  ``fifolock_celery`` logger.

A prefork child never uses its parent's connections: the core's
``LoopClients`` key their clients by process id.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

from celery import Celery, Task
from celery.signals import celeryd_after_setup

from redis_fifo_lock import LockUsageError

from .decorator import LockSpec

log = logging.getLogger("fifolock_celery")

REDIS_BROKER_SCHEMES = frozenset({"redis", "rediss", "sentinel", "redis+socket", "socket"})
"""``broker_url`` schemes served by kombu's Redis transport (visibility timeout applies)."""

REDIS_VISIBILITY_TIMEOUT_S = 3600.0
"""kombu's default ``visibility_timeout`` of the Redis transport, in seconds."""


def spec_of(task: Task[Any, Any]) -> LockSpec | None:
    """The ``LockSpec`` of a locked task, or None if ``task`` is not locked.

    Finds ``@fifo_locked`` under Celery's own wrappers (``autoretry_for``) and
    under other decorators that use ``functools.wraps``, and ``FifoLockedTask``.
    """
    func: Any = getattr(task, "run", None)
    seen = 0
    while func is not None and seen < 100:  # a __wrapped__ cycle must not hang us
        spec = getattr(func, "fifo_lock_spec", None)
        if isinstance(spec, LockSpec):
            return spec
        func, seen = getattr(func, "__wrapped__", None), seen + 1
    return None


def _seconds(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return float(value)


def _visibility_timeout(app: Celery) -> float | None:
    """The broker's visibility timeout in seconds, or None if it is not Redis."""
    broker: Any = app.conf.broker_url
    first = broker.split(";", 1)[0] if isinstance(broker, str) else ""
    if urlsplit(first).scheme not in REDIS_BROKER_SCHEMES:
        return None
    options: Any = app.conf.broker_transport_options or {}
    value = options.get("visibility_timeout", REDIS_VISIBILITY_TIMEOUT_S)
    return _seconds(value)


def start_warnings(app: Celery) -> list[str]:
    """Problems of ``app``'s locked tasks that show only at run time, as messages.

    For each locked task (by task name):

    - its lock settings are invalid (``replicas`` above 0 on a Redis Cluster
      among them), or there is no Redis URL for the locks (every execution
      would fail);
    - ``max_hold_ms`` is shorter than its hard ``time_limit``: a body running
      past ``max_hold_ms`` loses its lease while it still runs;
    - it is ``acks_late`` on a Redis broker whose ``visibility_timeout`` is
      shorter than its ``time_limit``: a task still waiting or running then is
      delivered again, and the copy queues for the lock;
    - its ``retry`` policy's ``countdown`` exceeds the Redis
      ``visibility_timeout``: the republished message is delivered twice;

    and once for the app, under Django: its locks are not the cache's locks of
    the same names (``fifo_lock_redis_url`` or ``fifo_lock_namespace`` says
    another server, database or namespace; see ``fifolock_celery.under_django``).

    A task without a ``time_limit`` (its own or ``task_time_limit``) is not
    compared; per-call limits (``apply_async(time_limit=...)``) cannot be seen.

    Args:
        app: the Celery app (it is finalized, which imports nothing new).

    Returns:
        One message (str) per problem, each naming the task and the setting to
        change; empty when all is well.
    """
    messages = []
    apart: dict[str, None] = {}  # the Django mismatch, once (the settings are the app's)
    visibility_s = _visibility_timeout(app)
    for name, task in sorted(app.tasks.items()):
        spec = spec_of(task)
        if spec is None:
            continue
        try:
            config = spec.config(app, spec.name.template)
        except (LockUsageError, ValueError) as exc:
            messages.append(f"task {name}: every execution will fail: {exc}")
            continue
        different = config.django_mismatch()
        if different is not None:
            apart[f"the app's FIFO locks are not the Django cache's: {different}"] = None
        if spec.policy == "retry" and visibility_s is not None and spec.countdown > visibility_s:
            messages.append(
                f"task {name}: its retry countdown of {spec.countdown:g} s exceeds the Redis "
                f"broker's visibility_timeout of {visibility_s:g} s: a republished task "
                "waiting for its countdown is delivered again meanwhile, and runs twice. "
                "Lower the countdown or raise broker_transport_options['visibility_timeout']"
            )
        limit_s = _seconds(task.time_limit) or _seconds(app.conf.task_time_limit)
        if limit_s is None:
            continue
        max_hold_ms = config.settings.max_hold_ms
        if max_hold_ms < limit_s * 1000:
            messages.append(
                f"task {name}: its time_limit is {limit_s:g} s but its FIFO lock may be held "
                f"for at most max_hold_ms={max_hold_ms} ms; a body still running after that "
                "loses its lease and the next task enters while it runs. Raise max_hold_ms "
                "above the time limit (fifo_lock_max_hold_ms, or the task's own option)"
            )
        acks_late = task.acks_late if task.acks_late is not None else app.conf.task_acks_late
        if acks_late and visibility_s is not None and visibility_s < limit_s:
            messages.append(
                f"task {name}: it is acks_late and the Redis broker's visibility_timeout is "
                f"{visibility_s:g} s, shorter than its time_limit of {limit_s:g} s: a task "
                f"still waiting for or holding its lock after {visibility_s:g} s is delivered "
                "again, and the copy runs once the first is done. Raise "
                "broker_transport_options['visibility_timeout'] above the time limit"
            )
    return [*apart, *messages]


@celeryd_after_setup.connect(weak=False, dispatch_uid="fifolock_celery.warn_at_start")
def warn_at_worker_start(sender: object, instance: Any, **_: Any) -> None:
    """Log ``start_warnings`` of the worker's app (receiver of ``celeryd_after_setup``)."""
    app: Celery = instance.app
    for message in start_warnings(app):
        log.warning("%s", message, extra={"worker": sender})
