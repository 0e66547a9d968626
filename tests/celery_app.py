"""The Celery app and tasks that ``tests/test_celery.py`` runs in a real worker.

A worker loads it with ``celery -A tests.celery_app worker``; the test process
imports it to send tasks. Both call ``configure(base_url)``: the worker from
``$FIFOLOCK_CELERY_REDIS`` at import, the test from its fixture. On that Redis
server the broker uses database 1 (and so do the locks: no
``fifo_lock_redis_url`` is set, so the broker URL is the default), results
database 2, and the tasks' record database 3.

The record is kept by plain synchronous redis-py, independent of the lock: a
locked body appends an ``enter`` entry right after it got the lock and an
``exit`` entry right before it gives it back, each with the lease's fence and
ticket, the pid and thread, and ``time.monotonic_ns()`` (one clock for every
process of this machine). It also pushes the fence to ``<log>:entered`` and
``<log>:done`` so a test can BLPOP for progress instead of sleeping.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from celery import Celery, Task, current_task
from celery.signals import worker_init
from redis import Redis

from fifolock_celery import current_lease, fifo_locked, lock_for

URL_ENV = "FIFOLOCK_CELERY_REDIS"
BROKER_DB, RESULT_DB, RECORD_DB = 1, 2, 3
LEASE_MS, POLL_MS = 600, 100
HOLD_MS = 300
GATE_TIMEOUT_S = 30

app = Celery("tests.celery_app")


def db_url(url: str, db: int) -> str:
    """``url`` pointing at database ``db`` of the same server."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{db}"))


def configure(base_url: str) -> None:
    """Point ``app`` at the Redis server of ``base_url`` (any database)."""
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


if os.environ.get(URL_ENV):
    configure(os.environ[URL_ENV])

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
    entry = {
        "event": event,
        "lock": lease.name,
        "fence": lease.fence,
        "ticket": lease.ticket,
        "pid": os.getpid(),
        "thread": threading.get_ident(),
        "task_id": current_task.request.id,
        "retries": current_task.request.retries,
        "ns": time.monotonic_ns(),
        **extra,
    }
    client = record_client()
    client.rpush(log, json.dumps(entry))
    client.rpush(f"{log}:{'entered' if event == 'enter' else 'done'}", lease.fence)


@worker_init.connect
def use_a_lock_before_forking(**_: Any) -> None:
    """Take a lock in the worker's main process, before the pool forks.

    Prefork children then inherit a started portal and built ``LoopClients``,
    which they must not use: this proves they rebuild their own.
    """
    global WARMED_UP_IN
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


@app.task(bind=True)
@fifo_locked("invoice-{invoice_id}")
def hold_invoice(self: Task[Any, Any], log: str, invoice_id: str, hold_ms: int = HOLD_MS) -> str:
    """Hold ``invoice-<invoice_id>`` for ``hold_ms`` ms; return the lock name."""
    note(log, "enter")
    time.sleep(hold_ms / 1000)  # the "work" done under the lock
    note(log, "exit")
    return current_lease().name


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


@app.task
@fifo_locked("gate-{key}")
def hold_until_gate(log: str, key: str, gate: str) -> int:
    """Hold ``gate-<key>`` until an item is pushed to the list ``gate``."""
    note(log, "enter")
    opened = record_client().blpop([gate], timeout=GATE_TIMEOUT_S)
    note(log, "exit", opened=opened is not None)
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
