"""Tests for :mod:`redis_fifo_lock.holds`: the hold record and its checker, on
hand-made holds and on holds of a real lock."""

from __future__ import annotations

import asyncio
import time

from redis.asyncio import Redis as AsyncRedis

from redis_fifo_lock import FifoLock
from redis_fifo_lock.holds import Hold, violations


def held(fence: int | None, entered: int, exited: int | None, **extra: object) -> Hold:
    """A hold with ticket = fence, process id = fence (or 0) and the given span."""
    hold = Hold(fence, fence, entered, exited, pid=fence or 0)
    for name, value in extra.items():
        setattr(hold, name, value)
    return hold


def found(holds: list[Hold], *, allow_open: bool = False) -> list[str]:
    """The checker's sentences about ``holds``."""
    return [str(violation) for violation in violations(holds, allow_open=allow_open)]


def test_holds_one_after_another_in_fence_and_ticket_order_pass() -> None:
    holds = [held(1, 0, 10), held(2, 10, 20), held(5, 25, 30)]
    assert violations(holds) == []


def test_a_hold_entering_while_the_previous_one_is_inside_is_an_overlap() -> None:
    holds = [held(1, 0, 10), held(2, 9, 20)]
    assert found(holds) == ["overlap: fence 2 (pid 2) entered while fence 1 (pid 1) was inside"]
    (violation,) = violations(holds)
    assert (violation.kind, violation.hold, violation.earlier) == ("overlap", holds[1], holds[0])


def test_a_hold_entering_while_a_hold_before_the_previous_one_is_inside_is_an_overlap() -> None:
    """Fence 3 comes after fence 2 has left, but fence 1 is still inside."""
    holds = [held(1, 0, 100), held(2, 10, 20), held(3, 30, 40)]
    assert [(v.kind, v.hold.fence, v.earlier and v.earlier.fence) for v in violations(holds)] == [
        ("overlap", 2, 1),
        ("overlap", 3, 1),
    ]


def test_a_hold_whose_lease_was_lost_may_be_overlapped() -> None:
    """The lock told the first holder it had lost the lease: not a silent overlap."""
    assert violations([held(1, 0, 10, lost=True), held(2, 5, 20)]) == []


def test_fences_and_tickets_that_do_not_rise_with_entry_order_are_reported() -> None:
    holds = [held(1, 0, 10), held(3, 10, 20), held(2, 20, 30)]
    assert found(holds) == ["fence 2 entered after fence 3", "ticket 2 granted after ticket 3"]


def test_holds_are_judged_in_order_of_entry_whatever_order_they_come_in() -> None:
    holds = [held(3, 20, 30), held(1, 0, 10), held(2, 10, 20)]
    assert violations(holds) == []


def test_a_hold_that_never_exited_is_reported_unless_holders_may_be_killed() -> None:
    """A killed holder's lease expires: with ``allow_open`` its hold is neither
    reported nor taken to overlap the holds after it."""
    holds = [held(1, 0, None), held(2, 10, 20)]
    assert found(holds) == ["hold fence=1 pid=1 never exited"]
    assert violations(holds, allow_open=True) == []


def test_a_hold_that_exited_before_it_entered_is_reported() -> None:
    """Stamps from clocks that do not agree."""
    assert found([held(1, 10, 5)]) == ["hold fence=1 pid=1 exited before it entered"]


def test_holds_without_fences_or_tickets_are_checked_for_overlaps_only() -> None:
    """Another library's lock has neither fences nor tickets."""
    holds = [held(None, 0, 10), held(None, 10, 20), held(None, 15, 30)]
    assert [v.kind for v in violations(holds)] == ["overlap"]


async def test_the_holds_of_a_real_lock_pass_and_of_two_locks_overlap(aredis: AsyncRedis) -> None:
    """Tasks record their holds as the module's docstring shows: on one lock
    the checker finds nothing; split over two lock names, it finds the overlap."""

    async def hold_a_while(lock: FifoLock, holds: list[Hold], ready: asyncio.Event) -> None:
        async with lock.hold(timeout=30) as lease:
            hold = Hold(lease.fence, lease.ticket, time.monotonic_ns())
            holds.append(hold)
            ready.set()
            await asyncio.sleep(0.05)  # stay inside while the others try to enter
            hold.exited_ns = time.monotonic_ns()

    async def run(names: list[str]) -> list[Hold]:
        holds: list[Hold] = []
        first_in = asyncio.Event()
        locks = [FifoLock(aredis, name, lease_ms=2000, poll_ms=100) for name in names]
        first = asyncio.create_task(hold_a_while(locks[0], holds, first_in))
        await first_in.wait()  # the second task asks while the first is inside
        await asyncio.gather(
            first, *(hold_a_while(lock, holds, asyncio.Event()) for lock in locks[1:])
        )
        return holds

    assert violations(await run(["holds-one"] * 4)) == []
    kinds = [v.kind for v in violations(await run(["holds-a", "holds-b"]))]
    assert "overlap" in kinds
