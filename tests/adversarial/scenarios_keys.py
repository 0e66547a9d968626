"""Keys lost (eviction, deletion) and the ``max_hold_ms`` bound."""

from __future__ import annotations

import asyncio
import math
import time
from functools import partial

from redis.exceptions import RedisError

from tests.adversarial.actors import Plan, hold_and_release
from tests.adversarial.arena import Arena
from tests.adversarial.faults import KEY_PARTS
from tests.adversarial.registry import LEASE_MS, POLL_MS, Context, Outcome, outcome, scenario
from tests.support.record import read_lines
from tests.support.replay import script_calls

EVICTION_STEP_BYTES = 512
"""Size of each filler write that pushes the server past ``maxmemory``."""


async def evict_lease(arena: Arena) -> list[str]:
    """Evict the lease key the way a full server would: ``maxmemory`` is set just
    above use and small filler keys are written until the lease is gone, then the
    limit is restored. Under ``volatile-ttl`` the lease (``lease_ms``; the other
    keys live ``keep_ms``) goes first, but seldom alone: one eviction frees until
    the server is under the limit, and a filler, a client's buffers or the
    allocator's rounding overshoot it by more than the lease's size, so in
    practice every key of the lock goes with it. The fault is recorded before the
    first filler, naming every key that existed then: the waiters react (lose
    their place, queue again, are granted) while the eviction is still going on.
    Problems if the lease was never seen gone."""
    admin = arena.admin
    lease_key = arena.keys.key("lease")
    present = [part for part in KEY_PARTS if await admin.exists(arena.keys.key(part))]
    used = int((await admin.info("memory"))["used_memory"])
    arena.faults.fault("evict", ",".join(present))
    await admin.config_set("maxmemory", used + 4 * 1024)
    fillers = []
    evicted = False
    try:
        for index in range(1024):
            fillers.append(f"adv:filler:{index}")
            try:
                await admin.set(fillers[-1], b"x" * EVICTION_STEP_BYTES)
            except RedisError:
                out_of_memory = True  # every volatile key went, and it was not enough
            else:
                out_of_memory = False
            # Checked at once: a waiter granted after the eviction makes a new lease.
            evicted = not await admin.exists(lease_key)
            if evicted or out_of_memory:
                break
    finally:
        await admin.config_set("maxmemory", 0)
        await admin.delete(*fillers)
    return [] if evicted else ["the lease key survived the eviction attempt"]


@scenario(
    "lease-evicted",
    kills=("release-no-owner-check",),
    faults="the lease key evicted under a tiny maxmemory with volatile-ttl",
)
async def lease_evicted(ctx: Context) -> Outcome:
    """The lease vanishes under a holder (with the other keys of the lock, see
    ``evict_lease``): it learns at its next renewal (lease.lost, LeaseLost at
    release), every waiter and a newcomer are served, and the holder's late
    release frees nobody else."""
    server = ctx.servers(["--maxmemory-policy", "volatile-ttl"])
    arena = Arena(ctx, server.url, "evicted")
    try:
        lock_a, actor_a, lease_a = await arena.enter("a")
        second, second_token = arena.waiter("b", Plan(2.5 * LEASE_MS / 1000, timeout_s=5))
        await arena.until(lambda: arena.queued(second_token), "b is queued")
        third, third_token = arena.waiter("c", Plan(0.01, timeout_s=5))
        await arena.until(lambda: arena.queued(third_token), "c is queued")
        holding = asyncio.create_task(
            hold_and_release(
                actor_a,
                lock_a,
                lease_a,
                10 * LEASE_MS,
                # A release that arrives once the next holder is in: it must free nobody.
                until=lambda: arena.until(lambda: arena.entered(second_token), "b entered", 5),
            )
        )
        await asyncio.sleep(ctx.rng.uniform(0.0, LEASE_MS / 1000))  # a random moment of the hold
        evicted_at = time.monotonic_ns()
        problems = await evict_lease(arena)
        newcomer, newcomer_token = arena.waiter("d", Plan(0.01, timeout_s=5))
        outcome_a = await holding
        if outcome_a != "leaselost":
            problems.append(f"the holder's release gave {outcome_a!r}, expected LeaseLost")
        lost = _first(arena, "lost", lease_a.token)
        if lost is None:
            problems.append("the holder never saw lease.lost set")
        elif (lost - evicted_at) / 1e6 > LEASE_MS / 3 + 400:
            problems.append(f"lease.lost was set {(lost - evicted_at) / 1e6:.0f} ms after eviction")
        for task, token in (
            (second, second_token),
            (third, third_token),
            (newcomer, newcomer_token),
        ):
            problems += await arena.served(task, token, 5.0)
        problems += await arena.consistent()
    finally:
        await arena.close()
    return outcome(ctx, "lease-evicted", problems)


def _first(arena: Arena, kind: str, token: str) -> int | None:
    """When the first ``kind`` line for ``token`` was written (None if none)."""
    return next(
        (
            line.ns
            for line in read_lines(arena.record.path)
            if line.kind == kind and line.fields[0] == token
        ),
        None,
    )


@scenario(
    "keys-missing",
    kills=("grant-not-head", "fence-restarts-at-1"),
    faults="subsets of the six lock keys deleted while a holder holds and others wait",
)
async def keys_missing(ctx: Context) -> Outcome:
    """Delete a subset of the lock's keys under load: no script raises a Lua
    error, every waiter is served, and the lock is usable again within a lease.

    Always {lease}, {lease, counters} and all six; then random subsets. Fences
    must still rise (they are dated by the server's clock).
    """
    server = ctx.servers()
    subsets = [("lease",), ("lease", "counters"), KEY_PARTS]
    while len(subsets) < 8:
        size = ctx.rng.randint(1, len(KEY_PARTS))
        subsets.append(tuple(sorted(ctx.rng.sample(KEY_PARTS, size), key=KEY_PARTS.index)))
    problems: list[str] = []
    for index, parts in enumerate(subsets):
        arena = Arena(ctx, server.url, f"keys-{index}")
        try:
            found = await _delete_keys(arena, parts)
            found += await arena.consistent()
        finally:
            await arena.close()
        problems += [f"{'+'.join(parts)}: {problem}" for problem in found]
    return outcome(ctx, "keys-missing", problems)


async def _delete_keys(arena: Arena, parts: tuple[str, ...]) -> list[str]:
    lock_a, actor_a, lease_a = await arena.enter("a")
    waiters = []
    for who in ("b", "c"):
        task, token = arena.waiter(who, Plan(0.02, timeout_s=4))
        await arena.until(partial(arena.queued, token), f"{who} is queued")
        waiters.append((task, token))
    holding = asyncio.create_task(hold_and_release(actor_a, lock_a, lease_a, 2 * LEASE_MS))
    await asyncio.sleep(0.02)  # a moment into the hold
    deleted_at = time.monotonic_ns()
    arena.faults.fault("delete", ",".join(parts))
    await arena.admin.delete(*(arena.keys.key(part) for part in parts))
    waiters.append(arena.waiter("d", Plan(0.02, timeout_s=4)))
    await holding
    problems = []
    for task, token in waiters:
        problems += await arena.served(task, token, 5.0)
    entries = [
        line.ns
        for line in read_lines(arena.record.path)
        if line.kind == "enter" and line.ns > deleted_at and not line.fields[0].startswith("a-")
    ]
    left = _first(arena, "exit", lease_a.token) or deleted_at
    usable_by = max(left, deleted_at) + (LEASE_MS + POLL_MS + 300) * 1_000_000
    if not entries or min(entries) > usable_by:
        took = (min(entries) - max(left, deleted_at)) / 1e6 if entries else math.inf
        problems.append(f"the first grant after the holder left took {took:.0f} ms")
    return problems


MAX_HOLD_MS = 1200


@scenario(
    "max-hold",
    kills=("max-hold-ignored",),
    faults="a live holder that never releases (abandoned), past max_hold_ms",
)
async def max_hold(ctx: Context) -> Outcome:
    """An abandoned holder keeps renewing: at max_hold_ms Redis refuses, its
    lease.lost is set, and the waiter behind it gets the lock."""
    server = ctx.servers()
    arena = Arena(ctx, server.url, "abandoned", max_hold_ms=MAX_HOLD_MS)
    try:
        lock_a, actor_a, lease_a = await arena.enter("a")
        arena.faults.fault("overhold", lease_a.token)
        entered = _first(arena, "enter", lease_a.token) or time.monotonic_ns()
        waiter, token = arena.waiter("b", Plan(0.01, timeout_s=4))
        await arena.until(lambda: arena.queued(token), "b is queued")
        outcome_a = await hold_and_release(actor_a, lock_a, lease_a, 6000)
        problems = await arena.served(waiter, token, 4.0)
        lost = _first(arena, "lost", lease_a.token)
        bound_ms = MAX_HOLD_MS + LEASE_MS + 300
        if lost is None or not MAX_HOLD_MS - 150 <= (lost - entered) / 1e6 <= bound_ms:
            at = "never" if lost is None else f"after {(lost - entered) / 1e6:.0f} ms"
            problems.append(
                f"the abandoned holder's lease.lost was set {at} (max_hold_ms {MAX_HOLD_MS})"
            )
        if outcome_a != "leaselost":
            problems.append(
                f"the abandoned holder's release gave {outcome_a!r}, expected LeaseLost"
            )
        second = _first(arena, "enter", token)
        if second is not None and (second - entered) / 1e6 > bound_ms + POLL_MS:
            problems.append(
                f"the waiter entered {(second - entered) / 1e6:.0f} ms after the holder"
            )
        problems += await arena.consistent()
    finally:
        await arena.close()
    return outcome(ctx, "max-hold", problems)


@scenario(
    "evicted-after-waiting",
    kills=("young-loss-swept",),
    faults="force_release of a holder that had waited in the queue while a later "
    "request of its process queued behind it; a copy of that later request's "
    "acquire arrives again after the eviction; the holder's release comes last",
)
async def evicted_after_waiting(ctx: Context) -> Outcome:
    """The later request's acquire carried its process's floor, which passed the
    waiting request (neither held nor in flight then). The waiter is granted, an
    operator evicts it, and a copy of that acquire (a redis-py re-send held up
    in the network) reaches Redis again. The waiter's release - sent once its
    work is done, after all that - must still learn that the lease was taken
    (LeaseLost), not be told "already released"; the later request gets the
    lock."""
    server = ctx.servers()
    arena = Arena(ctx, server.url, "evicted-waiter")
    problems: list[str] = []
    try:
        lock_h, actor_h, lease_h = await arena.enter("h")
        lock_w, actor_w = arena.contender("w")
        token_w = f"w-{ctx.rng.getrandbits(20):05x}"
        waiting = asyncio.create_task(actor_w.acquire(lock_w, token_w, Plan(0, timeout_s=10)))
        await arena.until(lambda: arena.queued(token_w), "w is queued")
        with script_calls() as recorded:
            later, token_x = arena.waiter("x", Plan(0.01, timeout_s=10))
            await arena.until(lambda: arena.queued(token_x), "x is queued behind w")
        copies = recorded.since(0, mentioning=token_x, script="acquire")
        if not copies:
            return outcome(ctx, "evicted-after-waiting", ["x's acquire was not captured"])
        await arena.leave(lock_h, actor_h, lease_h)
        lease_w = await waiting
        if lease_w is None:
            return outcome(ctx, "evicted-after-waiting", ["w was not granted after h left"])
        actor_w.record.exit(lease_w)  # its work is done; its release is on its way
        arena.faults.fault("evict", "lease")
        await arena.lock(arena.admin).force_release(fence=lease_w.fence)
        await copies[0].replay()  # its floor passes w, which holds nothing to sweep then
        released = await actor_w.release(lock_w, lease_w, Plan(0))
        if released != "leaselost":
            problems.append(f"the evicted holder's release gave {released!r}, expected LeaseLost")
        problems += await arena.served(later, token_x, 5.0)
        problems += await arena.consistent()
    finally:
        await arena.close()
    return outcome(ctx, "evicted-after-waiting", problems)
