"""``fork()`` while other threads use the lock: the child never inherits a
module guard taken by a thread that does not exist in it."""

from __future__ import annotations

import importlib
import signal
import threading
from collections.abc import Callable
from typing import Any

import pytest

from redis_fifo_lock.protocol import LockKeys
from redis_fifo_lock.settings import LockSettings
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
    ("redis_fifo_lock.tokens", "_guard"),
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


def _stuck_keys() -> Callable[[], object]:
    keys = LockKeys("stuck")
    return lambda: keys.all


def _stuck_settings() -> Callable[[], object]:
    settings = LockSettings(lease_ms=7777, poll_ms=1000)  # built here: not blocked
    return lambda: hash(settings)


@needs_fork
@pytest.mark.parametrize(
    ("blocked", "stuck", "take_fresh"),
    [
        (
            (LockKeys, "key", lambda self: self.name == "stuck"),
            _stuck_keys,
            lambda: LockKeys("jobs").all,
        ),
        (
            (LockSettings, "_values", lambda self: self.lease_ms == 7777),
            _stuck_settings,
            lambda: hash(LockSettings(lease_ms=9000, poll_ms=1000)),
        ),
    ],
    ids=["LockKeys.all", "hash(LockSettings)"],
)
def test_a_value_another_thread_was_caching_at_fork_is_worked_out_in_the_child(
    monkeypatch: pytest.MonkeyPatch,
    blocked: tuple[type, str, Callable[[Any], bool]],
    stuck: Callable[[], Callable[[], object]],
    take_fresh: Callable[[], object],
) -> None:
    """Another thread is working out a cached value (the portal hashing new
    settings, say) at the moment of the fork. On Python 3.10 and 3.11
    ``functools.cached_property`` did that under one lock per class, which the
    child inherited taken: its first use of the property on any other object
    hung for good (an outside attack: 90 children of 300)."""
    cls, method, blocks = blocked
    original = getattr(cls, method)
    inside, leave = threading.Event(), threading.Event()

    def slow(self: Any, *args: Any) -> Any:
        if blocks(self) and threading.current_thread() is not threading.main_thread():
            inside.set()
            leave.wait()
        return original(self, *args)

    monkeypatch.setattr(cls, method, slow)
    thread = threading.Thread(target=stuck())
    thread.start()
    inside.wait()
    try:

        def take_it() -> None:
            # A hang ends the child (SIGALRM's default), and its exit code says so.
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(5)
            take_fresh()

        code = in_child(take_it, AssertionError)
    finally:
        leave.set()
        thread.join()
    assert code == RETURNED, f"the child's first use of the value hung (exit code {code})"
