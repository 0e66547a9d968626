"""``fork()`` while other threads use the lock: the child never inherits a
module guard taken by a thread that does not exist in it."""

from __future__ import annotations

import importlib
import threading

import pytest

from tests.support.forking import RETURNED, in_child, needs_fork

GUARDS = [
    ("redis_fifo_lock.calls", "_call_ids"),
    ("redis_fifo_lock.doorbell", "_refusals_guard"),
    ("redis_fifo_lock.eviction", "_guard"),
    ("redis_fifo_lock.loops", "_guard"),
    ("redis_fifo_lock.metrics", "_instruments_lock"),
    ("redis_fifo_lock.metrics", "_known_lock"),
    ("redis_fifo_lock.portal", "_portal_guard"),
    ("redis_fifo_lock.server", "_guard"),
]
"""Every process-wide guard of the package (for ``calls``, its ``CallIds``)."""


def _guard(module: str, name: str) -> threading.Lock:
    value = getattr(importlib.import_module(module), name)
    return value._guard if name == "_call_ids" else value  # type: ignore[no-any-return]


@needs_fork
@pytest.mark.parametrize(("module", "name"), GUARDS)
def test_a_guard_held_by_another_thread_at_fork_is_free_in_the_child(
    module: str, name: str
) -> None:
    """Another thread is inside (eviction check, metrics registration, ...) at the
    moment of the fork: the child, where that thread does not exist, must not
    wait for it for ever."""
    inside, leave = threading.Event(), threading.Event()

    def other_thread() -> None:
        with _guard(module, name):
            inside.set()
            leave.wait()

    thread = threading.Thread(target=other_thread)
    thread.start()
    inside.wait()
    try:

        def take_it() -> None:
            if not _guard(module, name).acquire(timeout=2):
                raise AssertionError(f"{module}.{name} is still taken in the child")

        assert in_child(take_it, AssertionError) == RETURNED
    finally:
        leave.set()
        thread.join()
