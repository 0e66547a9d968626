"""Waiting for state that lives in another process or in Redis.

There is no event to await for "Redis has queued that request" or "another
process wrote its entry"; these helpers re-check a condition until it holds
or a generous deadline passes, and fail loudly then.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

DEADLINE_S = 20.0


async def until(
    check: Callable[[], Awaitable[object]], what: str, timeout_s: float = DEADLINE_S
) -> None:
    """Return once ``await check()`` is truthy; raise AssertionError naming
    ``what`` after ``timeout_s`` seconds (default 20)."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting until {what}")
        await asyncio.sleep(0.002)


def until_sync(check: Callable[[], object], what: str, timeout_s: float = DEADLINE_S) -> None:
    """Return once ``check()`` is truthy; raise AssertionError naming ``what``
    after ``timeout_s`` seconds (default 20)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting until {what}")
        time.sleep(0.002)
