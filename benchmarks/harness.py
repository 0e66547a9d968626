"""The benchmark's plumbing: child processes, the Redis server, and what it reports."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
"""The repository root: the workers run there, as ``python -m benchmarks.worker``."""


class BenchError(RuntimeError):
    """A workload could not be run as planned (a worker died, hung or failed)."""


# --- child processes -------------------------------------------------------------------


class Worker:
    """A ``benchmarks.worker`` child process and its JSON-lines conversation."""

    def __init__(self, role: str, spec: dict[str, Any]) -> None:
        self.role = role
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.worker", role, json.dumps(spec)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, name=f"bench-{role}-reader", daemon=True).start()

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.proc.pid

    def _read(self) -> None:
        if self.proc.stdout is None:  # never: Popen was given stdout=PIPE
            raise BenchError(f"{self.role} worker {self.pid} has no stdout")
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def expect(self, event: str, timeout_s: float) -> dict[str, Any]:
        """Wait up to ``timeout_s`` seconds for ``event``, skipping other events;
        raise ``BenchError`` if the child exits or stays silent."""
        return self.expect_all((event,), timeout_s)[event]

    def expect_all(self, events: tuple[str, ...], timeout_s: float) -> dict[str, dict[str, Any]]:
        """Wait up to ``timeout_s`` seconds for every one of ``events``, in any
        order (two contenders of one process report independently), skipping
        other events; raise ``BenchError`` if the child exits or stays silent."""
        deadline = time.monotonic() + timeout_s
        seen: dict[str, dict[str, Any]] = {}
        for _ in range(10_000):
            missing = [event for event in events if event not in seen]
            if not missing:
                return seen
            event = missing[0]
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise BenchError(
                    f"{self.role} worker {self.pid} sent no {event!r} within {timeout_s:g} s"
                ) from None
            if line is None:
                raise BenchError(
                    f"{self.role} worker {self.pid} exited (code {self.proc.wait()}) "
                    f"before {event!r}; its stderr is above"
                )
            message: dict[str, Any] = json.loads(line)
            if message.get("event") in events:
                seen.setdefault(str(message["event"]), message)
        raise BenchError(f"{self.role} worker {self.pid}: too many lines before {events!r}")

    def send(self, **command: Any) -> None:
        """Send one command line."""
        if self.proc.stdin is None:  # never: Popen was given stdin=PIPE
            raise BenchError(f"{self.role} worker {self.pid} has no stdin")
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        """SIGKILL the child and reap it."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def close(self, timeout_s: float = 30.0) -> None:
        """Ask the child to exit; kill it if it has not within ``timeout_s``."""
        with contextlib.suppress(BrokenPipeError, OSError):
            self.send(cmd="exit")
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()


@contextlib.contextmanager
def workers(role: str, specs: Sequence[dict[str, Any]]) -> Iterator[list[Worker]]:
    """Start one worker per spec; always stop them all."""
    started: list[Worker] = []
    try:
        for spec in specs:
            started.append(Worker(role, spec))
        yield started
    finally:
        for worker in started:
            if worker.proc.poll() is None:
                worker.close()


# --- the server and what it reports ----------------------------------------------------------


def raise_open_files_limit() -> int:
    """Raise this process's soft open-files limit to its hard limit (the private
    server and the workers inherit it); return the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 65_536
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


@contextlib.contextmanager
def redis_server(max_waiters: int) -> Iterator[str]:
    """``$REDIS_URL``, or a private server whose ``maxclients`` fits the waiters."""
    from_env = os.environ.get("REDIS_URL")
    if from_env:
        yield from_env
        return
    from redis_fifo_lock.testing import private_redis_server

    limit = raise_open_files_limit()
    maxclients = max(10_000, min(limit - 64, max_waiters + 1000))
    # A deeper accept queue, so that thousands of waiters connecting at once are
    # not held up by SYN retries (the kernel caps it at net.core.somaxconn).
    options = ["--maxclients", str(maxclients), "--tcp-backlog", "4096"]
    with private_redis_server(extra_args=options) as server:
        yield server.url


def command_calls(client: redis.Redis) -> dict[str, int]:
    """``INFO commandstats`` as {command: calls}."""
    stats = client.info("commandstats")
    return {key.removeprefix("cmdstat_"): int(value["calls"]) for key, value in stats.items()}


def connected_clients(client: redis.Redis) -> int:
    """``connected_clients`` from ``INFO clients``."""
    return int(client.info("clients")["connected_clients"])


MONITOR_COMMANDS = ("info", "client|list")
"""What the driver itself sends while it measures: left out of the counts."""


def calls_between(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Commands run between two ``command_calls`` snapshots, the driver's own left out."""
    delta = {
        command: calls - before.get(command, 0)
        for command, calls in after.items()
        if command not in MONITOR_COMMANDS
    }
    return {command: calls for command, calls in sorted(delta.items()) if calls}
