"""How every adversarial contender behaves and writes the shared record.

``Actor.attempt`` is one request from start to end: record the request, acquire
(perhaps with a timeout, perhaps cancelled at a random moment), record the entry,
hold for the planned time unless the lease is lost first, record the exit,
release, record how the release ended, and perhaps repeat the release. The same
code runs inside contender processes and in-process scenarios, so every
scenario is checked from the same kind of record.

``RecordingProtocol`` wraps a lock's ``Protocol`` and records each reply of the
acquire script (the request's ticket), which the lock does not expose.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from redis.exceptions import OutOfMemoryError, ResponseError

from redis_fifo_lock import FifoLock, Lease, LeaseLost, LockError, LockTimeout, RedisUnavailable
from redis_fifo_lock.protocol import Grant, Protocol
from tests.support.record import Record

T = TypeVar("T")

RETRY_PAUSE_S = 0.2
"""Back-off between retries of a call that found Redis unavailable, in seconds."""


REPEAT_TRIES = 5
"""How often a repeated release is sent while Redis cannot be reached."""


def protocol_arguments(
    method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """The arguments of a call of ``method`` (a ``Protocol`` method, e.g.
    ``Protocol.release``) by name, defaults filled in: a wrapper reads the few it
    needs without spelling out the whole signature (the core's to change)."""
    bound = inspect.signature(method).bind(None, *args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


def _guarded(script: str) -> Callable[..., Awaitable[Any]]:
    """A ``RecordingProtocol`` method that delegates ``script``'s call to ``inner``."""

    async def call(self: RecordingProtocol, *args: Any, **kwargs: Any) -> Any:
        return await self._guard(script, getattr(self.inner, script)(*args, **kwargs))

    call.__name__ = script
    return call


class RecordingProtocol(Protocol):
    """Delegates to ``inner``; records every reply of the acquire script, and every
    script error (a Lua error, which no input may ever cause) of any script."""

    def __init__(self, inner: Protocol, record: Record, faults: Record) -> None:
        # No super().__init__(): the scripts are ``inner``'s, already loaded.
        self.inner = inner
        self.record = record
        self.faults = faults
        self.scripts = inner.scripts

    async def _guard(self, script: str, call: Awaitable[T]) -> T:
        try:
            return await call
        except RedisUnavailable as exc:
            if is_script_error(exc.cause):
                self.faults.fault("scripterror", f"{script}:{exc.cause}")
            raise

    async def acquire(self, *args: Any, **kwargs: Any) -> tuple[Grant | None, int, int, int]:
        grant, ticket, holder, pttl_ms = await self._guard(
            "acquire", self.inner.acquire(*args, **kwargs)
        )
        token = protocol_arguments(Protocol.acquire, args, kwargs)["token"]
        self.record.queued(token, ticket, grant is not None)
        return grant, ticket, holder, pttl_ms

    claim = _guarded("claim")
    release = _guarded("release")
    renew = _guarded("renew")
    withdraw = _guarded("withdraw")
    poll = _guarded("poll")
    status = _guarded("status")


def is_script_error(cause: BaseException | None) -> bool:
    """Whether ``cause`` is a Lua error raised inside a script (not OOM, not NOSCRIPT)."""
    if not isinstance(cause, ResponseError) or isinstance(cause, OutOfMemoryError):
        return False
    text = str(cause).lower()
    return "script" in text or "lua" in text


def recorded(lock: FifoLock, record: Record, faults: Record) -> FifoLock:
    """Make ``lock`` record its acquire replies in ``record`` and script errors in
    ``faults``; returns ``lock``."""
    lock._protocol = RecordingProtocol(lock._protocol, record, faults)
    return lock


@dataclass(frozen=True)
class Plan:
    """What one request does.

    Attributes:
        hold_s: seconds to stay inside unless the lease is lost first.
        timeout_s: ``acquire`` timeout in seconds (None: wait forever).
        cancel_after_s: cancel the acquire after this many seconds if it has
            not returned by then (None: never).
        repeat_release: release again, locally and as a duplicate sent to Redis.
        use_hold: go through ``lock.hold()`` instead of acquire/release.
        retry_s: keep retrying with the same token this long after
            ``RedisUnavailable`` (from acquire or release).
    """

    hold_s: float
    timeout_s: float | None = None
    cancel_after_s: float | None = None
    repeat_release: bool = False
    use_hold: bool = False
    retry_s: float = 0.0


def _cause(exc: RedisUnavailable) -> str:
    return f"unavailable:{type(exc.cause).__name__}"


def cancelling(task: asyncio.Task[Any]) -> int:
    """``task.cancelling()`` (Python 3.11+; the suite is skipped on older Pythons)."""
    if sys.version_info >= (3, 11):
        return task.cancelling()
    return 0  # pragma: no cover


def _being_cancelled() -> bool:
    """True when the running task itself was cancelled (not just a task it awaited)."""
    task = asyncio.current_task()
    return task is not None and cancelling(task) > 0


class Actor:
    """Runs requests against locks and records everything they do.

    Args:
        record: the record of the lock the requests go to.
        who: a short label for the record's ``enter`` lines (no spaces).
    """

    def __init__(self, record: Record, who: str) -> None:
        self.record = record
        self.who = who
        self._watchers: dict[str, asyncio.Task[None]] = {}

    async def attempt(self, lock: FifoLock, token: str, plan: Plan) -> Lease | None:
        """One request from start to end; returns the lease if it was held."""
        if plan.use_hold and plan.cancel_after_s is None:
            return await self._attempt_with_hold(lock, token, plan)
        lease = await self.acquire(lock, token, plan)
        if lease is None:
            return None
        await self.hold(lease, plan.hold_s)
        await self.release(lock, lease, plan)
        return lease

    async def acquire(self, lock: FifoLock, token: str, plan: Plan) -> Lease | None:
        """Acquire as planned and record the entry; None if it gave up."""
        loop = asyncio.get_running_loop()
        retry_until = loop.time() + plan.retry_s
        while True:
            self.record.request(token, plan.timeout_s, self.who)
            call = asyncio.create_task(lock.acquire(plan.timeout_s, token=token))
            if plan.cancel_after_s is not None:
                done, _ = await asyncio.wait({call}, timeout=plan.cancel_after_s)
                if not done:
                    self.record.cancel(token)
                    call.cancel()
            try:
                lease = await call
            except asyncio.CancelledError:
                if _being_cancelled():
                    raise
                self.record.gave_up(token, "cancelled")
                return None
            except LockTimeout:
                self.record.gave_up(token, "timeout")
                return None
            except RedisUnavailable as exc:
                self.record.gave_up(token, _cause(exc))
                if loop.time() >= retry_until:
                    return None
                await asyncio.sleep(RETRY_PAUSE_S)  # back-off before the same-token retry
                continue
            except LockError as exc:
                self.record.gave_up(token, f"error:{type(exc).__name__}")
                return None
            self.entered(lease)
            return lease

    def entered(self, lease: Lease) -> None:
        """Record the entry and start noting the moment the lease is seen lost."""
        self.record.enter(lease, self.who)
        self._watchers[lease.token] = asyncio.create_task(self._note_lost(lease))

    async def _note_lost(self, lease: Lease) -> None:
        await lease.wait_lost()
        self.record.lost(lease)

    async def hold(self, lease: Lease, hold_s: float) -> None:
        """Stay inside for ``hold_s`` seconds, or until the lease is lost; record the exit."""
        watcher = self._watchers[lease.token]
        try:
            # The hold itself: the planned time inside, cut short by a lost lease.
            await asyncio.wait({watcher}, timeout=hold_s)
        finally:
            # A hold that ends as the lease runs out (both due when a frozen
            # process resumes) reads ``lease.lost`` before it leaves, as a
            # careful holder does; the watcher may run only after the exit.
            if lease.lost and not watcher.done():
                self.record.lost(lease)
            self.record.exit(lease)

    async def release(self, lock: FifoLock, lease: Lease, plan: Plan) -> str:
        """Release (retrying on ``RedisUnavailable`` for ``plan.retry_s``); record the outcome."""
        loop = asyncio.get_running_loop()
        retry_until = loop.time() + plan.retry_s
        while True:
            try:
                await lock.release(lease)
                outcome = "ok"
            except LeaseLost:
                outcome = "leaselost"
            except RedisUnavailable as exc:
                outcome = _cause(exc)
                if loop.time() < retry_until:
                    await asyncio.sleep(RETRY_PAUSE_S)  # back-off before retrying the release
                    continue
            except LockError as exc:
                outcome = f"error:{type(exc).__name__}"
            break
        self.left(lease, outcome)
        if plan.repeat_release and outcome in ("ok", "leaselost"):
            await self.repeat_release(lock, lease)
        return outcome

    def left(self, lease: Lease, outcome: str) -> None:
        """Record how the release ended (a loss it revealed first) and stop watching."""
        watcher = self._watchers.pop(lease.token, None)
        if lease.lost and watcher is not None and not watcher.done():
            self.record.lost(lease)  # release marked it lost; the watcher has not run yet
        if watcher is not None:
            watcher.cancel()
        self.record.released(lease, outcome)

    async def repeat_release(self, lock: FifoLock, lease: Lease) -> None:
        """Release again locally (a no-op), then send the same release to Redis again."""
        await lock.release(lease)
        twin = Lease(lease.name, lease.token, lease.fence, lease.ticket, call=lease.call)
        for attempt in range(REPEAT_TRIES):
            try:
                await lock.release(twin)
                outcome = "dup-ok"
            except LeaseLost:
                outcome = "dup-leaselost"
            except RedisUnavailable as exc:
                outcome = f"dup-error:{type(exc).__name__}"
                if attempt + 1 < REPEAT_TRIES:
                    await asyncio.sleep(RETRY_PAUSE_S)  # an outage is not the lock's answer
                    continue
            except LockError as exc:
                outcome = f"dup-error:{type(exc).__name__}"
            break
        self.record.released(twin, outcome)

    async def _attempt_with_hold(self, lock: FifoLock, token: str, plan: Plan) -> Lease | None:
        entered: Lease | None = None
        self.record.request(token, plan.timeout_s, self.who)
        try:
            async with lock.hold(plan.timeout_s, token=token) as lease:
                entered = lease
                self.entered(lease)
                await self.hold(lease, plan.hold_s)
            outcome = "ok"
        except LockTimeout:
            self.record.gave_up(token, "timeout")
            return None
        except LeaseLost:
            outcome = "leaselost"
        except RedisUnavailable as exc:
            if entered is None:
                self.record.gave_up(token, _cause(exc))
                return None
            outcome = _cause(exc)
        except LockError as exc:
            if entered is None:
                self.record.gave_up(token, f"error:{type(exc).__name__}")
                return None
            outcome = f"error:{type(exc).__name__}"
        assert entered is not None
        self.left(entered, outcome)
        return entered


async def watch_lag(faults: Record, threshold_s: float) -> None:
    """Record a ``lag`` fault whenever this event loop was blocked over ``threshold_s``.

    The lock promises exclusion only while the holder's loop runs at least once
    per ``lease_ms``; a loop starved by a loaded machine breaks that premise, and
    the record must say so rather than blame the lock.
    """
    loop = asyncio.get_running_loop()
    step = 0.01
    while True:
        before = loop.time()
        await asyncio.sleep(step)  # the probe interval of the monitor
        lag = loop.time() - before - step
        if lag > threshold_s:
            faults.fault("lag", f"{round(lag * 1000)}ms")


async def hold_and_release(
    actor: Actor,
    lock: FifoLock,
    lease: Any,
    max_ms: float,
    until: Callable[[], Awaitable[Any]] | None = None,
) -> str:
    """Hold until the lease is lost (at most ``max_ms``), then release - after
    ``await until()``, if given; returns the release's outcome."""
    await actor.hold(lease, max_ms / 1000)
    if until is not None:
        with contextlib.suppress(AssertionError):
            await until()  # the release is late on purpose
    return await actor.release(lock, lease, Plan(0, repeat_release=True))
