"""Cancellation at every stage of an acquire, in an ``Arena``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from tests.adversarial.actors import Plan
from tests.adversarial.arena import Arena, cancel_and_record, in_fresh_arena
from tests.adversarial.clients import StagedRedis, names
from tests.adversarial.registry import Context, Outcome, outcome, scenario

STAGE_LEASE_MS = 2000
"""Cancellation stages use a long lease, so a stall (a grant left behind) is ~2 s
against a hand-off bound of 1 s: the difference cannot be noise."""
STAGE_BOUND_S = 1.0

Stage = Callable[[Arena], Awaitable[list[str]]]


def hold_at(
    client: StagedRedis, command: str, token: str | None = None
) -> tuple[asyncio.Event, asyncio.Event]:
    """Stop ``client``'s first ``command`` call (naming ``token``, if given) between
    send and reply. Returns (reached, proceed): ``reached`` is set when the call
    was sent; the reply is read once ``proceed`` is set."""
    reached, proceed = asyncio.Event(), asyncio.Event()

    async def hook(conn: Any, name: str, args: tuple[Any, ...]) -> None:
        if name.split(" ")[0] != command or reached.is_set():
            return
        if token is not None and not names(args, token):
            return
        reached.set()
        await proceed.wait()

    client.after_send = hook
    return reached, proceed


async def stage_before_send(arena: Arena) -> list[str]:
    """Cancelled before the acquire task ever ran: nothing reaches Redis."""
    lock_h, actor_h, lease_h = await arena.enter("h")
    victim, _ = arena.contender("v")
    arena.record.request("v", None, "v")
    task = asyncio.create_task(victim.acquire(token="v"))
    problems = await cancel_and_record(arena, task, "v")
    nxt, token = arena.waiter("n", Plan(0.01))
    await arena.until(lambda: arena.queued(token), "n is queued")
    await arena.leave(lock_h, actor_h, lease_h)
    return problems + await arena.served(nxt, token, STAGE_BOUND_S)


async def stage_policy_check(arena: Arena) -> list[str]:
    """Cancelled during the first call a process makes to a server (its check of
    the eviction policy). The arena's server is fresh: nothing checked it yet."""
    client = arena.client("v")
    victim = arena.lock(client)
    reached, proceed = hold_at(client, "CONFIG")
    arena.record.request("v", None, "v")
    task = asyncio.create_task(victim.acquire(token="v"))
    await asyncio.wait_for(reached.wait(), 5)
    cancelled = asyncio.create_task(cancel_and_record(arena, task, "v"))
    await asyncio.sleep(0)  # let the cancellation land while the call is held
    proceed.set()
    problems = await cancelled
    lock_h, actor_h, lease_h = await arena.enter("h")
    nxt, token = arena.waiter("n", Plan(0.01))
    await arena.until(lambda: arena.queued(token), "n is queued")
    await arena.leave(lock_h, actor_h, lease_h)
    return problems + await arena.served(nxt, token, STAGE_BOUND_S)


async def _sent_before_reply(arena: Arena, held: bool) -> list[str]:
    """The acquire script was sent and ran; the caller is cancelled before its reply."""
    holder = await arena.enter("h") if held else None
    client = arena.client("v")
    victim = arena.lock(client)
    reached, proceed = hold_at(client, "EVALSHA", "v")
    arena.record.request("v", None, "v")
    task = asyncio.create_task(victim.acquire(token="v"))
    await asyncio.wait_for(reached.wait(), 5)
    if held:
        await arena.until(lambda: arena.in_queue("v"), "v is queued in Redis")
    else:
        await arena.until(lambda: _held(arena), "v's grant is in Redis")
    nxt, token = arena.waiter("n", Plan(0.01))
    await arena.until(lambda: arena.queued(token), "n is queued")
    cancelled = asyncio.create_task(cancel_and_record(arena, task, "v"))
    await asyncio.sleep(0)  # the cancellation lands while the reply is held back
    proceed.set()
    problems = await cancelled
    if holder is not None:
        await arena.leave(*holder)
    return problems + await arena.served(nxt, token, STAGE_BOUND_S)


async def _held(arena: Arena) -> bool:
    return bool(await arena.admin.exists(arena.keys.key("lease")))


async def stage_sent_queued(arena: Arena) -> list[str]:
    """After the acquire script queued the request, before its reply arrived."""
    return await _sent_before_reply(arena, held=True)


async def stage_sent_granted(arena: Arena) -> list[str]:
    """After the acquire script granted the lock, before its reply arrived."""
    return await _sent_before_reply(arena, held=False)


async def _queued_victim(arena: Arena) -> tuple[Any, asyncio.Task[Any], StagedRedis]:
    """A holder inside, and the victim ``v`` queued and waiting behind it."""
    holder = await arena.enter("h")
    client = arena.client("v")
    victim = arena.lock(client)
    arena.record.request("v", None, "v")
    task = asyncio.create_task(victim.acquire(token="v"))
    await arena.until(lambda: arena.queued("v"), "v is queued")
    return holder, task, client


async def stage_waiting(arena: Arena) -> list[str]:
    """Cancelled while queued and waiting for the grant."""
    holder, task, _ = await _queued_victim(arena)
    nxt, token = arena.waiter("n", Plan(0.01))
    await arena.until(lambda: arena.queued(token), "n is queued")
    problems = await cancel_and_record(arena, task, "v")
    await arena.leave(*holder)
    return problems + await arena.served(nxt, token, STAGE_BOUND_S)


async def stage_grant_landed(arena: Arena) -> list[str]:
    """The grant landed in Redis, and the waiter is cancelled before it noticed."""
    (lock_h, actor_h, lease_h), task, _ = await _queued_victim(arena)
    nxt, token = arena.waiter("n", Plan(0.01))
    await arena.until(lambda: arena.queued(token), "n is queued")
    await arena.leave(lock_h, actor_h, lease_h)  # hands the lock to v in Redis ...
    problems = await cancel_and_record(arena, task, "v")  # ... cancelled in the same tick
    return problems + await arena.served(nxt, token, STAGE_BOUND_S)


async def stage_rung(arena: Arena) -> list[str]:
    """The grant reached the waiter (its future is done) but its task has not resumed.

    The cancelling callback is attached to the waiter's future while the acquire
    script is in flight, before the acquiring task awaits that future, so it runs
    before the task's own wake-up.
    """
    from redis_fifo_lock.waiting import hub_for

    lock_h, actor_h, lease_h = await arena.enter("h")
    client = arena.client("v")
    victim = arena.lock(client)
    task: asyncio.Task[Any] | None = None
    attached = asyncio.Event()

    def cancel_on_ring(_: object) -> None:
        assert task is not None
        arena.record.cancel("v")
        task.cancel()

    async def attach(conn: Any, name: str, args: tuple[Any, ...]) -> None:
        if name != "EVALSHA" or attached.is_set():
            return
        groups = [group for group in hub_for(client).groups.values() if "v" in group.waiters]
        assert len(groups) == 1, "the core's wait groups changed; update stage_rung"
        # The waiter's hint: set by the ring (or a poll), before the task claims.
        groups[0].waiters["v"]._hint.add_done_callback(cancel_on_ring)
        attached.set()

    client.after_send = attach
    arena.record.request("v", None, "v")
    task = asyncio.create_task(victim.acquire(token="v"))
    await arena.until(lambda: arena.queued("v"), "v is queued")
    client.after_send = None
    nxt, token = arena.waiter("n", Plan(0.01))
    await arena.until(lambda: arena.queued(token), "n is queued")
    await arena.leave(lock_h, actor_h, lease_h)
    await asyncio.wait({task}, timeout=STAGE_LEASE_MS / 1000 * 2)
    if not task.done():
        task.cancel()
    try:
        lease = await task
    except asyncio.CancelledError:
        arena.record.gave_up("v", "cancelled")
        problems = []
    else:
        arena.record.gave_up("v", "cancelled-too-late")
        await victim.release(lease)
        problems = ["v's acquire returned a lease although it was cancelled when rung"]
    return problems + await arena.served(nxt, token, STAGE_BOUND_S)


async def stage_timeout(arena: Arena) -> list[str]:
    """Timed out while queued."""
    holder = await arena.enter("h")
    victim, _ = arena.waiter("v", Plan(0.01, timeout_s=0.2))
    nxt, token = arena.waiter("n", Plan(0.01))
    await arena.until(lambda: arena.queued(token), "n is queued")
    await victim
    problems = [] if arena.entered("v") is None else ["v entered despite its timeout"]
    await arena.leave(*holder)
    return problems + await arena.served(nxt, token, STAGE_BOUND_S)


async def stage_timeout_zero(arena: Arena) -> list[str]:
    """``timeout=0`` on a held lock: one try, then withdrawn."""
    holder = await arena.enter("h")
    victim, _ = arena.waiter("v", Plan(0.01, timeout_s=0))
    await victim
    nxt, token = arena.waiter("n", Plan(0.01))
    await arena.until(lambda: arena.queued(token), "n is queued")
    await arena.leave(*holder)
    return await arena.served(nxt, token, STAGE_BOUND_S)


async def stage_cancelled_twice(arena: Arena) -> list[str]:
    """Cancelled, and cancelled again while its withdrawal is on the wire."""
    holder, task, client = await _queued_victim(arena)
    nxt, token = arena.waiter("n", Plan(0.01))
    await arena.until(lambda: arena.queued(token), "n is queued")

    async def second_cancel(conn: Any, name: str, args: tuple[Any, ...]) -> None:
        if name == "EVALSHA" and not task.done():
            arena.record.cancel("v")
            task.cancel()

    client.after_send = second_cancel
    problems = await cancel_and_record(arena, task, "v")
    await arena.leave(*holder)
    return problems + await arena.served(nxt, token, STAGE_BOUND_S)


async def stage_hold_body(arena: Arena) -> list[str]:
    """Cancelled inside ``async with lock.hold()``: the release still goes out."""
    client = arena.client("v")
    lock = arena.lock(client)
    entered = asyncio.Event()
    box: dict[str, Any] = {}

    async def body() -> None:
        arena.record.request("v", None, "v")
        async with lock.hold(token="v") as lease:
            box["lease"] = lease
            arena.record.enter(lease, "v")
            entered.set()
            try:
                await asyncio.Event().wait()  # inside until cancelled
            finally:
                arena.record.exit(lease)

    task = asyncio.create_task(body())
    await asyncio.wait_for(entered.wait(), 5)
    nxt, token = arena.waiter("n", Plan(0.01))
    await arena.until(lambda: arena.queued(token), "n is queued")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    lease = box["lease"]
    arena.record.released(lease, "ok" if lease.released and not lease.lost else "leaselost")
    return await arena.served(nxt, token, STAGE_BOUND_S)


CANCEL_STAGES: tuple[Stage, ...] = (
    stage_before_send,
    stage_policy_check,
    stage_sent_queued,
    stage_sent_granted,
    stage_waiting,
    stage_grant_landed,
    stage_rung,
    stage_timeout,
    stage_timeout_zero,
    stage_cancelled_twice,
    stage_hold_body,
)


@scenario(
    "cancel-stages",
    kills=("cancel-without-withdraw", "withdraw-keeps-grant", "abandoned-not-withdrawn"),
    faults="asyncio cancellation (and timeouts) of acquire at every stage",
)
async def cancel_stages(ctx: Context) -> Outcome:
    """Cancel an acquire at each stage in turn; the waiter behind it must never stall."""
    server = ctx.servers()
    problems: list[str] = []
    for stage in CANCEL_STAGES:
        label = stage.__name__.removeprefix("stage_").replace("_", "-")
        # The policy check runs once per server and process: that stage needs a new one.
        url = ctx.servers().url if stage is stage_policy_check else server.url
        found = await in_fresh_arena(
            Arena(ctx, url, f"cancel-{label}", lease_ms=STAGE_LEASE_MS),
            stage,
            load_scripts=stage is not stage_policy_check,
        )
        problems += [f"{label}: {problem}" for problem in found]
    return outcome(ctx, "cancel-stages", problems, handoff_ms=STAGE_BOUND_S * 1000)
