"""Waiting for state that lives in another process or in Redis.

There is no event to await for "Redis has queued that request" or "another
process wrote its entry"; these helpers re-check a condition until it holds
or a generous deadline passes, and fail loudly then. Every wait of this kind in
the suite goes through them.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

DEADLINE_S = 20.0
"""Default bound of a wait, in seconds."""
PAUSE_S = 0.002
"""Default pause between two checks, in seconds."""


def _timed_out(what: str, timeout_s: float) -> AssertionError:
    return AssertionError(f"timed out after {timeout_s:g} s waiting until {what}")


async def until(
    check: Callable[[], object],
    what: str,
    timeout_s: float = DEADLINE_S,
    *,
    pause_s: float = PAUSE_S,
) -> Any:
    """Re-check ``check()`` (awaiting what it returns, if awaitable) every
    ``pause_s`` seconds until it is truthy, and return that value.

    Raises:
        AssertionError: after ``timeout_s`` seconds (default 20), naming ``what``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout_s)
        await asyncio.sleep(pause_s)


def until_sync(
    check: Callable[[], object],
    what: str,
    timeout_s: float = DEADLINE_S,
    *,
    pause_s: float = PAUSE_S,
) -> Any:
    """``until`` for code without an event loop: blocks between the checks.

    Raises:
        AssertionError: after ``timeout_s`` seconds (default 20), naming ``what``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout_s)
        time.sleep(pause_s)
