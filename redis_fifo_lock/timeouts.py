"""Bounded awaits that never lose a cancellation of the caller.

On Python 3.10 and 3.11, ``asyncio.wait_for`` swallows a cancellation of its
caller that arrives as the call it waits for completes (bpo-42130, fixed in
3.12): the caller carries on as if it had never been cancelled. A loop's
shutdown (``asyncio.run``, ``async_to_sync``) cancels each task once and then
waits for it, so a renewal or a waiter that carried on kept the loop from
closing, for ever. ``within`` is how the lock bounds an await; ``cancelling``
tells a task that a cancellation was swallowed further down (redis-py can do
that while it opens a connection).
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Awaitable
from typing import TypeVar

from .alarms import alarms

T = TypeVar("T")


async def within(awaitable: Awaitable[T], timeout_s: float) -> T:
    """Await ``awaitable`` for at most ``timeout_s`` seconds (float).

    Raises:
        asyncio.TimeoutError: the time ran out (``awaitable`` was cancelled).
        asyncio.CancelledError: the caller was cancelled, whenever that came.
    """
    if sys.version_info >= (3, 11):
        # No task of its own: 10,000 waiters starting at once must not flood
        # the loop that renews the leases. Nor a timer of its own: most bounds
        # (every script call's) end long before they run out (see ``alarms``).
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(None) as timeout:
            expire = functools.partial(timeout.reschedule, 0.0)  # expires it at once
            on_loop = alarms(loop)
            on_loop.set(loop, loop.time() + timeout_s, expire)
            try:
                return await awaitable
            finally:
                on_loop.cancel(expire)
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise asyncio.TimeoutError
    return task.result()


def cancelling() -> bool:
    """True if the running task has a cancellation pending, which something it
    awaited may have swallowed (Python 3.11+; on 3.10 there is no way to know,
    and False is returned)."""
    if sys.version_info < (3, 11):
        # Not asyncio's own count there: backports (as pytest-asyncio installs)
        # may give tasks a cancelling() of their own that does not mean this.
        return False
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
