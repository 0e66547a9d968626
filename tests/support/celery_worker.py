"""Real Celery workers for the tests, and the record their tasks keep.

``running_worker`` starts ``celery -A tests.celery_tests.celery_app worker`` (or another
app module) as a subprocess in a session of its own, counts it as started only once a ping task has
round-tripped through that very worker, and stops it with a bounded warm
shutdown that fails loudly (naming the knob to raise, with every process's
thread stacks in the log it shows) and leaves no process behind. ``Log``
reads what the tasks wrote to the record (see
``tests/celery_tests/celery_app.py``) as ``TaskHold`` records, which
``tests.support.record.violations`` checks.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from celery import Task
from celery.exceptions import TimeoutError as ResultTimeout
from redis import Redis

from redis_fifo_lock.holds import Hold
from tests.celery_tests import celery_app as tasks
from tests.support.celery_main import DUMP_SIGNAL
from tests.support.processes import alive, group_members

ROOT = Path(__file__).resolve().parent.parent.parent
WORKER_START_TIMEOUT_S = 30.0
"""Seconds a worker may take to answer its first ping task."""
WORKER_STOP_TIMEOUT_S = 40.0
"""Seconds a worker may take to stop after SIGTERM (warm shutdown). A prefork
child whose last result its parent has not counted when the shutdown begins
waits up to 30 s for it (billiard's ``Worker._ensure_messages_consumed``) while
the parent waits for it to exit: the stacks of the demo's worker, killed at
10 s, showed both."""
RESULT_TIMEOUT_S = 20.0
"""Seconds to wait for one task result or record entry."""
CONCURRENCY = 4
STACK_DUMP_S = 0.3
"""Seconds each process of a stuck worker gets to write its stacks before the next."""
STUCK_LOG_LINES = 400
"""Lines of a stuck worker's log (with its stack dumps) in the failure message."""


@dataclass
class Worker:
    """A running ``celery worker`` subprocess."""

    pool: str
    hostname: str
    process: subprocess.Popen[bytes]
    logfile: Path
    main_pid: int
    warmed_up_in: int | None = None

    def log_text(self) -> str:
        """Everything the worker printed so far (str)."""
        return self.logfile.read_text(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines the worker printed (str)."""
        return "\n".join(self.log_text().splitlines()[-lines:])


def _stop(worker: Worker) -> None:
    """Warm shutdown with a bound; fails loudly, and leaves no process behind."""
    process = worker.process
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + WORKER_STOP_TIMEOUT_S
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=WORKER_STOP_TIMEOUT_S)
    # Its pool's children may outlive it by a moment; nothing signals their end.
    while alive(process.pid, group=True) and time.monotonic() < deadline:
        time.sleep(0.05)
    if process.returncode == 0 and not alive(process.pid, group=True):
        return
    if alive(process.pid, group=True):
        # Every process of the worker writes its threads' stacks to the log
        # first, one after another so that the dumps do not interleave.
        for pid in group_members(process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, DUMP_SIGNAL)
            time.sleep(STACK_DUMP_S)  # no event tells when a dump is written
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=5)
    pytest.fail(
        f"{worker.pool} worker did not stop cleanly within {WORKER_STOP_TIMEOUT_S} s of "
        f"SIGTERM (exit code {process.returncode}; raise WORKER_STOP_TIMEOUT_S if it needs "
        f"longer):\n{worker.log_tail(STUCK_LOG_LINES)}"
    )


@contextlib.contextmanager
def running_worker(
    base_url: str,
    pool: str,
    logdir: Path,
    *,
    concurrency: int = CONCURRENCY,
    profile: str = "",
    queue: str | None = None,
    app: str = "tests.celery_tests.celery_app",
    ping: Task[Any, Any] | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[Worker]:
    """A started worker of ``tests.celery_tests.celery_app``, stopped when the block ends.

    Args:
        base_url: the Redis server (str URL) of the tests (see ``tasks.configure``).
        pool: the ``--pool`` (str): prefork, threads, solo, gevent or eventlet.
        logdir: where the worker's output goes (``worker-<pool>.log``).
        concurrency: ``--concurrency`` (int); default 4.
        profile: ``$FIFOLOCK_CELERY_PROFILE`` (str) of the worker; default "".
        queue: the queue (str) to send the readiness ping to; default: the
            app's default queue.
        app: the ``-A`` module (str) of the worker; default ``tests.celery_tests.celery_app``.
        ping: the readiness probe task of that app, answering like
            ``tests.celery_tests.celery_app.ping``; default that task.
        env: extra environment variables (str to str) of the worker.
    """
    hostname = f"fifolock-{pool}-{uuid.uuid4().hex[:8]}@localhost"
    logfile = logdir / f"worker-{pool}{'-' + profile if profile else ''}.log"
    env = {**os.environ, tasks.URL_ENV: base_url, tasks.PROFILE_ENV: profile, **(env or {})}
    with logfile.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.celery_main",
                "-A",
                app,
                "worker",
                f"--pool={pool}",
                f"--concurrency={concurrency}",
                f"--hostname={hostname}",
                "--loglevel=INFO",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    worker = Worker(pool, hostname, process, logfile, process.pid)
    try:
        worker.warmed_up_in = _ping(worker, queue, ping or tasks.ping)
        yield worker
    finally:
        _stop(worker)


def _ping(worker: Worker, queue: str | None, ping: Task[Any, Any]) -> int | None:
    """Wait until a ping task round-trips through ``worker``; return its ``warmed_up_in``."""
    probe = ping.apply_async(queue=queue)
    deadline = time.monotonic() + WORKER_START_TIMEOUT_S
    while True:
        if worker.process.poll() is not None:
            pytest.fail(
                f"{worker.pool} worker exited with {worker.process.returncode}:\n"
                f"{worker.log_tail()}"
            )
        if time.monotonic() > deadline:
            pytest.fail(
                f"{worker.pool} worker did not answer a ping task within "
                f"{WORKER_START_TIMEOUT_S} s (raise WORKER_START_TIMEOUT_S):\n{worker.log_tail()}"
            )
        try:
            reply: dict[str, Any] = probe.get(timeout=0.5)
        except ResultTimeout:
            continue
        assert reply["hostname"] == worker.hostname, f"another worker answered: {reply}"
        warmed: int | None = reply["warmed_up_in"]
        return warmed


@dataclass(kw_only=True)
class TaskHold(Hold):
    """One execution's hold, from its enter and exit entries: the record's
    ``Hold``, and which task execution held it."""

    lock: str
    thread: int
    task_id: str
    retries: int
    redelivered: bool

    FROM_ENTRY = ("lock", "fence", "ticket", "pid", "thread", "task_id", "retries", "redelivered")


class Log:
    """The record of one test, in the record database (see tests/celery_tests/celery_app.py)."""

    def __init__(self, client: Redis, key: str) -> None:
        self.client = client
        self.key = key
        self.gate = f"{key}:gate"
        """A list that ``hold_until_gate`` and friends wait on; ``open_gate`` fills it."""

    def wait(self, what: str, count: int) -> list[int]:
        """BLPOP ``count`` fences from ``<key>:<what>`` ("entered" or "done")."""
        fences = []
        for _ in range(count):
            item = self.client.blpop([f"{self.key}:{what}"], timeout=RESULT_TIMEOUT_S)
            assert item is not None, f"no {what!r} entry within {RESULT_TIMEOUT_S} s"
            fences.append(int(item[1]))
        return fences

    def entries(self) -> list[dict[str, Any]]:
        """Every enter and exit entry so far, in order of writing."""
        return [json.loads(raw) for raw in self.client.lrange(self.key, 0, -1)]

    def holds(self) -> list[TaskHold]:
        """Every completed hold, in order of entry."""
        entered: dict[tuple[str, int], dict[str, Any]] = {}
        holds = []
        for entry in self.entries():
            key = (entry["lock"], entry["fence"])
            if entry["event"] == "enter":
                entered[key] = entry
                continue
            start = entered.pop(key)
            holds.append(
                TaskHold(
                    **{name: entry[name] for name in TaskHold.FROM_ENTRY},
                    entered_ns=start["ns"],
                    exited_ns=entry["ns"],
                )
            )
        return sorted(holds, key=lambda hold: hold.entered_ns)

    def open_gate(self) -> None:
        """Let every task waiting on ``gate`` go on (the gate stays open)."""
        self.client.rpush(self.gate, "open")

    def log_records(self, lock: str, count: int = 0) -> list[dict[str, Any]]:
        """Every ``fifolock_celery`` log record about ``lock`` (str; "worker" for
        records about no lock), once ``count`` (int) more have arrived."""
        for _ in range(count):
            item = self.client.blpop([f"logs:{lock}:new"], timeout=RESULT_TIMEOUT_S)
            assert item is not None, f"no new log record for {lock!r} within {RESULT_TIMEOUT_S} s"
        return [json.loads(raw) for raw in self.client.lrange(f"logs:{lock}", 0, -1)]

    def cleanup(self, *locks: str) -> None:
        """Delete this test's keys, and the log records about ``locks``."""
        self.client.delete(
            self.key,
            f"{self.key}:entered",
            f"{self.key}:done",
            self.gate,
            *(f"logs:{lock}{suffix}" for lock in locks for suffix in ("", ":new")),
        )


def unique(prefix: str) -> str:
    """``prefix`` with a random suffix: a lock key no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
