"""Client instructions per acquire + release, counted by callgrind.

    uv run --all-extras --group bench python -m benchmarks.instructions --cycles 500

The contended figures of ``benchmarks.run`` move by a tenth or more between two
runs of the same code on a small shared VM, which hides any change smaller than
that. ``valgrind --tool=callgrind`` counts instructions instead of time: the same
program with the same inputs gives the same count, whatever else the machine is
doing. So a change to the client's path can be judged here, then confirmed in
the contended runs.

Each case runs in a child Python under callgrind twice, after the same set-up
and warm-up: once with no measured cycles and once with ``--cycles``; the
difference divided by ``--cycles`` is what one cycle costs the client process,
all its threads counted (Redis runs outside valgrind and is not counted).
Cases, every client with redis-py's defaults and the reply parser ``--parser``
names (default: redis-py's pure-Python one, as in the headline rows):

- ``ping-async`` / ``ping-sync``: two PINGs (an acquire + release is at least
  two round trips), asyncio and sync client: the yardsticks;
- ``<library>``: one contender's uncontended acquire + release, as
  ``benchmarks.libraries`` calls it (``fifolock``, ``fifolock-sync``,
  ``redis-py-async``, ``redis-py``, ``python-redis-lock``, ``pottery``);
- ``fifolock-handoff``: two ``FifoLock`` tasks of one process take turns, so
  each grant is a hand-off to a waiter in the release's reply (the waiter's
  path: its wait, the hand-over, its lease); a cycle is one grant to each
  task, two grants.
- ``fifolock-ring``: the same with each task on a client of its own, so each
  grant goes to another wait group's session and reaches it by the doorbell
  (as to another process: the ring read and dispatched, the waiter woken).

Instructions are not seconds: a system call or a cache miss counts as a few
instructions, so compare cases of the same kind, and a change's effect here
with its effect on the contended runs.

``--by-module`` says where a cycle's work goes instead, without valgrind: each
child run counts the Python bytecode instructions every function executes
(``sys.settrace`` with opcode events, all threads), and the difference per
cycle is printed by module, then by function (``--top`` rows each). Bytecodes
are not machine instructions either (work done in C, by a builtin or an
extension, is not counted), and they move by a per cent or so between runs of
a few hundred cycles (with how often the event loop finds a reply already
there), but they name the Python code that asked for the work.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import sysconfig
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

from benchmarks.harness import redis_server
from benchmarks.libraries import BY_KEY, Connection, Parser, available_parsers

WARMUP_CYCLES = 100
"""Cycles run before the count starts, in both runs of a case."""

CASES = ("ping-async", "ping-sync", *BY_KEY, "fifolock-handoff", "fifolock-ring")


async def _async_case(case: str, conn: Connection, cycles: int) -> None:
    if case == "ping-async":
        client = conn.async_()
        for _ in range(WARMUP_CYCLES + cycles):
            await client.ping()
            await client.ping()
    elif case in ("fifolock-handoff", "fifolock-ring"):
        from redis_fifo_lock import FifoLock

        first = FifoLock(conn.async_(), "instructions")
        # Another client is another hub, with a session of its own: a grant to
        # it is rung, as to another process.
        other = conn.async_() if case == "fifolock-handoff" else conn.async_fresh()
        second = FifoLock(other, "instructions")

        async def taker(lock: FifoLock, grants: int) -> None:
            for _ in range(grants):
                lease = await lock.acquire()
                await asyncio.sleep(0)
                await lock.release(lease)

        # Each task's next acquire queues behind the other's grant: every grant
        # after the first is handed over, in a release's reply or by a ring.
        grants = WARMUP_CYCLES + cycles
        try:
            await asyncio.gather(taker(first, grants), taker(second, grants))
        finally:
            if other is not conn.async_():
                await other.aclose()
    else:
        make = BY_KEY[case].make_async
        assert make is not None
        contender = make(conn, "instructions", None)
        for _ in range(WARMUP_CYCLES + cycles):
            await contender.acquire()
            await contender.release()
    await conn.aclose()


def _child(case: str, parser: Parser, url: str, cycles: int) -> None:
    """Run ``case`` for the warm-up and ``cycles`` more, in this process."""
    conn = Connection(url, "instructions", parser)
    library = BY_KEY.get(case)
    if case == "ping-sync":
        client = conn.sync()
        for _ in range(WARMUP_CYCLES + cycles):
            client.ping()
            client.ping()
    elif library is not None and library.kind == "sync":
        assert library.make_sync is not None
        contender = library.make_sync(conn, "instructions", None)
        for _ in range(WARMUP_CYCLES + cycles):
            contender.acquire()
            contender.release()
    else:
        asyncio.run(_async_case(case, conn, cycles))


def _child_command(case: str, parser: Parser, url: str, cycles: int) -> list[str]:
    """The command of a child run of ``case`` (see ``_child``)."""
    return [
        sys.executable,
        "-m",
        "benchmarks.instructions",
        "--child",
        case,
        "--parser",
        parser,
        "--url",
        url,
        "--cycles",
        str(cycles),
    ]


def _count(case: str, parser: Parser, url: str, cycles: int, folder: Path) -> int:
    """The instructions callgrind counted in one child run of ``case``."""
    out = folder / f"{case}-{cycles}.callgrind"
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            *_child_command(case, parser, url, cycles),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return total_of(out.read_text(), str(out))


def total_of(callgrind_out: str, where: str = "callgrind's output") -> int:
    """The instruction total in the text of a callgrind output file (its
    ``summary:`` line, or ``totals:`` in older files).

    Raises:
        RuntimeError: naming ``where``, when the text has no total.
    """
    found = re.search(r"^(?:summary|totals): (\d+)", callgrind_out, re.MULTILINE)
    if found is None:
        raise RuntimeError(f"no instruction total in {where}")
    return int(found.group(1))


def module_of(filename: str) -> str:
    """The dotted module name of a code object's ``filename`` (its path under
    the interpreter's library or site-packages, or under this checkout), or
    the filename itself when it is under none of them (``<string>``, say)."""
    path = Path(filename)
    roots = [Path(sysconfig.get_paths()[name]) for name in ("purelib", "platlib", "stdlib")]
    roots.append(Path(__file__).resolve().parent.parent)
    for root in roots:
        if path.is_relative_to(root):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            return ".".join(parts)
    return filename


@contextmanager
def counting_bytecodes() -> Iterator[Counter[CodeType]]:
    """Count, per code object, the bytecode instructions run in the block by
    functions called from inside it, in this thread and in threads started in
    it (``sys.settrace`` / ``threading.settrace`` with opcode events)."""
    counts: Counter[CodeType] = Counter()

    def trace(frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        if event == "call":
            frame.f_trace_opcodes = True
        elif event == "opcode":
            counts[frame.f_code] += 1
        return trace

    threading.settrace(trace)
    sys.settrace(trace)
    try:
        yield counts
    finally:
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]


def _bytecodes(case: str, parser: Parser, url: str, cycles: int, folder: Path) -> Counter[str]:
    """The bytecodes per ``module:function`` of one child run of ``case``."""
    out = folder / f"{case}-{cycles}.json"
    subprocess.run(
        [*_child_command(case, parser, url, cycles), "--bytecodes-out", str(out)], check=True
    )
    return Counter(json.loads(out.read_text()))


def bytecodes_per_cycle(case: str, parser: Parser, url: str, cycles: int) -> Counter[str]:
    """Bytecodes one cycle of ``case`` runs, per ``module:function`` (see the module)."""
    with tempfile.TemporaryDirectory() as folder:
        base = _bytecodes(case, parser, url, 0, Path(folder))
        total = _bytecodes(case, parser, url, cycles, Path(folder))
    total.subtract(base)
    return Counter({where: count / cycles for where, count in total.items() if count > 0})


def by_module(per_function: Counter[str]) -> Counter[str]:
    """``per_function`` (keys ``module:function``) summed per module."""
    modules: Counter[str] = Counter()
    for where, count in per_function.items():
        modules[where.rpartition(":")[0]] += count
    return modules


def _print_bytecodes(case: str, per_function: Counter[str], top: int) -> None:
    total = sum(per_function.values())
    print(f"{case}: {total:,.0f} bytecodes per cycle", flush=True)
    for title, table in (("module", by_module(per_function)), ("function", per_function)):
        for where, count in table.most_common(top):
            print(f"  {count:8,.0f}  {count / total:6.1%}  {title} {where}")


def per_cycle(case: str, parser: Parser, url: str, cycles: int) -> float:
    """Instructions one cycle of ``case`` costs the client (see the module)."""
    with tempfile.TemporaryDirectory() as folder:
        base = _count(case, parser, url, 0, Path(folder))
        total = _count(case, parser, url, cycles, Path(folder))
    return (total - base) / cycles


def main(argv: Sequence[str] | None = None) -> None:
    """Print each case's client instructions per cycle (k = thousands)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=500)
    parser.add_argument("--parser", choices=available_parsers(), default="python")
    parser.add_argument("--only", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument(
        "--by-module",
        action="store_true",
        help="count Python bytecodes per module and function instead (no valgrind)",
    )
    parser.add_argument("--top", type=int, default=12, help="rows per table with --by-module")
    parser.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--bytecodes-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        if args.bytecodes_out is None:
            _child(args.child, args.parser, args.url, args.cycles)
            return
        with counting_bytecodes() as counts:
            _child(args.child, args.parser, args.url, args.cycles)
        named: Counter[str] = Counter()
        # The portal's thread (sync cases) still runs its tracer: read a copy.
        for code, count in list(counts.items()):
            named[f"{module_of(code.co_filename)}:{code.co_name}"] += count
        args.bytecodes_out.write_text(json.dumps(named))
        return
    with redis_server(max_waiters=0) as url:
        for case in args.only:
            if args.by_module:
                _print_bytecodes(
                    case, bytecodes_per_cycle(case, args.parser, url, args.cycles), args.top
                )
                continue
            count = per_cycle(case, args.parser, url, args.cycles)
            print(f"{case:20} {count / 1000:8,.0f} k instructions per cycle", flush=True)


if __name__ == "__main__":
    main()
