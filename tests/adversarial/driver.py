"""The driver: starts contender processes, finds victims in the record, injects faults.

``Fleet`` owns the processes of one run. It reads the same record the checker
reads to learn who is inside and who is waiting (there is no event for "another
process entered": the record is polled), picks victims with the run's seeded
``random.Random``, and writes every fault it injects to ``faults.rec`` before
or right after injecting it, so the checker can tell faults from failures.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.adversarial.contender import Spec
from tests.support.polling import until
from tests.support.record import Line, Record, read_lines

ROOT = Path(__file__).resolve().parents[2]
RECORD_POLL_S = 0.005
"""How often the driver re-reads the record while waiting for a state."""
STALL_S = 8.0
"""A run whose record has not grown for this long while contenders run has hung:
no scenario leaves the record idle for more than ~4 s (an 8-lease hold)."""


@dataclass
class Proc:
    """One contender process."""

    who: str
    spec: Spec
    process: asyncio.subprocess.Process
    stderr: Path
    killed: bool = False

    @property
    def pid(self) -> int:
        """The process id."""
        return self.process.pid


@dataclass
class Inside:
    """A holder the record shows inside (entered, not yet exited)."""

    lock: str
    pid: int
    token: str
    entered_ns: int


@dataclass
class Fleet:
    """The contender processes of one run and the faults injected into them.

    Args:
        url: the Redis server.
        run_dir: where the record files go.
        seed: seeds the driver's choices and each contender's schedule.
        defaults: ``Spec`` fields shared by every contender of the run.
    """

    url: str
    run_dir: Path
    seed: int
    defaults: dict[str, Any] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.faults = Record(self.run_dir / "faults.rec")

    async def spawn(self, who: str, **overrides: Any) -> Proc:
        """Start a contender called ``who`` (``Spec`` fields override the defaults)."""
        fields = {**self.defaults, **overrides}
        spec = Spec(
            url=self.url,
            run_dir=str(self.run_dir),
            who=who,
            seed=self.rng.getrandbits(32),
            **fields,
        )
        stderr = self.run_dir / f"{who}.err"
        with stderr.open("wb") as sink:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.adversarial.contender",
                spec.to_json(),
                cwd=ROOT,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=sink,
            )
        proc = Proc(who, spec, process, stderr)
        self.procs.append(proc)
        return proc

    # --- reading the record ------------------------------------------------------------

    def lines(self, lock: str) -> list[Line]:
        """The record of ``lock`` so far."""
        return read_lines(self.run_dir / f"{lock}.rec")

    def inside(self, lock: str) -> list[Inside]:
        """Holders of ``lock`` that entered and have not exited, in live processes."""
        alive = {proc.pid for proc in self.procs if not proc.killed}
        holders: dict[str, Inside] = {}
        for line in self.lines(lock):
            if line.kind == "enter" and line.pid in alive:
                holders[line.fields[0]] = Inside(lock, line.pid, line.fields[0], line.ns)
            elif line.kind == "exit":
                holders.pop(line.fields[0], None)
        return list(holders.values())

    def waiting(self, lock: str) -> dict[int, int]:
        """Live processes with requests of ``lock`` queued but not served: pid -> count."""
        alive = {proc.pid for proc in self.procs if not proc.killed}
        queued: dict[str, int] = {}
        for line in self.lines(lock):
            token = line.fields[0] if line.fields else ""
            if line.kind == "queued" and line.fields[2] == "0" and line.pid in alive:
                queued[token] = line.pid
            elif line.kind in ("enter", "gaveup"):
                queued.pop(token, None)
        counts: dict[int, int] = {}
        for pid in queued.values():
            counts[pid] = counts.get(pid, 0) + 1
        return counts

    def by_pid(self, pid: int) -> Proc:
        """The process with ``pid``."""
        return next(proc for proc in self.procs if proc.pid == pid)

    async def until(self, check: Callable[[], object], what: str, timeout_s: float = 20) -> Any:
        """Re-read the record until ``check()`` is truthy; return its value.

        Raises:
            AssertionError: after ``timeout_s`` seconds, naming ``what``.
        """
        return await until(check, what, timeout_s, pause_s=RECORD_POLL_S)

    # --- faults ------------------------------------------------------------------------

    async def kill(self, proc: Proc) -> None:
        """SIGKILL ``proc`` and record it."""
        proc.process.send_signal(signal.SIGKILL)
        self.faults.fault("kill", proc.pid)
        proc.killed = True
        await proc.process.wait()

    async def freeze(self, proc: Proc, ms: float) -> None:
        """SIGSTOP ``proc`` for ``ms`` milliseconds, then SIGCONT it; record both."""
        proc.process.send_signal(signal.SIGSTOP)
        self.faults.fault("stop", proc.pid)
        try:
            await asyncio.sleep(ms / 1000)  # the fault itself: the process stays frozen this long
        finally:
            self.faults.fault("cont", proc.pid)
            proc.process.send_signal(signal.SIGCONT)

    async def finish(self, timeout_s: float, *, stall_s: float = STALL_S) -> None:
        """Wait for every process to exit. A run whose record has not grown for
        ``stall_s`` seconds while contenders still run, or that is not over after
        ``timeout_s``, hung: the processes are killed and the hang reported. Any
        non-zero exit of a process the driver did not kill is reported too."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        size, grew_at = self._record_size(), loop.time()
        running = [proc for proc in self.procs if proc.process.returncode is None]
        while running:
            waits = {asyncio.ensure_future(proc.process.wait()) for proc in running}
            _, pending = await asyncio.wait(waits, timeout=0.25)
            for waiting in pending:
                waiting.cancel()
            running = [proc for proc in self.procs if proc.process.returncode is None]
            now = loop.time()
            if self._record_size() != size:
                size, grew_at = self._record_size(), now
            stalled = now - grew_at > stall_s
            if running and (stalled or now > deadline):
                why = (
                    f"no record entry for {stall_s:g} s"
                    if stalled
                    else f"not done after {timeout_s:g} s"
                )
                for proc in running:
                    self.problems.append(
                        f"contender {proc.who} (pid {proc.pid}) hung: {why} (a request or a "
                        "release never ended)"
                    )
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.process.send_signal(signal.SIGKILL)
                    await proc.process.wait()
                break
        for proc in self.procs:
            if not proc.killed and proc.process.returncode not in (0, -signal.SIGKILL):
                tail = proc.stderr.read_text(errors="replace").strip().splitlines()[-12:]
                self.problems.append(
                    f"contender {proc.who} (pid {proc.pid}) exited with "
                    f"{proc.process.returncode}:\n    " + "\n    ".join(tail)
                )

    def _record_size(self) -> int:
        """Total size of the run's record files (grows with every entry)."""
        return sum(path.stat().st_size for path in self.run_dir.glob("*.rec"))

    async def close(self) -> None:
        """Kill whatever still runs (after a failed scenario); never raises."""
        for proc in self.procs:
            if proc.process.returncode is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.process.send_signal(signal.SIGKILL)
                except ProcessLookupError:
                    continue
                await proc.process.wait()
