"""Bytes Redis keeps per lock name: while held with waiters, after release, once idle.

For one lock name, the sum of ``MEMORY USAGE`` over every key of the name
(``SCAN MATCH fifolock:{<name>}:*``) is measured

(a) while the lock is held and ``waiters`` requests (one process) wait;
(b) right after the last release, nobody waiting;
(c) after the idle window: polled until the name has no key left, or
    ``idle_timeout_s`` passed (then the figure is what is left);
(d) on another name, right after ``uses`` acquire/release cycles, each from a
    fresh ``FifoLock`` on one client and loop: what a hot name costs.

The idle figure is what a name used once costs for good: issue 11 asks for 0.
Run alone (a private server is started unless ``REDIS_URL`` is set)::

    uv run --all-extras python -m benchmarks.keyspace [--waiters 10] [--lease-ms 1000] [--uses 5000]

``benchmarks.run`` runs it as the ``keyspace`` workload, with the size's idle
timeout (short in the smoke size, which then reports the idle figure it saw).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import time
from collections.abc import Sequence
from typing import Any

import redis
from redis.asyncio import Redis as AsyncRedis

from redis_fifo_lock import FifoLock
from redis_fifo_lock.protocol import KEY_PREFIX
from redis_fifo_lock.testing import redis_url

IDLE_POLL_S = 0.5
"""How often the idle phase looks for the name's keys, in seconds."""


def name_footprint(client: redis.Redis, name: str) -> tuple[int, int]:
    """(keys, bytes) Redis keeps for lock ``name``: its keys and ``MEMORY USAGE`` summed."""
    keys = list(client.scan_iter(match=f"{KEY_PREFIX}:{{{name}}}:*", count=1000))
    size = 0
    for key in keys:
        size += int(client.memory_usage(key, samples=0) or 0)  # 0 if it expired meanwhile
    return len(keys), size


async def _held_with_waiters(url: str, name: str, waiters: int, lease_ms: int) -> dict[str, int]:
    """Phases (a) and (b): measured with a sync client while the lock's loop waits."""
    sync = redis.Redis.from_url(url)
    client = AsyncRedis.from_url(url)
    settings: dict[str, Any] = {"lease_ms": lease_ms, "poll_ms": max(1, lease_ms // 2)}
    figures: dict[str, int] = {}
    try:
        holder = FifoLock(client, name, **settings)
        lease = await holder.acquire(timeout=10)
        tasks = [
            asyncio.create_task(FifoLock(client, name, **settings).acquire(timeout=60))
            for _ in range(waiters)
        ]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # no event says "Redis queued them all"
            if (await holder.status()).waiting >= waiters:
                break
            await asyncio.sleep(0.01)
        figures["held_keys"], figures["held_bytes"] = name_footprint(sync, name)
        await holder.release(lease)
        for granted in asyncio.as_completed(tasks):  # in grant order, each released at once
            await holder.release(await granted)
        figures["released_keys"], figures["released_bytes"] = name_footprint(sync, name)
    finally:
        await client.aclose()
        sync.close()
    return figures


async def _hot(url: str, name: str, uses: int, lease_ms: int) -> dict[str, int]:
    """Phase (d): ``uses`` cycles of ``name``, then its footprint."""
    client = AsyncRedis.from_url(url)
    settings: dict[str, Any] = {"lease_ms": lease_ms, "poll_ms": max(1, lease_ms // 2)}
    try:
        for _ in range(uses):
            lock = FifoLock(client, name, **settings)
            await lock.release(await lock.acquire(timeout=10))
    finally:
        await client.aclose()
    with redis.Redis.from_url(url) as sync:
        keys, size = name_footprint(sync, name)
    return {"uses": uses, "hot_keys": keys, "hot_bytes": size}


def measure(
    url: str,
    *,
    waiters: int = 10,
    lease_ms: int = 1000,
    idle_timeout_s: float = 30.0,
    uses: int = 0,
) -> dict[str, Any]:
    """The figures for fresh lock names on the server at ``url``.

    Returns:
        ``waiters``, ``lease_ms``, ``held_keys``/``held_bytes`` (a),
        ``released_keys``/``released_bytes`` (b), ``idle_keys``/``idle_bytes`` (c)
        and ``idle_after_s``: seconds from the release until no key was left
        (None if some were still there after ``idle_timeout_s``); with ``uses``
        > 0 also ``uses``, ``hot_keys``/``hot_bytes`` (d).
    """
    name = f"bench-keyspace-{secrets.token_hex(4)}"
    figures: dict[str, Any] = {"waiters": waiters, "lease_ms": lease_ms}
    figures.update(asyncio.run(_held_with_waiters(url, name, waiters, lease_ms)))
    released = time.monotonic()
    with redis.Redis.from_url(url) as sync:
        keys, size = name_footprint(sync, name)
        while keys and time.monotonic() - released < idle_timeout_s:
            time.sleep(IDLE_POLL_S)  # Redis expires keys on its own clock: nothing to await
            keys, size = name_footprint(sync, name)
        figures["idle_keys"], figures["idle_bytes"] = keys, size
        figures["idle_after_s"] = None if keys else round(time.monotonic() - released, 1)
        figures["idle_window_s"] = idle_timeout_s
        for key in sync.scan_iter(match=f"{KEY_PREFIX}:{{{name}}}:*"):
            sync.delete(key)  # leave a shared server as it was
    if uses > 0:
        hot = f"{name}-hot"
        figures.update(asyncio.run(_hot(url, hot, uses, lease_ms)))
        with redis.Redis.from_url(url) as sync:
            for key in sync.scan_iter(match=f"{KEY_PREFIX}:{{{hot}}}:*"):
                sync.delete(key)
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    """Measure once and print the figures as JSON."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.keyspace", description=__doc__)
    parser.add_argument("--waiters", type=int, default=10)
    parser.add_argument("--lease-ms", type=int, default=1000)
    parser.add_argument("--idle-timeout-s", type=float, default=30.0)
    parser.add_argument("--uses", type=int, default=5000)
    args = parser.parse_args(argv)
    with redis_url() as url:
        figures = measure(
            url,
            waiters=args.waiters,
            lease_ms=args.lease_ms,
            idle_timeout_s=args.idle_timeout_s,
            uses=args.uses,
        )
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
