"""The Celery app and tasks that the Celery tests (``tests/celery_tests``) run in real workers.

A worker loads it with ``celery -A tests.celery_tests.celery_app worker``; the test process
imports it to send tasks. Both call ``configure(base_url)``: the worker from
``$FIFOLOCK_CELERY_REDIS`` at import, the test from its fixture. On that Redis
server the broker uses database 1 (and so do the locks: no
``fifo_lock_redis_url`` is set, so the broker URL is the default), results
database 2, and the tasks' record database 3.

``$FIFOLOCK_CELERY_PROFILE=redelivery`` gives a worker a one-second Redis
``visibility_timeout`` swept every second, and makes it consume only the
``redelivery`` queue, so that an ``acks_late`` task still running after a
second is delivered again.

The record is kept by plain synchronous redis-py, independent of the lock: a
locked body appends an ``enter`` entry right after it got the lock and an
``exit`` entry right before it gives it back, each with the lease's fence and
ticket, the pid and thread, and ``time.monotonic_ns()`` (one clock for every
process of this machine). It also pushes the fence to ``<log>:entered`` and
``<log>:done`` so a test can BLPOP for progress instead of sleeping.

Log records of the ``fifolock_celery`` logger are copied to the record too, as
JSON on the list ``logs:<lock name>`` (``logs:worker`` for records about no
lock), by a handler the worker installs on ``worker_init``; each record also
pushes an item to ``logs:<lock name>:new``, for a test to BLPOP.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from enum import Enum
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from celery import Celery, Task, current_task
from celery.signals import worker_init
from redis import Redis

from fifolock_celery import FifoLockedTask, current_lease, fifo_locked, lock_for
from redis_fifo_lock import LeaseLost, LockTimeout, LockUsageError, RedisUnavailable
from redis_fifo_lock.protocol import LockKeys

URL_ENV = "FIFOLOCK_CELERY_REDIS"
PROFILE_ENV = "FIFOLOCK_CELERY_PROFILE"
BROKER_DB, RESULT_DB, RECORD_DB = 1, 2, 3
LEASE_MS, POLL_MS = 600, 100
HOLD_MS = 300
GATE_TIMEOUT_S = 30
COUNTDOWN_S = 0.2
"""Countdown (seconds) of the retry-policy tasks."""
TIME_LIMIT_S = 3
"""Hard time limit (seconds) of ``hold_until_killed``."""
WAITER_TIME_LIMIT_S = 1
"""Hard time limit (seconds) of ``wait_until_killed``."""
REDELIVERY_QUEUE = "redelivery"
VISIBILITY_TIMEOUT_S = 1
"""The redelivery profile's Redis visibility timeout, in seconds."""
LONG_LIMIT_S, SHORT_HOLD_MS = 30, 5000
"""``limited_beyond_max_hold``: its time limit (s) is longer than its max_hold_ms."""

app = Celery("tests.celery_tests.celery_app")

F = TypeVar("F", bound=Callable[..., Any])


def db_url(url: str, db: int) -> str:
    """``url`` pointing at database ``db`` of the same server."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{db}"))


def configure(base_url: str, profile: str = "") -> None:
    """Point ``app`` at the Redis server of ``base_url`` (any database).

    Args:
        base_url: a Redis URL (str) of the test server.
        profile: "" (default) or "redelivery" (see the module docstring).
    """
    app.conf.update(
        broker_url=db_url(base_url, BROKER_DB),
        result_backend=db_url(base_url, RESULT_DB),
        fifo_lock_lease_ms=LEASE_MS,
        fifo_lock_poll_ms=POLL_MS,
        record_url=db_url(base_url, RECORD_DB),
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        task_track_started=True,
    )
    if profile == "redelivery":
        app.conf.update(
            broker_transport_options={
                "visibility_timeout": VISIBILITY_TIMEOUT_S,
                "unacked_restore_interval": 1,
                "unacked_restore_throttle": 1,
            },
            task_default_queue=REDELIVERY_QUEUE,
        )


if os.environ.get(URL_ENV):
    configure(os.environ[URL_ENV], os.environ.get(PROFILE_ENV, ""))

_record: Redis | None = None
WARMED_UP_IN: int | None = None


def record_client() -> Redis:
    """The record's client (redis-py pools reconnect by themselves after fork)."""
    global _record
    if _record is None:
        _record = Redis.from_url(app.conf.record_url)
    return _record


def note(log: str, event: str, **extra: Any) -> None:
    """Append an ``event`` ("enter" or "exit") of the current lease to ``log``."""
    lease = current_lease()
    request = current_task.request
    entry = {
        "event": event,
        "lock": lease.name,
        "fence": lease.fence,
        "ticket": lease.ticket,
        "pid": os.getpid(),
        "thread": threading.get_ident(),
        "task_id": request.id,
        "retries": request.retries,
        "redelivered": bool((request.delivery_info or {}).get("redelivered")),
        "ns": time.monotonic_ns(),
        **extra,
    }
    client = record_client()
    client.rpush(log, json.dumps(entry))
    client.rpush(f"{log}:{'entered' if event == 'enter' else 'done'}", lease.fence)


class RecordLogHandler(logging.Handler):
    """Copies ``fifolock_celery`` log records to the record (see the module docstring)."""

    def emit(self, record: logging.LogRecord) -> None:
        lock = getattr(record, "fifo_lock", None)
        entry = {
            "level": record.levelname,
            "message": record.getMessage(),
            "lock": lock,
            "policy": getattr(record, "fifo_lock_policy", None),
            "task_id": getattr(record, "task_id", None),
            "pid": os.getpid(),
        }
        key = f"logs:{lock or 'worker'}"
        try:
            record_client().pipeline().rpush(key, json.dumps(entry)).rpush(
                f"{key}:new", 1
            ).execute()
        except Exception:
            self.handleError(record)


@worker_init.connect
def prepare_the_worker(**_: Any) -> None:
    """Copy log records to the record, and take a lock before the pool forks.

    Prefork children then inherit a started portal and built ``LoopClients``,
    which they must not use: this proves they rebuild their own.
    """
    global WARMED_UP_IN
    logger = logging.getLogger("fifolock_celery")
    logger.addHandler(RecordLogHandler())
    logger.setLevel(logging.INFO)
    with lock_for(app, f"warm-up-{os.getpid()}").hold(timeout=10):
        WARMED_UP_IN = os.getpid()


@app.task
def ping() -> dict[str, Any]:
    """Readiness probe: which worker answered, and whether it warmed up first."""
    return {
        "hostname": current_task.request.hostname,
        "pid": os.getpid(),
        "warmed_up_in": WARMED_UP_IN,
    }


# -- one lock, many ways to call and declare it ---------------------------------


@app.task(bind=True)
@fifo_locked("invoice-{invoice_id}")
def hold_invoice(self: Task[Any, Any], log: str, invoice_id: str, hold_ms: int = HOLD_MS) -> str:
    """Hold ``invoice-<invoice_id>`` for ``hold_ms`` ms; return the lock name."""
    note(log, "enter")
    time.sleep(hold_ms / 1000)  # the "work" done under the lock
    note(log, "exit")
    return current_lease().name


@app.task
@fifo_locked("region-{region}-{invoice_id}")
def hold_region(log: str, invoice_id: str, region: str = "eu", *, hold_ms: int = 0) -> str:
    """Unbound, with a defaulted parameter in the name; return the lock name."""
    note(log, "enter")
    time.sleep(hold_ms / 1000)
    note(log, "exit")
    return current_lease().name


class Kind(str, Enum):
    """A str-mixin enum: a JSON message carries ``"a"``; ``format()`` shows ``Kind.A``."""

    A = "a"


@app.task
@fifo_locked("batch-{key}-{ids}")
def hold_batch(log: str, key: str, ids: object, hold_ms: int = HOLD_MS) -> str:
    """Hold a lock named after ``ids`` (a tuple, a str-enum...) for ``hold_ms``
    ms; return the lock name."""
    note(log, "enter")
    time.sleep(hold_ms / 1000)
    note(log, "exit")
    return current_lease().name


class Flaky(Exception):
    """Raised by ``autoretried`` on its first run."""


@app.task(bind=True, autoretry_for=(Flaky,), max_retries=1, default_retry_delay=0)
@fifo_locked("auto-{key}")
def autoretried(self: Task[Any, Any], log: str, key: str) -> str:
    """Fails with ``Flaky`` at first (``autoretry_for`` retries it), then succeeds."""
    note(log, "enter")
    note(log, "exit")
    if self.request.retries == 0:
        raise Flaky("first run")
    return current_lease().name


def traced(func: F) -> F:
    """Another decorator, passing arguments through as ``(*args, **kwargs)``."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


@app.task
@fifo_locked("deco-{key}")
@traced
def locked_over_another_decorator(log: str, key: str, suffix: str = "") -> str:
    """``@fifo_locked`` on top of another decorator; return the lock name."""
    note(log, "enter")
    note(log, "exit")
    return current_lease().name


@app.task
@traced
@fifo_locked("deco-{key}")
def locked_under_another_decorator(log: str, key: str, suffix: str = "") -> str:
    """Another decorator between ``@app.task`` and ``@fifo_locked``; return the lock name."""
    note(log, "enter")
    note(log, "exit")
    return current_lease().name


@app.task(base=FifoLockedTask, bind=True, fifo_lock_name="invoice-{invoice_id}")
def hold_invoice_by_base(self: Task[Any, Any], log: str, invoice_id: str) -> str:
    """``hold_invoice``'s lock through ``base=FifoLockedTask``; return the lock name."""
    note(log, "enter")
    time.sleep(HOLD_MS / 1000)
    note(log, "exit")
    return current_lease().name


class SkippingTask(FifoLockedTask):
    """A base class with lock options as class attributes."""

    fifo_lock_name = "gate-{key}"
    fifo_lock_policy = "skip"


@app.task(base=SkippingTask)
def skip_gate_by_base(log: str, key: str) -> int:
    """Like ``skip_gate``, declared through a ``FifoLockedTask`` subclass."""
    note(log, "enter")
    note(log, "exit")
    return current_lease().fence


@app.task(bind=True, max_retries=1)
@fifo_locked("retry-{key}")
def retry_once(self: Task[Any, Any], log: str, key: str) -> int:
    """Call ``self.retry()`` inside the body once, then succeed; return the fence."""
    note(log, "enter")
    note(log, "exit")
    if self.request.retries == 0:
        raise self.retry(countdown=0)
    return current_lease().fence


@app.task
@fifo_locked("fail-{key}")
def fail_inside(log: str, key: str) -> None:
    """An unbound task whose body raises ``ValueError``."""
    note(log, "enter")
    note(log, "exit")
    raise ValueError(f"failing on purpose with fence {current_lease().fence}")


@app.task
@fifo_locked("lease-{key}", lease_ms=3000, poll_ms=500)
def lease_left(key: str) -> int | None:
    """Milliseconds left on this task's lease, as Redis sees it (override: 3000)."""
    return lock_for(app, current_lease().name).status().lease_left_ms


@app.task(bind=True)
@fifo_locked("holder-{key}")
def report_holder(self: Task[Any, Any], key: str) -> tuple[str | None, str]:
    """The holder description Redis records while this task holds its lock, and
    the task's id."""
    return lock_for(app, current_lease().name).status().holder, str(self.request.id)


@app.task
@fifo_locked("nest-{key}")
def nest_own_lock(key: str) -> None:
    """Take the task's own lock again, without a timeout, through the core's
    ``SyncFifoLock``: refused at once (it would wait for itself)."""
    lock_for(app, current_lease().name).acquire()


@app.task
@fifo_locked("replicated-{key}", replicas=1)
def replicated(log: str, key: str) -> int:
    """Locked with ``replicas=1``: the test server has no replica to acknowledge
    the grant, so the body must never run; return the fence."""
    note(log, "enter")
    note(log, "exit")
    return current_lease().fence


# -- gates: hold a lock until the test says so ------------------------------------


def wait_for_gate(gate: str) -> bool:
    """Block until ``gate`` is opened (a list holding an item), leave it open."""
    client = record_client()
    opened = client.blpop([gate], timeout=GATE_TIMEOUT_S)
    if opened is not None:
        client.rpush(gate, opened[1])  # open for whoever comes next
    return opened is not None


@app.task
@fifo_locked("gate-{key}")
def hold_until_gate(log: str, key: str, gate: str) -> int:
    """Hold ``gate-<key>`` until the list ``gate`` gets an item; return the fence."""
    note(log, "enter")
    opened = wait_for_gate(gate)
    note(log, "exit", opened=opened)
    return current_lease().fence


@app.task
@fifo_locked("gate-{key}")
def pass_gate(log: str, key: str) -> int:
    """Take ``gate-<key>`` briefly; return the fence."""
    note(log, "enter")
    note(log, "exit")
    return current_lease().fence


@app.task
@fifo_locked("gate-{key}", timeout=0.3)
def try_gate(log: str, key: str) -> int:
    """Like ``pass_gate``, but gives up waiting after 0.3 s."""
    note(log, "enter")
    note(log, "exit")
    return current_lease().fence


@app.task(bind=True, max_retries=0)
@fifo_locked("gate-{key}", policy="retry", countdown=COUNTDOWN_S)
def retry_gate(self: Task[Any, Any], log: str, key: str) -> dict[str, Any]:
    """Retry policy with ``max_retries=0``: contention must not spend retries."""
    note(log, "enter")
    note(log, "exit")
    headers = self.request.headers or {}
    return {"fence": current_lease().fence, "retries": self.request.retries, "headers": headers}


@app.task
@fifo_locked("gate-{key}", policy="skip")
def skip_gate(log: str, key: str) -> int:
    """Skip policy: returns ``SKIPPED`` when ``gate-<key>`` is busy."""
    note(log, "enter")
    note(log, "exit")
    return current_lease().fence


# -- crashes, redelivery, errors ---------------------------------------------------


@app.task(time_limit=TIME_LIMIT_S)
@fifo_locked("gate-{key}")
def hold_until_killed(log: str, key: str, gate: str) -> int:
    """Like ``hold_until_gate``, with a hard time limit of ``TIME_LIMIT_S`` seconds."""
    note(log, "enter")
    opened = wait_for_gate(gate)
    note(log, "exit", opened=opened)
    return current_lease().fence


@app.task(time_limit=WAITER_TIME_LIMIT_S)
@fifo_locked("gate-{key}")
def wait_until_killed(log: str, key: str, gate: str) -> int:
    """Like ``hold_until_killed``, with a hard time limit of ``WAITER_TIME_LIMIT_S`` seconds."""
    note(log, "enter")
    opened = wait_for_gate(gate)
    note(log, "exit", opened=opened)
    return current_lease().fence


@app.task(bind=True, acks_late=True, time_limit=LONG_LIMIT_S)
@fifo_locked("gate-{key}")
def hold_acks_late(self: Task[Any, Any], log: str, key: str, gate: str) -> int:
    """``acks_late``: the first delivery holds until ``gate`` opens, redeliveries pass."""
    note(log, "enter")
    redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
    opened = redelivered or wait_for_gate(gate)
    note(log, "exit", opened=opened)
    return current_lease().fence


@app.task(time_limit=LONG_LIMIT_S)
@fifo_locked("long-{key}", max_hold_ms=SHORT_HOLD_MS)
def limited_beyond_max_hold(key: str) -> None:
    """Misconfigured on purpose: the worker warns at start (time_limit > max_hold_ms)."""


@app.task
@fifo_locked("lose-{key}")
def lose_the_lease(key: str) -> None:
    """Deletes its own lease key, so the release raises ``LeaseLost``."""
    client = Redis.from_url(app.conf.broker_url)  # the locks live in the broker database
    try:
        client.delete(LockKeys(current_lease().name).key("lease"))
    finally:
        client.close()


ERRORS: dict[str, Callable[[], Exception]] = {
    "LeaseLost": lambda: LeaseLost("raised", "on purpose", fence=7, token="t"),
    "LockTimeout": lambda: LockTimeout("raised", "on purpose", waited=1.5, holder_fence=3),
    "RedisUnavailable": lambda: RedisUnavailable("raised", "on purpose", cause=OSError("x")),
    "LockUsageError": lambda: LockUsageError("raised", "on purpose"),
}


@app.task
def raise_error(kind: str) -> None:
    """Raise one of our exceptions (``ERRORS``), built with its attributes."""
    raise ERRORS[kind]()


# -- green pools (gevent, eventlet): holds across leases, a blocked hub ------------

GREEN_LEASE_MS, GREEN_POLL_MS = 1000, 200
"""Lease and poll (ms) of the green-pool tasks: their holds span several leases."""


@app.task
@fifo_locked("green-{key}", lease_ms=GREEN_LEASE_MS, poll_ms=GREEN_POLL_MS)
def count_inside(log: str, key: str, hold_ms: int) -> int:
    """Hold ``green-<key>`` for ``hold_ms`` ms, yielding (``time.sleep``, patched
    in a green worker); count the holders inside on ``<log>:inside`` and push
    any count other than 1 to ``<log>:crowded``. Returns the fence."""
    client = record_client()
    inside = client.incr(f"{log}:inside")
    note(log, "enter")
    if inside != 1:
        client.rpush(f"{log}:crowded", inside)
    time.sleep(hold_ms / 1000)
    note(log, "exit")
    client.decr(f"{log}:inside")
    return current_lease().fence


@app.task
@fifo_locked("green-{key}", lease_ms=GREEN_LEASE_MS, poll_ms=GREEN_POLL_MS)
def spin_inside(log: str, key: str, spin_ms: int) -> bool:
    """Hold ``green-<key>`` while a CPU-bound loop runs ``spin_ms`` ms without
    yielding to the green hub; return whether the lease was lost meanwhile."""
    note(log, "enter")
    end = time.monotonic() + spin_ms / 1000
    while time.monotonic() < end:
        pass
    note(log, "exit")
    return current_lease().lost


@app.task
@fifo_locked("green-{key}")
def run_a_coroutine(key: str) -> str:
    """``asyncio.run()`` in a locked body, as ``async_to_sync`` code does; return ``key``."""

    async def echo() -> str:
        await asyncio.sleep(0)
        return key

    return asyncio.run(echo())
