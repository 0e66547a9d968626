"""Bad input: wrong arguments, clients that are closed, servers that are not Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Any

from redis.asyncio import Redis

from redis_fifo_lock import FifoLock
from tests.adversarial.actors import Actor, Plan
from tests.adversarial.arena import Arena
from tests.adversarial.faults import not_redis_server
from tests.adversarial.registry import Context, Outcome, outcome, scenario
from tests.support.record import read_lines


async def _expect_error(
    label: str,
    call: Callable[[], Any],
    error: type[BaseException],
    mentions: tuple[str, ...],
) -> list[str]:
    """Run ``call`` (sync, or returning an awaitable); a problem unless it raises
    ``error`` whose message mentions each of ``mentions``."""
    try:
        result = call()
        if asyncio.iscoroutine(result):
            await asyncio.wait_for(result, 10)
    except error as exc:
        missing = [word for word in mentions if word not in str(exc)]
        if missing:
            return [f"{label}: {type(exc).__name__} does not mention {missing}: {exc}"]
        return []
    except Exception as exc:
        return [f"{label}: raised {type(exc).__name__} ({exc}), expected {error.__name__}"]
    return [f"{label}: no error, expected {error.__name__}"]


@scenario(
    "bad-input",
    kills=("release-no-owner-check",),
    faults="bad names, durations, timeouts and tokens; foreign and forged leases; a "
    "closed client; AUTH required; a server that is not Redis",
)
async def bad_input(ctx: Context) -> Outcome:
    """Each bad input gets a clear error of ours naming the cause (and the lock,
    where the lock exists), and the lock's keys stay consistent: the holder keeps
    the lock, the waiter is not granted, the next normal acquire works."""
    from redis_fifo_lock import Lease, LeaseLost, LockUsageError

    server = ctx.servers()
    name = "bad input \u00e9t\u00e9 \u2013 n\u00b0 42"  # spaces and unicode are fine
    arena = Arena(ctx, server.url, name)
    problems: list[str] = []
    client = arena.client("x")
    try:
        for bad_name, word in (("a{b}", "hash tag"), ("x" * 10_240, "limit"), ("", "empty")):
            problems += await _expect_error(
                f"name {bad_name[:12]!r}",
                partial(FifoLock, client, bad_name),
                ValueError,
                (word,),
            )
        for setting in ("lease_ms", "poll_ms", "max_hold_ms"):
            for value in (0, -5, 1.5, True):
                problems += await _expect_error(
                    f"{setting}={value!r}",
                    # The bad input under test: durations of the wrong type or sign.
                    partial(FifoLock, client, name, **{setting: value}),  # type: ignore[arg-type]
                    ValueError,
                    (setting,),
                )
        lock_h, actor_h, lease_h = await arena.enter("h")
        waiter, token = arena.waiter("w", Plan(0.01, timeout_s=5))
        await arena.until(lambda: arena.queued(token), "w is queued")
        probe = arena.lock(arena.client("y"))
        for timeout in (-1, float("nan"), True, "5"):
            problems += await _expect_error(
                f"timeout={timeout!r}",
                # The bad input under test: timeouts of the wrong type or sign.
                partial(probe.acquire, timeout),  # type: ignore[arg-type]
                ValueError,
                ("timeout",),
            )
        for bad_token in ("", "has space", "x" * 200):
            problems += await _expect_error(
                f"token {bad_token[:12]!r}",
                partial(probe.acquire, token=bad_token),
                ValueError,
                ("token",),
            )
        foreign = Lease("another lock", "t", lease_h.fence, lease_h.ticket)
        problems += await _expect_error(
            "a lease of another lock", lambda: probe.release(foreign), LockUsageError, (name,)
        )
        forged = Lease(name, "never-granted", lease_h.fence, lease_h.ticket)
        problems += await _expect_error(
            "release of a never-granted lease", lambda: probe.release(forged), LeaseLost, (name,)
        )
        status = await probe.status()
        if status.holder_fence != lease_h.fence or arena.entered(token) is not None:
            problems.append(f"bad releases disturbed the holder: {status}")
        await arena.leave(lock_h, actor_h, lease_h)
        problems += await arena.served(waiter, token, 5.0)
        closed = arena.client("closed")
        await closed.aclose()
        problems += await _closed_client(arena, closed)
        problems += await _unreachable(ctx, name)
        problems += await arena.consistent()
    finally:
        await arena.close()
    return outcome(ctx, "bad-input", problems)


async def _closed_client(arena: Arena, closed: Redis) -> list[str]:
    """A closed client either still works (redis-py reconnects) or fails with our
    error naming the lock; either way it is recorded like any request."""
    actor = Actor(arena.record, "closed")
    lease = await asyncio.wait_for(
        actor.attempt(arena.lock(closed), "closed-client", Plan(0.01, timeout_s=2)), 10
    )
    if lease is not None:
        return []
    reasons = [
        line.fields[1]
        for line in read_lines(arena.record.path)
        if line.kind == "gaveup" and line.fields[0] == "closed-client"
    ]
    return (
        [] if reasons and reasons[-1].startswith("unavailable") else [f"closed client: {reasons}"]
    )


async def _unreachable(ctx: Context, name: str) -> list[str]:
    """AUTH required without credentials; servers that are not Redis."""
    from redis_fifo_lock import RedisUnavailable

    problems: list[str] = []
    secured = ctx.servers(["--requirepass", "s3cret"])
    anonymous = Redis.from_url(secured.url)
    problems += await _expect_error(
        "AUTH required, no credentials",
        lambda: FifoLock(anonymous, name).acquire(timeout=1),
        RedisUnavailable,
        (name, "Authentication"),
    )
    await anonymous.aclose()
    trusted = Redis.from_url(secured.url, password="s3cret")
    lock = FifoLock(trusted, name)
    lease = await lock.acquire(timeout=2)
    await lock.release(lease)
    status = await lock.status()
    if status.held or status.waiting or not status.last_fence:
        problems.append(f"AUTH: after the refused acquire the keys were not clean: {status}")
    await trusted.aclose()
    talker, port = await not_redis_server(answer=True)
    stranger = Redis(host="127.0.0.1", port=port)
    try:
        problems += await _expect_error(
            "an HTTP server on the port",
            lambda: FifoLock(stranger, name).acquire(timeout=1),
            RedisUnavailable,
            (name,),
        )
    finally:
        await stranger.aclose()
        talker.close()
    return problems
