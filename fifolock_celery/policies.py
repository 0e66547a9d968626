"""What a locked task does when its lock is busy: the contention policies.

``wait`` (the default)
    Queue for the lock in arrival order, up to ``timeout`` seconds (None:
    forever). When the timeout runs out the task fails with ``LockTimeout``.
``retry``
    Try for ``timeout`` seconds (default 0: once), then republish the same
    message (same task id, arguments and options) to run again after
    ``countdown`` seconds, and end this execution in Celery's RETRY state.
    ``request.retries`` is carried over unchanged, so contention never spends
    ``max_retries``; the ``fifo_lock_contention`` message header counts the
    contention retries instead. No place in the queue is kept between tries.
``skip``
    Try for ``timeout`` seconds (default 0: once), then log a WARNING and
    return ``SKIPPED`` without running the body (the task succeeds).

Every outcome leaves a record on the ``fifolock_celery`` logger: INFO when a
lease is granted (with the seconds waited), INFO for a contention retry,
WARNING for a skip and for a timeout. Each record carries the ``extra`` fields
``fifo_lock`` (lock name), ``fifo_lock_policy``, ``task_id`` and ``task_name``.
"""

from __future__ import annotations

import logging
from typing import Any, Final, Literal, NoReturn

from celery import Task
from celery.exceptions import Retry

from redis_fifo_lock import Lease, LockTimeout

Policy = Literal["wait", "retry", "skip"]
"""The contention policies (str)."""

POLICIES: Final[tuple[Policy, ...]] = ("wait", "retry", "skip")

SKIPPED: Final = "fifolock_celery.SKIPPED"
"""What a task with ``policy="skip"`` returns when it skipped its body (a str,
so it survives every result serializer): ``result.get() == SKIPPED``."""

CONTENTION_HEADER: Final = "fifo_lock_contention"
"""Message header (int) counting how often a ``retry``-policy task was
republished because its lock was busy; absent on the first delivery."""

DEFAULT_COUNTDOWN_S: Final = 5.0
"""Seconds before a republished ``retry``-policy task runs again, by default."""

log = logging.getLogger("fifolock_celery")


def check_policy(policy: object) -> Policy:
    """Return ``policy`` if it names a contention policy.

    Raises:
        ValueError: for anything but "wait", "retry" or "skip".
    """
    for known in POLICIES:
        if policy == known:
            return known
    raise ValueError(f"policy must be one of {', '.join(map(repr, POLICIES))}; got {policy!r}")


def check_countdown(countdown: object) -> float:
    """Return ``countdown`` (seconds) as a float.

    Raises:
        ValueError: for a bool, a non-number, NaN, infinity or a negative value.
    """
    if isinstance(countdown, bool) or not isinstance(countdown, (int, float)):
        raise ValueError(f"countdown must be a number of seconds, got {countdown!r}")
    if not 0 <= countdown < float("inf"):
        raise ValueError(f"countdown must be >= 0 seconds and finite, got {countdown!r}")
    return float(countdown)


def contention_retries(task: Task[Any, Any]) -> int:
    """How often the running message was republished for contention (int, 0 at first)."""
    request = task.request
    value = (request.headers or {}).get(CONTENTION_HEADER, getattr(request, CONTENTION_HEADER, 0))
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _extra(task: Task[Any, Any], name: str, policy: Policy) -> dict[str, Any]:
    return {
        "fifo_lock": name,
        "fifo_lock_policy": policy,
        "task_id": task.request.id,
        "task_name": task.name,
    }


def granted(task: Task[Any, Any], policy: Policy, lease: Lease, waited_s: float) -> None:
    """Log (INFO) that ``task`` holds ``lease`` after waiting ``waited_s`` seconds."""
    log.info(
        "task %s[%s] holds FIFO lock %r (fence %d) after waiting %.3f s",
        task.name,
        task.request.id,
        lease.name,
        lease.fence,
        waited_s,
        extra=_extra(task, lease.name, policy),
    )


def contended(task: Task[Any, Any], policy: Policy, countdown: float, busy: LockTimeout) -> str:
    """Apply ``policy`` to a task whose lock stayed busy (``busy`` says how long).

    Args:
        task: the running task.
        policy: the task's contention policy.
        countdown: seconds (float) before a republished task runs (``retry``).
        busy: the ``LockTimeout`` that ended the wait.

    Returns:
        ``SKIPPED``, for the ``skip`` policy.

    Raises:
        LockTimeout: ``busy`` itself, for the ``wait`` policy, and for ``retry``
            when the task runs eagerly (``apply()``, ``task_always_eager``,
            a direct call), where there is no broker to republish to.
        celery.exceptions.Retry: for ``retry``, after the message was
            republished; the worker records the RETRY state with ``busy``.
        Exception: whatever publishing raised, should republishing fail (the
            task then fails loudly rather than vanish).
    """
    name, extra = busy.name, _extra(task, busy.name, policy)
    if policy == "skip":
        log.warning(
            "task %s[%s] skipped: FIFO lock %r stayed busy for %.3f s (holder fence %s); "
            "the body did not run and the task returns SKIPPED",
            task.name,
            task.request.id,
            name,
            busy.waited,
            busy.holder_fence,
            extra=extra,
        )
        return SKIPPED
    request = task.request
    if policy == "retry" and not (request.is_eager or request.called_directly):
        _republish(task, countdown, busy, extra)
    log.warning(
        "task %s[%s] failed: FIFO lock %r was not acquired within %.3f s (holder fence %s)%s",
        task.name,
        request.id,
        name,
        busy.waited,
        busy.holder_fence,
        "; the retry policy cannot republish a task run eagerly" if policy == "retry" else "",
        extra=extra,
    )
    raise busy


def _republish(
    task: Task[Any, Any], countdown: float, busy: LockTimeout, extra: dict[str, Any]
) -> NoReturn:
    request = task.request
    count = contention_retries(task) + 1
    # As Celery's own retry, leave RabbitMQ's dead-lettering history behind.
    kept = {key: value for key, value in (request.headers or {}).items() if key != "x-death"}
    headers = {**kept, CONTENTION_HEADER: count}
    # signature_from_request copies the request's execution options (task id,
    # retries, links, chain, expiry, time limits, routing); only the countdown
    # and our header change. Not task.retry(): that would add 1 to retries.
    signature = task.signature_from_request(request, countdown=countdown, headers=headers)
    signature.apply_async()
    log.info(
        "task %s[%s]: FIFO lock %r is busy (holder fence %s); republished to run again in "
        "%g s (contention retry %d; request.retries stays %d)",
        task.name,
        request.id,
        busy.name,
        busy.holder_fence,
        countdown,
        count,
        request.retries,
        extra=extra,
    )
    # celery-types spells ``when`` as numbers.Real, which mypy cannot check.
    when: Any = countdown
    raise Retry(f"FIFO lock {busy.name!r} is busy", exc=busy, when=when, sig=signature)
