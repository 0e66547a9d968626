"""Cancelling a waiter at the moment a release of its own process hands it the lock.

A release that hands the lock to a waiter of its own process lets that waiter
run before it returns (``FifoLock.release``): a test that wants the waiter
cancelled after the grant and before the waiter's task ran cancels it from the
hand-over itself.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from redis_fifo_lock.waiting import Hub


def cancel_when_handed_over(monkeypatch: pytest.MonkeyPatch, waiter: asyncio.Task[Any]) -> None:
    """From now on, every hand-over within a process cancels ``waiter`` right after
    it woke the next holder, before that holder's task runs."""
    handed_over = Hub.hand_over

    def hand_over_then_cancel(hub: Hub, *args: Any) -> None:
        handed_over(hub, *args)
        waiter.cancel()

    monkeypatch.setattr(Hub, "hand_over", hand_over_then_cancel)
