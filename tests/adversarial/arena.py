"""The in-process arena of the adversarial scenarios: several contenders (each its
own client and waiting session) of one lock in this process, writing to the
run's shared record, where faults can be placed at exact stages; and a
contender on an event loop of its own, which a scenario can block."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from redis.asyncio import Redis

from redis_fifo_lock import FifoLock
from tests.adversarial.actors import Actor, Plan, recorded
from tests.adversarial.clients import StagedRedis, make_client
from tests.adversarial.mutants import variant
from tests.adversarial.registry import LEASE_MS, POLL_MS, Context, T
from tests.support.polling import until
from tests.support.record import Record, read_lines


class Arena:
    """Several contenders of one lock in this process, each on its own client (so
    each is its own waiting session), writing to the run's shared record.

    Args:
        ctx: the scenario's context (variant, duplicate execution, record dir).
        url: the server.
        name: the lock name.
        settings: ``lease_ms``, ``poll_ms``, ``max_hold_ms``.
    """

    def __init__(self, ctx: Context, url: str, name: str, **settings: int) -> None:
        self.ctx = ctx
        self.url = url
        self.name = name
        self.settings = {"lease_ms": LEASE_MS, "poll_ms": POLL_MS, **settings}
        self.record = Record(ctx.run_dir / f"{name}.rec")
        self.faults = Record(ctx.run_dir / "faults.rec")
        self.admin = Redis.from_url(url)
        self.clients: list[Redis] = [self.admin]
        self.keys = FifoLock(self.admin, name).keys

    def client(self, who: str, *, retries: bool = True) -> StagedRedis:
        """A new client (a new session) for contender ``who``."""
        client = make_client(
            self.url, dup_exec=self.ctx.dup_exec, name=f"adv-{who}", retries=retries
        )
        self.clients.append(client)
        return client

    def lock(self, client: Redis) -> FifoLock:
        """The variant under attack, on ``client``, recording its acquire replies."""
        lock = variant(self.ctx.mutant).lock(client, self.name, **self.settings)
        return recorded(lock, self.record, self.faults)

    def contender(self, who: str, *, retries: bool = True) -> tuple[FifoLock, Actor]:
        """A lock on a client of its own, and an actor recording as ``who``."""
        return self.lock(self.client(who, retries=retries)), Actor(self.record, who)

    async def enter(self, who: str) -> tuple[FifoLock, Actor, Any]:
        """A contender that acquires now and is inside when this returns."""
        lock, actor = self.contender(who)
        token = f"{who}-{self.ctx.rng.getrandbits(20):05x}"
        lease = await actor.acquire(lock, token, Plan(0, timeout_s=5))
        assert lease is not None, f"{who} could not enter {self.name!r}"
        return lock, actor, lease

    async def leave(self, lock: FifoLock, actor: Actor, lease: Any) -> str:
        """Record the exit and release."""
        actor.record.exit(lease)
        return await actor.release(lock, lease, Plan(0))

    def queued(self, token: str) -> bool:
        """Whether the record shows ``token``'s acquire reply."""
        return any(
            line.kind == "queued" and line.fields[0] == token
            for line in read_lines(self.record.path)
        )

    def entered(self, token: str) -> int | None:
        """When ``token`` entered, from the record (None if it has not)."""
        return next(
            (
                line.ns
                for line in read_lines(self.record.path)
                if line.kind == "enter" and line.fields[0] == token
            ),
            None,
        )

    async def until(self, check: Callable[[], Any], what: str, timeout_s: float = 10) -> Any:
        """Re-check ``check`` (record or Redis state) until truthy; AssertionError after
        ``timeout_s`` seconds. There is no event for state another session made."""
        return await until(check, what, timeout_s)

    async def in_queue(self, token: str) -> bool:
        """Whether Redis has ``token`` queued (read only to synchronise the test)."""
        return await self.admin.zscore(self.keys.key("queue"), token) is not None

    def waiter(self, who: str, plan: Plan) -> tuple[asyncio.Task[Any], str]:
        """Start a contender's request in a task; returns (task, token)."""
        lock, actor = self.contender(who)
        token = f"{who}-{self.ctx.rng.getrandbits(20):05x}"
        return asyncio.create_task(actor.attempt(lock, token, plan)), token

    async def served(self, task: asyncio.Task[Any], token: str, bound_s: float) -> list[str]:
        """Wait for ``task``'s request; a problem if it did not enter within ``bound_s``."""
        done, _ = await asyncio.wait({task}, timeout=bound_s)
        if not done and self.entered(token) is None:
            problem = f"{token} was not granted within {bound_s:g} s: the lock stalled"
            await asyncio.wait({task}, timeout=self.settings["lease_ms"] / 1000 * 3)
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            return [problem]
        await asyncio.gather(task, return_exceptions=True)
        if self.entered(token) is None:
            return [f"{token} ended without being granted"]
        return []

    async def consistent(self) -> list[str]:
        """A plain acquire and release work at once and leave nothing behind."""
        lock, actor = self.contender("probe")
        token = f"probe-{self.ctx.rng.getrandbits(20):05x}"
        started = time.monotonic()
        lease = await actor.attempt(
            lock, token, Plan(0, timeout_s=self.settings["lease_ms"] / 1000 * 2)
        )
        problems = []
        if lease is None:
            problems.append("the next normal acquire failed: the lock was left inconsistent")
        elif time.monotonic() - started > self.settings["lease_ms"] / 1000 + 0.5:
            problems.append(f"the next normal acquire took {time.monotonic() - started:.2f} s")
        status = await lock.status()
        if status.held or status.waiting:
            problems.append(f"left behind: {status}")
        return problems

    async def load_scripts(self) -> None:
        """Load the variant's scripts, so no first call of a stage meets NOSCRIPT."""
        for script in variant(self.ctx.mutant).protocol().scripts.values():
            await self.admin.script_load(script.source)

    async def close(self) -> None:
        """Close every client of the arena."""
        for client in self.clients:
            await client.aclose()


async def cancel_and_record(arena: Arena, task: asyncio.Task[Any], token: str) -> list[str]:
    """Cancel the acquire ``task`` of ``token``; record it; problems if it did not end so.

    An acquire that had already returned when the cancellation came (the stage
    missed its moment, as when every call runs twice) is recorded as a normal
    hold, not blamed on the lock.
    """
    finished = task.done()
    arena.record.cancel(token)
    task.cancel()
    try:
        lease = await task
    except asyncio.CancelledError:
        arena.record.gave_up(token, "cancelled")
        return []
    except Exception as exc:  # any other ending is the finding
        arena.record.gave_up(token, f"error:{type(exc).__name__}")
        return [f"cancelling {token} raised {exc!r} instead of CancelledError"]
    arena.record.enter(lease, "late")
    arena.record.exit(lease)
    await arena.lock(arena.admin).release(lease)
    arena.record.released(lease, "ok")
    if finished:
        return []
    return [f"{token}: the acquire returned a lease although it was cancelled before returning"]


class LoopThread:
    """An event loop of its own, in a thread: a contender whose loop the test can
    block (``time.sleep`` inside the loop) while the rest of the scenario runs."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
        """Run ``coro`` on the thread's loop; the result is awaitable from the caller's."""
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def block(self, seconds: float) -> threading.Event:
        """Block the thread's loop for ``seconds``; the event is set when it starts."""
        started = threading.Event()

        def blocker() -> None:
            started.set()
            time.sleep(seconds)  # the fault: the loop runs nothing meanwhile

        self.loop.call_soon_threadsafe(blocker)
        return started

    async def close(self) -> None:
        """Cancel what still runs on the thread's loop, stop it and join the thread."""

        async def cancel_all() -> None:
            current = asyncio.current_task()
            left = [task for task in asyncio.all_tasks() if task is not current]
            for task in left:
                task.cancel()
            await asyncio.gather(*left, return_exceptions=True)

        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.run(cancel_all()), 5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.get_running_loop().run_in_executor(None, self.thread.join, 5)
        if not self.thread.is_alive():
            self.loop.close()


class NotStaged(Exception):
    """A case's schedule did not come about (a race the lock is free to win); run it again."""


async def in_fresh_arena(
    arena: Arena, case: Callable[[Arena], Awaitable[list[str]]], *, load_scripts: bool = True
) -> list[str]:
    """Run ``case`` in a new ``arena`` (its scripts loaded first unless
    ``load_scripts`` is false), then check the arena's end state, and close it.

    Returns:
        The case's findings and the end-state check's, in that order.
    """
    try:
        if load_scripts:
            await arena.load_scripts()
        found = await case(arena)
        found += await arena.consistent()
    finally:
        await arena.close()
    return found
