"""Many event loops in one process: threads that each run their own loop (as
``async_to_sync`` and threaded servers make), and loops that shut down while the
lock still has work on them (``asyncio.run`` returning with a waiter queued)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from redis.asyncio import Redis

from redis_fifo_lock import FifoLock, Lease, LeaseLost, LoopClients
from redis_fifo_lock.waiting import hub_for
from tests.adversarial.actors import Actor, Plan
from tests.adversarial.arena import Arena
from tests.adversarial.registry import Context, Outcome, outcome, scenario
from tests.support.damage import garble_floors
from tests.support.polling import until
from tests.support.record import read_lines

THREADS, ROUNDS = 6, 80
"""Threads of the threaded-loops scenario, and requests each makes in turn."""

SWITCH_S = 1e-5
"""The interpreter's thread switch interval during the threaded-loops scenario
(5 ms by default): threads interleave between almost any two steps."""


@contextmanager
def switching_threads_often() -> Iterator[None]:
    """Make the interpreter switch threads every ``SWITCH_S`` while the block runs."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_S)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


@scenario(
    "threaded-loops",
    kills=("call-id-entered-late",),
    faults="six threads of one process, each with an event loop of its own, contend "
    "for one lock while the interpreter switches threads every 10 us",
)
async def threaded_loops(ctx: Context) -> Outcome:
    """The process's call ids are shared by every loop: each acquire is served,
    one holder at a time, in queue order, and none is refused as a late copy of
    itself (a floor sent by another thread must never pass a call not yet sent)."""
    server = ctx.servers()
    arena = Arena(ctx, server.url, "threads")
    clients = LoopClients(server.url)

    def contender(n: int) -> None:
        async def requests() -> None:
            lock, actor = arena.lock(clients), Actor(arena.record, f"t{n}")  # type: ignore[arg-type]
            for r in range(ROUNDS):
                await actor.attempt(lock, f"t{n}.{r}", Plan(0.0, timeout_s=30))

        asyncio.run(requests())

    loop = asyncio.get_running_loop()
    try:
        with switching_threads_often(), ThreadPoolExecutor(THREADS) as pool:
            runs = [loop.run_in_executor(pool, contender, n) for n in range(THREADS)]
            await asyncio.gather(*runs)
    finally:
        await arena.close()
    refused = [
        f"request {line.fields[0]} ended without the lock: {line.fields[1]}"
        for line in read_lines(arena.record.path)
        if line.kind == "gaveup"
    ]
    return outcome(ctx, "threaded-loops", refused)


class _DestroyedTasks(logging.Handler):
    """Collects asyncio's reports of tasks destroyed while pending."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.reports: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "was destroyed but it is pending" in message:
            self.reports.append(message.splitlines()[-1][:200])


SHUTDOWN_LEASE_MS, SHUTDOWN_POLL_MS = 10_000, 5_000
"""Timing of the loop-shutdown scenario: a lease, or a poll, that nobody waits for."""


@scenario(
    "loop-shutdown",
    kills=("hub-outlives-loop", "owed-dropped-at-close"),
    faults="asyncio.run returns right after cancelling a task inside hold() and a "
    "queued waiter (the shutdown cancels them again, with what their cancellation "
    "started), and with a task that subscribes the doorbell on its way out",
)
async def loop_shutdown(ctx: Context) -> Outcome:
    """What a loop's shutdown cancels ends with the loop, and what the lock owes
    Redis is done first: the hold's lease is released and the waiter withdrawn
    (the next waiter, in another loop, is served within 2 s, not after the
    10 s lease), no task of the lock is destroyed pending, and no doorbell
    stays subscribed on the client the caller keeps open."""
    server = ctx.servers()
    arena = Arena(ctx, server.url, "shutdown", lease_ms=SHUTDOWN_LEASE_MS, poll_ms=SHUTDOWN_POLL_MS)
    problems: list[str] = []
    destroyed = _DestroyedTasks()
    logging.getLogger("asyncio").addHandler(destroyed)
    channel = arena.keys.doorbell_of("shutdown")
    kept: list[Redis] = []
    started: list[asyncio.Task[object]] = []
    leases: list[Lease] = []
    next_token: list[str] = []

    def short_lived_loop() -> None:
        async def main() -> None:
            client = Redis.from_url(server.url)  # the caller's: it outlives the loop
            kept.append(client)
            lock = arena.lock(client)
            hub = hub_for(client)
            inside = asyncio.Event()

            async def holds() -> None:
                arena.record.request("doomed-h", 5, "doomed")
                async with lock.hold(timeout=5, token="doomed-h") as lease:
                    leases.append(lease)
                    arena.record.enter(lease, "doomed")
                    inside.set()
                    try:
                        await asyncio.Event().wait()
                    finally:
                        arena.record.exit(lease)

            async def subscribes_when_cancelled() -> None:
                # As CI saw: a doorbell watch confirmed as the shutdown's
                # cancellation came goes on to start the reader.
                try:
                    await asyncio.Event().wait()
                finally:
                    await hub.doorbell.watch(channel, lambda token, grant: None)

            holder = asyncio.create_task(holds())
            await inside.wait()
            waiter = asyncio.create_task(
                Actor(arena.record, "doomed").attempt(lock, "doomed-w", Plan(0.0, timeout_s=30))
            )
            await until(lambda: next_token and arena.queued(next_token[0]), "next queued")
            started.extend([holder, waiter, asyncio.create_task(subscribes_when_cancelled())])
            holder.cancel()
            arena.record.cancel("doomed-w")
            waiter.cancel()  # and both again by the shutdown, right after this returns
            arena.record.gave_up("doomed-w", "cancelled")

        asyncio.run(main())
        if leases:
            arena.record.released(leases[0], "ok")  # its release ran as the loop closed
        started.clear()
        gc.collect()  # a task left pending is reported as it is destroyed

    try:
        closing = asyncio.get_running_loop().run_in_executor(None, short_lived_loop)
        await arena.until(lambda: arena.queued("doomed-w"), "the doomed waiter queued")
        task, token = arena.waiter("next", Plan(0.0, timeout_s=20))
        next_token.append(token)
        await closing
        problems += await arena.served(task, token, 2.0)
        subscribed = dict(await arena.admin.pubsub_numsub(channel)).get(channel.encode(), 0)
        if subscribed:
            problems.append(f"a doorbell subscription outlived its loop ({subscribed} left)")
        if await arena.in_queue("doomed-w"):
            problems.append("the waiter cancelled by its loop's shutdown is still queued")
    finally:
        logging.getLogger("asyncio").removeHandler(destroyed)
        await arena.close()
        kept.clear()  # its loop is gone: its connections go with the garbage
        gc.collect()
    problems += [f"destroyed pending at the loop's close: {r}" for r in destroyed.reports]
    return outcome(ctx, "loop-shutdown", problems)


FAST_ROUNDS, FAST_LEASES = 48, 20
"""Rounds of the fast-renewals-at-shutdown scenario, and leases held in each
(the real lock closes a round in about 0.15 s; the mutant hangs one)."""


@scenario(
    "fast-renewals-at-shutdown",
    kills=("cancel-swallowed",),
    faults="asyncio.run returns while 20 leases renew every 20 ms, so that the "
    "shutdown's cancellation meets renewals on their way, round after round",
)
async def fast_renewals_at_shutdown(ctx: Context) -> Outcome:
    """Each loop closes (its leases' renewals go to the portal loop) within 10 s,
    however its renewals met the shutdown's cancellation; every lease is then
    released from another loop."""
    server = ctx.servers()
    clients = LoopClients(server.url)
    problems: list[str] = []
    for round_ in range(FAST_ROUNDS):
        arenas = [
            Arena(ctx, server.url, f"fast-{round_}-{k}", lease_ms=60, poll_ms=30)
            for k in range(FAST_LEASES)
        ]
        locks = [arena.lock(clients) for arena in arenas]  # type: ignore[arg-type]
        leases: list[Lease] = []

        renewing_s = ctx.rng.uniform(0.02, 0.06)  # each round meets the renewals elsewhere

        def holds(
            locks: list[FifoLock] = locks,
            leases: list[Lease] = leases,
            renewing_s: float = renewing_s,
        ) -> None:
            async def main() -> None:
                leases.extend([await lock.acquire(timeout=5) for lock in locks])
                await asyncio.sleep(renewing_s)  # a moment of renewals, not a synchronisation

            asyncio.run(main())

        closing = threading.Thread(target=holds, daemon=True)
        closing.start()
        await asyncio.get_running_loop().run_in_executor(None, closing.join, 10)
        for arena in arenas:
            await arena.close()
        if closing.is_alive():
            problems.append(f"round {round_}: asyncio.run did not return in 10 s")
            break
        for lock, lease in zip(locks, leases, strict=True):
            with contextlib.suppress(LeaseLost):
                await lock.release(lease)
    return outcome(ctx, "fast-renewals-at-shutdown", problems)


CLOSING_ROUNDS = 8
"""Rounds of the withdrawer-at-shutdown scenario: each closes its loop one more
loop step after a new withdrawal woke the withdrawer (0 to 3, twice)."""


@scenario(
    "withdrawer-at-shutdown",
    kills=("withdrawer-wait-for",),
    faults="asyncio.run returns 0-3 loop steps after a cancelled waiter's withdrawal "
    "woke the withdrawer, while another lock's withdrawal keeps failing (its floor "
    "entry garbled)",
)
async def withdrawer_at_shutdown(ctx: Context) -> Outcome:
    """Each loop closes within 10 s (its withdrawer ends on the shutdown's
    cancellation, however the wake-up met it), and its leases are then
    released from another loop."""
    server = ctx.servers()
    problems: list[str] = []
    for round_ in range(CLOSING_ROUNDS):
        arena = Arena(ctx, server.url, f"closing-{round_}", lease_ms=10_000, poll_ms=5_000)
        neighbour = f"{arena.name}-neighbour"
        owners = [FifoLock(arena.admin, name, **arena.settings) for name in (neighbour, arena.name)]
        finished = owners[0].keys.key("finished")
        leases: list[Lease] = []

        def closes(
            arena: Arena = arena,
            leases: list[Lease] = leases,
            steps: int = round_ % 4,
            neighbour: str = neighbour,
        ) -> None:
            async def main() -> None:
                client = Redis.from_url(server.url)
                lock, failing = arena.lock(client), FifoLock(client, neighbour, **arena.settings)
                leases.extend([await failing.acquire(timeout=5), await lock.acquire(timeout=5)])
                doomed = asyncio.create_task(failing.acquire(token="doomed"))
                await until(lambda: _queued(client, failing, "doomed"), "doomed queued")
                await garble_floors(client, failing.keys)
                doomed.cancel()
                await asyncio.gather(doomed, return_exceptions=True)
                hub = hub_for(client)
                await until(
                    lambda: any(owed.failures for owed in hub._withdrawals.values()),
                    "the neighbour's withdrawal failed",
                )
                waiting = asyncio.create_task(lock.acquire(token="waiting"))
                await until(lambda: _queued(client, lock, "waiting"), "waiting queued")
                waiting.cancel()
                while not hub._owed_anew.is_set():  # noqa: ASYNC110 - steps count from the set
                    await asyncio.sleep(0)
                for _ in range(steps):
                    await asyncio.sleep(0)

            asyncio.run(main())

        closing = threading.Thread(target=closes, daemon=True)  # left behind if it hangs
        closing.start()
        await asyncio.get_running_loop().run_in_executor(None, closing.join, 10)
        await arena.admin.delete(finished)  # the neighbour's scripts work again
        if closing.is_alive():
            problems.append(f"round {round_}: asyncio.run did not return in 10 s")
            await arena.close()
            break
        for owner, lease in zip(owners, leases, strict=True):
            with contextlib.suppress(LeaseLost):
                await owner.release(lease)
        await arena.close()
    return outcome(ctx, "withdrawer-at-shutdown", problems)


async def _queued(admin: Redis, lock: FifoLock, token: str) -> bool:
    """Whether ``token`` is in ``lock``'s queue (read through ``admin``)."""
    return await admin.zscore(lock.keys.key("queue"), token) is not None
