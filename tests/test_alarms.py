"""``alarms``: the deadlines a grant arms and almost never reaches (each script
call's bound, through ``timeouts.within``, and a lease's first renewal),
kept by one timer per loop.

Most of these test the alarms on asyncio alone; that the lock's calls are
bounded through them against a silent Redis is ``test_outages``'s
``test_every_call_is_bounded_by_the_lock_when_the_client_has_no_socket_timeout``,
and that leases are renewed is ``test_lease``'s.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import heapq
import sys
import time
import weakref
from typing import Any

import pytest
import uvloop
from redis.asyncio import Redis as AsyncRedis

from redis_fifo_lock import FifoLock
from redis_fifo_lock import alarms as alarms_module
from redis_fifo_lock.alarms import Alarms, alarms
from redis_fifo_lock.timeouts import within

pytestmark = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="Python 3.10 bounds each await with a task of its own"
)


async def _never() -> None:
    await asyncio.Event().wait()


async def _ended(name: str, awaitable: Any, ends: dict[str, float]) -> Any:
    try:
        return await awaitable
    finally:
        ends[name] = time.monotonic()


async def _four_bounds() -> tuple[list[str], dict[str, asyncio.Task[Any]], float]:
    """Bounds of three lengths, the shortest added last, and a call answered
    at once: (what is wrong with when the four ended, their tasks, seconds
    taken)."""
    order: dict[str, float] = {}
    done = asyncio.Event()

    async def quick() -> str:
        await done.wait()
        return "answered"

    started = time.monotonic()
    tasks = {
        "long": asyncio.create_task(_ended("long", within(_never(), 0.9), order)),
        "middle": asyncio.create_task(_ended("middle", within(_never(), 0.5), order)),
        "answered": asyncio.create_task(_ended("answered", within(quick(), 0.5), order)),
        "short": asyncio.create_task(_ended("short", within(_never(), 0.2), order)),
    }
    await asyncio.sleep(0)
    done.set()
    # Only keeps the test short if a bound never runs out; judged by the caller.
    await asyncio.wait(tasks.values(), timeout=3)
    for task in tasks.values():
        task.cancel()
    await asyncio.gather(*tasks.values(), return_exceptions=True)
    ends = {name: at - started for name, at in order.items()}
    problems = []
    if sorted(ends, key=ends.__getitem__) != ["answered", "short", "middle", "long"]:
        problems.append(f"they ended in the order {sorted(ends, key=ends.__getitem__)}")
    if ends.get("long", 0) - ends.get("short", 0) < 0.35:  # 0.7 s apart when on time
        problems.append(f"the 0.2 s and 0.9 s bounds ended at {ends}")
    return problems, tasks, time.monotonic() - started


async def test_each_bound_runs_out_at_its_own_length_in_order() -> None:
    """Each bound runs out at its own time, in the order of their ends; the
    answered call returns its answer; nothing is kept afterwards."""
    problems, tasks, took = await _four_bounds()
    assert not problems, problems
    for name in ("short", "middle", "long"):
        assert isinstance(tasks[name].exception(), TimeoutError), (name, tasks[name])
    assert tasks["answered"].result() == "answered"
    # Less uvloop's clock margins: its loop.time() counts whole milliseconds
    # (rounded down), so a bound set at loop time t, ending at t + 0.9, may end
    # up to 1 ms short of 0.9 s on the monotonic clock; and its alarms ring up
    # to 1 ms early (alarms.RING_MARGIN_S).
    assert 0.9 - 0.002 <= took < 3, took
    assert alarms(asyncio.get_running_loop()).pending() == 0


class _NeverRearmed(Alarms):
    """MUTANT: once rung, the timer is not armed again for the alarms left."""

    def _ring(self) -> None:
        super()._ring()
        handle = self._handle() if self._handle is not None else None
        if handle is not None:
            handle.cancel()
        self._handle = None


class _NotBroughtForward(Alarms):
    """MUTANT: an alarm due before the armed timer does not bring it forward."""

    def set(self, loop: asyncio.AbstractEventLoop, when: float, alarm: Any) -> None:
        if self._handle is None or self._handle() is None:
            super().set(loop, when, alarm)
        else:
            number = next(self._next)
            self._numbers[alarm], self._alarms[number] = number, alarm
            heapq.heappush(self._heap, (when, number))


@pytest.mark.parametrize("mutant", [_NeverRearmed, _NotBroughtForward])
async def test_the_order_of_ends_kills_the_alarms_mutants(
    mutant: type[Alarms], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scenario above fails against alarms that forget to re-arm their
    timer, or to bring it forward for an earlier alarm."""
    monkeypatch.setattr(alarms_module, "Alarms", mutant)
    monkeypatch.setattr(alarms_module, "_by_loop", weakref.WeakKeyDictionary())
    problems, _, _ = await _four_bounds()
    assert problems, f"{mutant.__name__} passed"


def _timers_armed(loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """From now on, when each timer armed on ``loop`` is due (``call_later``
    arms through ``call_at``)."""
    armed: list[float] = []
    call_at = loop.call_at

    def counting_call_at(when: float, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        armed.append(when)
        return call_at(when, *args, **kwargs)

    monkeypatch.setattr(loop, "call_at", counting_call_at)
    return armed


async def test_a_thousand_calls_arm_one_timer_not_a_thousand(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Calls that end before their bound leave the loop's timers alone: the
    shared timer is armed once for all of them (the point of sharing it)."""
    loop = asyncio.get_running_loop()
    armed = _timers_armed(loop, monkeypatch)

    async def answer(value: int) -> int:
        await asyncio.sleep(0)
        return value

    results = [await within(answer(n), 5.0) for n in range(1000)]
    assert results == list(range(1000))
    assert len(armed) <= 2, f"{len(armed)} timers armed for 1,000 calls"
    assert alarms(loop).pending() == 0


async def test_a_cancelled_caller_is_cancelled_not_timed_out() -> None:
    """The caller's own cancellation, even one that lands as the bound runs
    out, stays a cancellation (as with ``asyncio.timeout``)."""
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(within(_never(), 0.3))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert alarms(loop).pending() == 0

    at_expiry = asyncio.create_task(within(_never(), 0.05))
    await asyncio.sleep(0)
    loop.call_at(loop.time() + 0.05, at_expiry.cancel)
    with pytest.raises(asyncio.CancelledError):
        await at_expiry
    assert alarms(loop).pending() == 0


async def test_a_bound_added_during_a_busy_spell_still_runs_out() -> None:
    """After the timer fired with nothing due (its first call had ended), a
    call added later still times out: the timer re-arms for what is left."""
    loop = asyncio.get_running_loop()
    assert await within(asyncio.sleep(0, "first"), 0.2) == "first"
    await asyncio.sleep(0.1)
    late = asyncio.create_task(within(_never(), 0.3))
    await asyncio.wait({late}, timeout=5)
    assert late.done() and isinstance(late.exception(), TimeoutError), late
    assert alarms(loop).pending() == 0


def test_a_closed_loop_s_alarms_go_with_the_loop() -> None:
    """Alarms keep no loop alive, even with their timer still pending (the
    process's state stays bounded by the loops it runs)."""

    async def one() -> weakref.ref[asyncio.AbstractEventLoop]:
        await within(asyncio.sleep(0), 5.0)  # leaves the timer armed
        return weakref.ref(asyncio.get_running_loop())

    loops = [asyncio.run(one()) for _ in range(3)]
    gc.collect()
    kept = [loop for loop in loops if loop() is not None]
    assert not kept, f"{len(kept)} of 3 closed loops still alive"


async def test_a_thousand_grants_arm_no_timer_each(
    aredis: AsyncRedis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Uncontended acquire and release, a thousand times: the calls' bounds and
    the leases' first renewals are alarms, not timers on the loop's heap,
    and none is left behind."""
    # Without a socket_timeout, which would have redis-py arm timers of its own
    # (its default from version 8), and the lock bound each call itself.
    client = AsyncRedis.from_url(redis_url, socket_timeout=None)
    lock = FifoLock(client, "alarms")
    await lock.release(await lock.acquire(timeout=5))  # scripts loaded, doorbell idle
    loop = asyncio.get_running_loop()
    armed = _timers_armed(loop, monkeypatch)
    try:
        for _ in range(1000):
            await lock.release(await lock.acquire(timeout=5))
    finally:
        await client.aclose()
    assert len(armed) <= 20, f"{len(armed)} timers armed for 1,000 grants"
    assert alarms(loop).pending() == 0


def test_a_loop_closed_with_a_bound_running_goes_with_it() -> None:
    """A loop closed while a task still waits inside ``within`` (its alarm
    set) is not kept by its alarms, whose expiry leads back to the loop."""
    loop = asyncio.new_event_loop()
    waiting = loop.create_task(within(_never(), 60))
    loop.run_until_complete(asyncio.sleep(0.01))
    waiting.cancel()  # only to keep asyncio from logging a pending task destroyed
    loop.close()
    gone = weakref.ref(loop)
    del loop, waiting
    gc.collect()
    assert gone() is None, "the closed loop is kept alive"


def test_loops_closed_with_a_lease_held_go_with_them(redis_url: str) -> None:
    """``asyncio.run`` returning a lease still held (its first renewal an alarm
    of the loop that closed): once the lease is dropped, nothing keeps the
    loop, its client or its tasks."""
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def take(name: str) -> Any:
        client = AsyncRedis.from_url(redis_url)
        lease = await FifoLock(client, name).acquire(timeout=5)
        await client.aclose()
        loops.append(weakref.ref(asyncio.get_running_loop()))
        return lease

    for n in range(3):
        lease = asyncio.run(take(f"closed-with-lease-{n}"))
        del lease
    gc.collect()  # runs the dropped leases' finalizers, which hold their renewals
    gc.collect()
    kept = [loop for loop in loops if loop() is not None]
    assert not kept, f"{len(kept)} of 3 closed loops kept"


async def test_an_alarm_that_sets_an_alarm_leaves_one_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An alarm's callback that sets another alarm: the timer it armed is the
    one left, not a second beside it."""
    loop = asyncio.get_running_loop()
    on_loop = alarms(loop)
    armed = _timers_armed(loop, monkeypatch)
    rang = asyncio.Event()
    armed_when_rang: list[int] = []

    def second() -> None:
        armed_when_rang.append(len(armed))
        rang.set()

    def first() -> None:
        on_loop.set(loop, loop.time() + 0.05, second)

    on_loop.set(loop, loop.time() + 0.01, first)
    await within(rang.wait(), 5)
    assert armed_when_rang == [2], f"{armed_when_rang} timers armed for two alarms"


def _alarm_due_at_once_then_another(alarms_class: type[Alarms], new_loop: Any) -> list[str]:
    """On a fresh loop made by ``new_loop``: an alarm already due, then two
    due later; what rang (in order) before the last one did."""

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        on_loop, rung = alarms_class(), []
        done = loop.create_future()
        on_loop.set(loop, loop.time() - 1.0, functools.partial(rung.append, "past"))
        on_loop.set(loop, loop.time() + 0.01, functools.partial(rung.append, "later"))
        on_loop.set(loop, loop.time() + 0.02, functools.partial(done.set_result, None))
        await asyncio.wait_for(done, 2.0)
        return rung

    loop = new_loop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


@pytest.mark.parametrize(
    "new_loop", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"]
)
def test_an_alarm_due_at_once_is_followed_by_later_ones(new_loop: Any) -> None:
    """An alarm set for a time already passed, then later ones: all ring, in
    order. uvloop's ``call_at`` returns a plain ``Handle``, without ``when()``,
    for a time less than half a millisecond away (it calls soon instead); the
    alarms once asked the armed handle when it was due, so the next alarm set
    raised AttributeError there - out of ``acquire`` (a lease's first renewal)
    and out of every bounded call. On each loop, whatever the suite's."""
    assert _alarm_due_at_once_then_another(Alarms, new_loop) == ["past", "later"]


class _AskingTheHandle(Alarms):
    """MUTANT: the armed timer's own ``when()`` says when it is due (uvloop's
    handle of a call due at once has none)."""

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        handle = self._handle() if self._handle is not None else None
        if handle is None or when < handle.when():  # type: ignore[attr-defined]
            if handle is not None:
                handle.cancel()
            self._handle = weakref.ref(loop.call_at(when, self._ring))


def test_an_alarm_due_at_once_kills_the_handle_asking_mutant() -> None:
    """The scenario above fails on uvloop against alarms that ask the armed
    handle when it is due."""
    with pytest.raises(AttributeError, match="when"):
        _alarm_due_at_once_then_another(_AskingTheHandle, uvloop.new_event_loop)
