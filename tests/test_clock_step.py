"""A step of the server's wall clock ends a lease early, and the loss says so.

Redis expires keys by its wall clock, so stepping it ahead past a lease's
remaining life ends the lease at once; the holder's next renewal is refused.
The renewal's reply carries the server's clock, and a loss whose server clock
moved further than the holder's own names the step (a CI run lost a lease so,
with nothing else to go on than "the lease expired or was taken").

The private server runs on this machine, so these tests step this machine's
clock: they need the right to (root, CAP_SYS_TIME) and are skipped without
it. Every step is undone before the test ends.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from redis.asyncio import Redis

from redis_fifo_lock import FifoLock, Lease
from redis_fifo_lock.protocol import LockKeys
from tests.support.clock import may_set_clock, wall_clock_steps
from tests.support.polling import until

STEP_S = 5.0
SETTINGS = {"lease_ms": 1500, "poll_ms": 500}  # renewed every 0.5 s


pytestmark = pytest.mark.skipif(
    not may_set_clock(), reason="stepping the wall clock needs CAP_SYS_TIME"
)


@contextmanager
def clock_stepped_ahead(by_s: float) -> Iterator[None]:
    """Step this machine's wall clock ``by_s`` seconds ahead, and back at the end."""
    with wall_clock_steps() as clock:
        clock.step(by_s)
        yield


async def held_and_renewed(aredis: Redis, name: str) -> Lease:
    """A lease of lock ``name`` whose first renewal has been answered."""
    lease = await FifoLock(aredis, name, **SETTINGS).acquire(timeout=5)
    granted_until = lease.expires_at
    await until(lambda: lease.expires_at != granted_until, "the lease was renewed once")
    return lease


async def test_a_lease_ended_by_a_step_of_the_server_clock_names_the_step(aredis: Redis) -> None:
    lease = await held_and_renewed(aredis, "stepped")
    with clock_stepped_ahead(STEP_S):
        await asyncio.wait_for(lease.wait_lost(), timeout=5)
    reason = lease.lost_reason or ""
    assert reason.startswith("Redis refused the renewal: the lease expired or was taken early")
    moved = re.search(r"Redis's clock moved ([\d.]+) s since the last renewal", reason)
    assert moved is not None, reason
    assert STEP_S <= float(moved[1]) < STEP_S + 2, reason
    assert "the server's clock was stepped ahead" in reason


async def test_a_lease_taken_without_a_step_is_lost_with_no_word_of_clocks(aredis: Redis) -> None:
    lease = await held_and_renewed(aredis, "taken")
    await aredis.delete(LockKeys("taken").key("lease"))  # ended behind the holder's back
    await asyncio.wait_for(lease.wait_lost(), timeout=5)
    assert lease.lost_reason == "Redis refused the renewal: the lease expired or was taken"


async def test_a_lease_taken_after_a_harmless_step_is_not_blamed_on_the_clock(
    aredis: Redis,
) -> None:
    """A step shorter than the lease's slack ends nothing; a loss that follows
    for another reason must not be put down to it."""
    lease = await held_and_renewed(aredis, "harmless")
    with clock_stepped_ahead(0.6):  # the lease has 1.0 s and more left
        await aredis.delete(LockKeys("harmless").key("lease"))
        await asyncio.wait_for(lease.wait_lost(), timeout=5)
    assert lease.lost_reason == "Redis refused the renewal: the lease expired or was taken"
