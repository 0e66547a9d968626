"""``benchmarks.instructions --by-module``: where a cycle's Python work goes.

A cycle's count does not depend on how many cycles were run: the set-up and
warm-up are left out. (It moves by a few per cent between runs, with how often
the event loop finds a reply already there, so the bound is loose; set-up and
warm-up left in would multiply the count of the shorter run.)
"""

from __future__ import annotations

import asyncio
import threading

import redis.asyncio.connection

import redis_fifo_lock.lock
from benchmarks import instructions
from benchmarks.harness import redis_server
from benchmarks.instructions import (
    by_module,
    bytecodes_per_cycle,
    counting_bytecodes,
    module_of,
)


def test_a_code_object_is_named_by_its_module() -> None:
    assert module_of(asyncio.events.__file__) == "asyncio.events"
    assert module_of(redis.asyncio.connection.__file__) == "redis.asyncio.connection"
    assert module_of(redis.__file__) == "redis"
    assert module_of(redis_fifo_lock.lock.__file__) == "redis_fifo_lock.lock"
    assert module_of(instructions.__file__) == "benchmarks.instructions"
    assert module_of("<string>") == "<string>"
    assert module_of("/elsewhere/x.py") == "/elsewhere/x.py"


def _work(n: int) -> int:
    total = 0
    for i in range(n):
        total += i
    return total


def test_the_count_covers_the_block_and_the_threads_it_starts() -> None:
    with counting_bytecodes() as counts:
        _work(10)
        thread = threading.Thread(target=_work, args=(1000,))
        thread.start()
        thread.join()
    here = counts[_work.__code__]
    _work(10_000)  # after the block: not counted
    assert counts[_work.__code__] == here
    # One call of 10 rounds and one of 1,000: the loop's body runs 1,010 times.
    assert 1_010 * 3 < here < 1_010 * 20


def test_a_cycle_costs_the_same_however_many_cycles_ran() -> None:
    with redis_server(max_waiters=0) as url:
        few = bytecodes_per_cycle("ping-async", "python", url, 50)
        many = bytecodes_per_cycle("ping-async", "python", url, 150)
    assert abs(sum(few.values()) - sum(many.values())) < 0.2 * sum(many.values())
    modules = by_module(many)
    assert modules["redis.asyncio.connection"] > 0
    assert modules["asyncio.base_events"] > 0
    assert not any(module.startswith("redis_fifo_lock") for module in modules)


def test_a_grant_to_another_client_is_rung() -> None:
    # fifolock-ring's grants reach the waiter through the doorbell, as in
    # another process (fifolock-handoff's come in the release's reply).
    with redis_server(max_waiters=0) as url:
        ring = bytecodes_per_cycle("fifolock-ring", "python", url, 10)
    assert ring["redis_fifo_lock.waiting:ring"] > 0
