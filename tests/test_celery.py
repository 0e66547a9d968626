"""``fifolock_celery`` in real Celery workers, plus its settings and decorator rules.

The worker tests start ``celery -A tests.celery_app worker`` as a subprocess
(once with the prefork pool, whose children are real processes, and once with
the threads pool), against the session's Redis server. The tasks
(``tests/celery_app.py``) write enter/exit entries to a record kept apart from
the lock, and the tests check the record: no two holds of one lock overlap,
fences increase in entry order, different lock names do run at once.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import TimeoutError as ResultTimeout
from celery.exceptions import WorkerLostError
from celery.result import AsyncResult
from redis import Redis

from fifolock_celery import (
    REDIS_URL_SETTING,
    LockConfig,
    clients_for,
    current_lease,
    fifo_locked,
    lock_for,
)
from redis_fifo_lock import LockUsageError
from tests import celery_app as tasks

ROOT = Path(__file__).resolve().parent.parent
WORKER_START_TIMEOUT_S = 30.0
"""Seconds a worker may take to answer its first ping task."""
WORKER_STOP_TIMEOUT_S = 15.0
"""Seconds a worker may take to stop after SIGTERM (warm shutdown)."""
RESULT_TIMEOUT_S = 20.0
"""Seconds to wait for one task result or record entry."""
CONCURRENCY = 4


# -- fixtures ----------------------------------------------------------------


@pytest.fixture(scope="module")
def celery_redis_url(redis_url: str) -> str:
    """Base URL of the server the Celery tests use (databases 1-3, never flushed).

    Redefine this fixture to run them against another server.
    """
    return redis_url


@pytest.fixture(scope="module")
def app(celery_redis_url: str) -> Celery:
    """``tests.celery_app.app``, configured for ``celery_redis_url``, in this process."""
    tasks.configure(celery_redis_url)
    return tasks.app


@dataclass
class Worker:
    """A running ``celery worker`` subprocess."""

    pool: str
    hostname: str
    process: subprocess.Popen[bytes]
    logfile: Path
    main_pid: int
    warmed_up_in: int | None

    def log_tail(self, lines: int = 40) -> str:
        text = self.logfile.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


def _start_worker(app: Celery, base_url: str, pool: str, logdir: Path) -> Worker:
    hostname = f"fifolock-{pool}-{uuid.uuid4().hex[:8]}@localhost"
    logfile = logdir / f"worker-{pool}.log"
    with logfile.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tests.celery_app",
                "worker",
                f"--pool={pool}",
                f"--concurrency={CONCURRENCY}",
                f"--hostname={hostname}",
                "--loglevel=INFO",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ],
            cwd=ROOT,
            env={**os.environ, tasks.URL_ENV: base_url},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    worker = Worker(pool, hostname, process, logfile, process.pid, None)
    # Started means: a task sent now round-trips through this very worker.
    probe = tasks.ping.delay()
    deadline = time.monotonic() + WORKER_START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            pytest.fail(f"{pool} worker exited with {process.returncode}:\n{worker.log_tail()}")
        if time.monotonic() > deadline:
            _stop_worker(worker)
            pytest.fail(
                f"{pool} worker did not answer a ping task within {WORKER_START_TIMEOUT_S} s "
                f"(raise WORKER_START_TIMEOUT_S):\n{worker.log_tail()}"
            )
        try:
            reply = probe.get(timeout=0.5)
        except ResultTimeout:
            continue
        break
    assert reply["hostname"] == hostname, f"another worker answered: {reply}"
    worker.warmed_up_in = reply["warmed_up_in"]
    return worker


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop_worker(worker: Worker) -> None:
    """Warm shutdown with a bound; fails loudly, and leaves no process behind."""
    process = worker.process
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + WORKER_STOP_TIMEOUT_S
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=WORKER_STOP_TIMEOUT_S)
    # Its pool's children may outlive it by a moment; nothing signals their end.
    while _group_alive(process.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if process.returncode == 0 and not _group_alive(process.pid):
        return
    if _group_alive(process.pid):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=5)
    pytest.fail(
        f"{worker.pool} worker did not stop cleanly within {WORKER_STOP_TIMEOUT_S} s of "
        f"SIGTERM (exit code {process.returncode}; raise WORKER_STOP_TIMEOUT_S if it needs "
        f"longer):\n{worker.log_tail()}"
    )


@pytest.fixture(scope="module", params=["prefork", "threads"])
def worker(request: pytest.FixtureRequest, app: Celery, celery_redis_url: str) -> Iterator[Worker]:
    """A real worker (``--pool`` = the param, concurrency 4), started and proven ready."""
    with tempfile.TemporaryDirectory(prefix="fifolock-celery-") as logdir:
        worker = _start_worker(app, celery_redis_url, request.param, Path(logdir))
        try:
            yield worker
        finally:
            _stop_worker(worker)


@dataclass(frozen=True)
class Hold:
    """One execution's hold, from its enter and exit entries."""

    lock: str
    fence: int
    ticket: int
    pid: int
    thread: int
    task_id: str
    retries: int
    entered_ns: int
    exited_ns: int

    FROM_ENTRY = ("lock", "fence", "ticket", "pid", "thread", "task_id", "retries")

    def overlaps(self, other: Hold) -> bool:
        return self.entered_ns < other.exited_ns and other.entered_ns < self.exited_ns


class Log:
    """The record of one test, in the record database (see tests/celery_app.py)."""

    def __init__(self, client: Redis, key: str) -> None:
        self.client = client
        self.key = key

    def wait(self, what: str, count: int) -> list[int]:
        """BLPOP ``count`` fences from ``<key>:<what>`` ("entered" or "done")."""
        fences = []
        for _ in range(count):
            item = self.client.blpop([f"{self.key}:{what}"], timeout=RESULT_TIMEOUT_S)
            assert item is not None, f"no {what!r} entry within {RESULT_TIMEOUT_S} s"
            fences.append(int(item[1]))
        return fences

    def holds(self) -> list[Hold]:
        """Every completed hold, in order of entry."""
        entered: dict[tuple[str, int], dict[str, Any]] = {}
        holds = []
        for raw in self.client.lrange(self.key, 0, -1):
            entry = json.loads(raw)
            key = (entry["lock"], entry["fence"])
            if entry["event"] == "enter":
                entered[key] = entry
                continue
            start = entered.pop(key)
            holds.append(
                Hold(
                    **{name: entry[name] for name in Hold.FROM_ENTRY},
                    entered_ns=start["ns"],
                    exited_ns=entry["ns"],
                )
            )
        return sorted(holds, key=lambda hold: hold.entered_ns)


@pytest.fixture
def log(app: Celery) -> Iterator[Log]:
    """A fresh record key for this test (nothing is flushed: the broker shares the server)."""
    client = Redis.from_url(app.conf.record_url)
    key = f"log-{uuid.uuid4().hex}"
    try:
        yield Log(client, key)
    finally:
        client.delete(key, f"{key}:entered", f"{key}:done", f"{key}:gate")
        client.close()


def assert_serial(holds: list[Hold]) -> None:
    """No two holds overlap; fences and tickets increase in order of entry."""
    for before, after in itertools.pairwise(holds):
        assert before.exited_ns <= after.entered_ns, f"overlap: {before} and {after}"
        assert before.fence < after.fence, f"fence went down: {before} then {after}"
        assert before.ticket < after.ticket, f"ticket went down: {before} then {after}"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# -- in a real worker --------------------------------------------------------


def test_same_invoice_tasks_take_turns_while_different_invoices_overlap(
    app: Celery, worker: Worker, log: Log
) -> None:
    a, b = unique("a"), unique("b")
    results: list[tuple[str, AsyncResult[Any]]] = []
    for _ in range(3):  # four ways to pass the same arguments, alternating invoices
        results.append((a, tasks.hold_invoice.delay(log.key, a)))
        results.append((b, tasks.hold_invoice.apply_async((log.key,), {"invoice_id": b})))
        results.append(
            (a, app.send_task("tests.celery_app.hold_invoice", [log.key, a, tasks.HOLD_MS]))
        )
        results.append((b, tasks.hold_invoice.delay(log.key, invoice_id=b, hold_ms=tasks.HOLD_MS)))

    names = [(invoice, result.get(timeout=RESULT_TIMEOUT_S)) for invoice, result in results]

    assert all(name == f"invoice-{invoice}" for invoice, name in names), names
    holds = log.holds()
    assert len(holds) == len(results)
    by_lock = {lock: [h for h in holds if h.lock == lock] for lock in {h.lock for h in holds}}
    assert sorted(len(group) for group in by_lock.values()) == [6, 6]
    for group in by_lock.values():
        assert_serial(group)
    first, second = by_lock.values()
    assert any(x.overlaps(y) for x in first for y in second), "different invoices never overlapped"
    if worker.pool == "prefork":
        # The main process took a lock before the pool forked (worker_init in
        # tests/celery_app.py): children that reused its portal thread or
        # clients would hang instead of getting here.
        assert worker.warmed_up_in == worker.main_pid
        assert len({h.pid for h in holds}) >= 2
        assert worker.main_pid not in {h.pid for h in holds}
    else:
        assert {h.pid for h in holds} == {worker.main_pid}
        assert len({h.thread for h in holds}) >= 2


def test_two_executions_of_one_task_id_take_turns(worker: Worker, log: Log) -> None:
    invoice, task_id = unique("redelivered"), str(uuid.uuid4())
    for _ in range(2):  # the second message is what a redelivery looks like
        tasks.hold_invoice.apply_async((log.key, invoice), task_id=task_id)

    log.wait("done", 2)

    holds = log.holds()
    assert [h.task_id for h in holds] == [task_id, task_id]
    assert_serial(holds)


def test_self_retry_inside_the_body_releases_and_the_retry_gets_the_lock(
    worker: Worker, log: Log
) -> None:
    result = tasks.retry_once.delay(log.key, unique("retry"))

    fence = result.get(timeout=RESULT_TIMEOUT_S)

    holds = log.holds()
    assert [h.retries for h in holds] == [0, 1]
    assert_serial(holds)
    assert fence == holds[1].fence


def test_an_exception_in_the_body_releases_the_lock(app: Celery, worker: Worker, log: Log) -> None:
    key = unique("fail")
    result = tasks.fail_inside.delay(log.key, key)

    with pytest.raises(ValueError, match="failing on purpose"):
        result.get(timeout=RESULT_TIMEOUT_S)

    # The result is stored after the body's release, so this is not a race.
    status = lock_for(app, f"fail-{key}").status()
    assert not status.held
    assert status.fence == log.holds()[0].fence


def test_current_lease_gives_the_fence_the_lock_granted(
    app: Celery, worker: Worker, log: Log
) -> None:
    key = unique("gate")
    fences = [tasks.pass_gate.delay(log.key, key).get(timeout=RESULT_TIMEOUT_S) for _ in range(2)]

    assert fences == [h.fence for h in log.holds()]
    assert lock_for(app, f"gate-{key}").status().fence == fences[-1]
    assert fences[1] > fences[0]


def test_a_task_that_cannot_get_the_lock_in_time_fails_and_leaves_nothing_queued(
    app: Celery, worker: Worker, log: Log
) -> None:
    key = unique("busy")
    lock = lock_for(app, f"gate-{key}")
    with lock.hold(timeout=5):
        result = tasks.try_gate.delay(log.key, key)
        result.get(timeout=RESULT_TIMEOUT_S, propagate=False)
        status = lock.status()

    assert result.failed()
    # The JSON result backend cannot rebuild LockTimeout (its __init__ takes
    # keyword-only details), so the caller gets a generic Exception naming it.
    assert "LockTimeout" in repr(result.result)
    assert "not acquired within 0.3 s" in repr(result.result)
    assert status.waiting == 0
    assert log.holds() == []


def test_decorator_options_override_the_app_settings(worker: Worker) -> None:
    left_ms = tasks.lease_left.delay(unique("lease")).get(timeout=RESULT_TIMEOUT_S)

    assert tasks.LEASE_MS < left_ms <= 3000


def test_a_child_killed_mid_hold_frees_the_lock_within_a_lease(
    app: Celery, worker: Worker, log: Log
) -> None:
    if worker.pool != "prefork":
        pytest.skip("killing one execution needs a process per execution")
    key, gate = unique("kill"), f"{log.key}:gate"
    lock = lock_for(app, f"gate-{key}")
    blocked = tasks.hold_until_gate.delay(log.key, key, gate)
    log.wait("entered", 1)
    [holder] = [json.loads(raw) for raw in log.client.lrange(log.key, 0, -1)]
    follower = tasks.pass_gate.delay(log.key, key)
    deadline = time.monotonic() + RESULT_TIMEOUT_S
    while lock.status().waiting < 1:  # nothing to wait on: the queue is in Redis
        assert time.monotonic() < deadline, "the follower never queued for the lock"
        time.sleep(0.01)

    assert holder["pid"] != worker.main_pid
    try:
        os.kill(holder["pid"], signal.SIGKILL)
        killed_ns = time.monotonic_ns()
        fence = follower.get(timeout=RESULT_TIMEOUT_S)
    finally:
        log.client.rpush(gate, "open")  # frees the holder, should the kill have missed

    [entered] = [
        entry
        for entry in map(json.loads, log.client.lrange(log.key, 0, -1))
        if entry["event"] == "enter" and entry["fence"] == fence
    ]
    waited_ms = (entered["ns"] - killed_ns) / 1e6
    assert fence > holder["fence"]
    assert waited_ms <= tasks.LEASE_MS + tasks.POLL_MS + 200, waited_ms
    with pytest.raises(WorkerLostError):
        blocked.get(timeout=RESULT_TIMEOUT_S)


# -- settings, decoration rules, outside a worker ------------------------------


def test_the_lock_server_defaults_to_a_redis_broker() -> None:
    app = Celery("t", broker="redis://broker.example:6379/4")

    config = LockConfig.from_app(app, "jobs")

    assert config.redis_url == "redis://broker.example:6379/4"
    assert (config.settings.lease_ms, config.settings.poll_ms) == (60_000, 30_000)


def test_fifo_lock_redis_url_wins_over_the_broker_and_reads_the_django_namespace() -> None:
    class DjangoSettings:
        CELERY_BROKER_URL = "redis://broker.example/1"
        CELERY_FIFO_LOCK_REDIS_URL = "rediss://locks.example/0"
        CELERY_FIFO_LOCK_LEASE_MS = 9000

    app = Celery("t")
    app.config_from_object(DjangoSettings, namespace="CELERY")

    config = LockConfig.from_app(app, "jobs", poll_ms=1000)

    assert config.redis_url == "rediss://locks.example/0"
    assert (config.settings.lease_ms, config.settings.poll_ms) == (9000, 1000)


@pytest.mark.parametrize(
    "broker", ["amqp://guest:secret@rabbit//", "redis://a/0;redis://b/0", "sqs://"]
)
def test_a_broker_that_is_not_one_redis_url_is_an_error_naming_the_setting(broker: str) -> None:
    app = Celery("t", broker=broker)

    with pytest.raises(LockUsageError, match=REDIS_URL_SETTING) as caught:
        LockConfig.from_app(app, "jobs")

    assert "secret" not in str(caught.value)
    assert "CELERY_FIFO_LOCK_REDIS_URL" in str(caught.value)


@pytest.mark.parametrize(
    ("setting", "value"),
    [("fifo_lock_lease_ms", "600"), ("fifo_lock_poll_ms", 1.5), ("fifo_lock_max_hold_ms", 0)],
)
def test_a_bad_timing_setting_is_refused_by_name(setting: str, value: object) -> None:
    app = Celery("t", broker="redis://localhost/0")
    app.conf[setting] = value

    with pytest.raises(ValueError, match=setting):
        LockConfig.from_app(app, "jobs")


def test_inconsistent_merged_settings_are_refused_with_the_lock_name() -> None:
    app = Celery("t", broker="redis://localhost/0")
    app.conf.fifo_lock_lease_ms = 1000

    with pytest.raises(ValueError, match=r"'jobs'.*poll_ms"):
        LockConfig.from_app(app, "jobs", poll_ms=800)


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("invoice-{invoice}", "names invoice, which the function does not take"),
        ("invoice-{}", "positional field"),
        ("invoice-{0}", "positional field"),
        ("invoice-{{id}}", "can never make a valid lock name"),
        ("invoice-{invoice_id", "not a valid format string"),
    ],
)
def test_a_bad_name_template_fails_at_decoration(template: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):

        @fifo_locked(template)
        def job(invoice_id: int) -> None: ...


@pytest.mark.parametrize(
    "options",
    [{"timeout": -1}, {"lease_ms": 1.5}, {"poll_ms": 0}, {"max_hold_ms": True}],
)
def test_bad_options_fail_at_decoration(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        fifo_locked("jobs", **options)


def test_fifo_locked_on_top_of_app_task_is_refused() -> None:
    app = Celery("t")

    @app.task
    def job() -> None: ...

    with pytest.raises(TypeError, match=r"put it under @app\.task"):
        fifo_locked("jobs")(job)


def test_the_task_keeps_its_signature_for_celerys_argument_check(app: Celery) -> None:
    with pytest.raises(TypeError):
        tasks.hold_invoice.delay(log="x")  # invoice_id missing: refused before sending


def test_current_lease_outside_a_locked_body_is_a_usage_error(app: Celery) -> None:
    with pytest.raises(LockUsageError, match="outside the body of a @fifo_locked task"):
        current_lease()

    @app.task
    def unlocked() -> int:
        return current_lease().fence

    with pytest.raises(LockUsageError):
        unlocked.apply(throw=True)


def test_calling_the_body_outside_a_task_is_a_usage_error() -> None:
    with pytest.raises(LockUsageError, match="outside a Celery task"):
        tasks.fail_inside.run("log", "key")


def test_a_body_that_reenters_its_own_lock_fails_instead_of_waiting_forever(
    app: Celery,
) -> None:
    key = unique("reenter")

    @app.task
    @fifo_locked("reenter-{key}", timeout=5)
    def outer(key: str) -> None:
        inner.run(key)

    @app.task
    @fifo_locked("reenter-{key}", timeout=5)
    def inner(key: str) -> None: ...

    with pytest.raises(LockUsageError, match="already held in this task"):
        outer.apply((key,), throw=True)
    assert not lock_for(app, f"reenter-{key}").status().held


def test_eager_self_retry_releases_before_the_retry_runs(app: Celery, log: Log) -> None:
    # Celery >= 5.3 re-runs an eager retry from apply(), after the body returned.
    fence = tasks.retry_once.apply((log.key, unique("eager"))).get()

    holds = log.holds()
    assert [h.retries for h in holds] == [0, 1]
    assert_serial(holds)
    assert fence == holds[1].fence


def test_each_app_and_url_has_one_loop_clients_per_process(app: Celery) -> None:
    other = Celery("other", broker=app.conf.broker_url)
    url = app.conf.broker_url

    assert clients_for(app, url) is clients_for(app, url)
    assert clients_for(app, url) is not clients_for(other, url)
    assert clients_for(app, url) is not clients_for(app, url + "?socket_timeout=5")


def test_a_forked_child_builds_its_own_portal_and_clients(app: Celery) -> None:
    name = unique("fork")
    with lock_for(app, name).hold(timeout=5) as parent_lease:
        pass
    parent_clients = clients_for(app, app.conf.broker_url)
    assert len(parent_clients) == 1

    pid = os.fork()
    if pid == 0:  # the child: report through the exit code only
        code = 1
        try:
            signal.alarm(10)  # a child that hangs dies instead of hanging the test
            with lock_for(app, name).hold(timeout=5) as child_lease:
                fresh = clients_for(app, app.conf.broker_url) is not parent_clients
                code = 0 if fresh and child_lease.fence > parent_lease.fence else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)

    assert os.waitstatus_to_exitcode(status) == 0
    assert len(parent_clients) == 1
    with lock_for(app, name).hold(timeout=5):  # and the parent still works
        pass
