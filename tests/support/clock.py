"""Stepping this machine's wall clock in a test, and putting it back.

Redis and the sentinels run on this machine, so a test that steps the wall
clock (``CLOCK_REALTIME``) steps theirs: as an operator's ``date -s`` does, or
a VM paused and resumed whose clock is set right on resume. It needs the right
to (root, ``CAP_SYS_TIME``); tests skip without it (:func:`may_set_clock`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


def may_set_clock() -> bool:
    """Whether this process may set the wall clock (it sets it to itself)."""
    try:
        time.clock_settime(time.CLOCK_REALTIME, time.clock_gettime(time.CLOCK_REALTIME))
    except PermissionError:
        return False
    return True


class WallClock:
    """Steps of the wall clock, measured against the monotonic clock that no
    step moves, so that :meth:`restore` puts the wall clock back exactly."""

    def __init__(self) -> None:
        self._offset_s = time.clock_gettime(time.CLOCK_REALTIME) - time.monotonic()

    def step(self, by_s: float) -> None:
        """Step the wall clock ``by_s`` seconds (ahead if positive)."""
        time.clock_settime(time.CLOCK_REALTIME, time.clock_gettime(time.CLOCK_REALTIME) + by_s)

    def restore(self) -> None:
        """Undo every step since this object was made (time that passed stays)."""
        time.clock_settime(time.CLOCK_REALTIME, time.monotonic() + self._offset_s)


@contextmanager
def wall_clock_steps() -> Iterator[WallClock]:
    """A :class:`WallClock` for a ``with`` block; its steps are undone at the end."""
    clock = WallClock()
    try:
        yield clock
    finally:
        clock.restore()
