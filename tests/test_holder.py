"""Who holds a lock: the bounded holder description, and ``status()`` counting only
live waiters (``redis_fifo_lock.holder``, status.lua)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from redis.asyncio import Redis

from redis_fifo_lock import FifoLock, Lease, SyncFifoLock, describing
from redis_fifo_lock.holder import MAX_HOLDER_BYTES, bounded
from tests.support.polling import until

ROOT = Path(__file__).resolve().parent.parent
FAST = {"lease_ms": 1000, "poll_ms": 200}
HERE = f"{socket.gethostname()} pid {os.getpid()}"


def test_a_description_loses_control_characters_and_is_cut_to_256_bytes() -> None:
    assert bounded("GET /a\r\nX-Evil: 1\x1b[31m") == "GET /a  X-Evil: 1 [31m"
    long = bounded("é" * 300)
    assert len(long.encode()) <= MAX_HOLDER_BYTES == 256
    assert long.endswith("...") and long.startswith("ééé")


def test_a_description_that_is_not_text_is_refused_when_the_block_is_made() -> None:
    for caller in (123, None, b"bytes"):
        with pytest.raises(TypeError, match=r"describing\(\) takes a str"):
            describing(caller)  # type: ignore[arg-type]


def test_a_description_cannot_forge_lines_with_unicode_line_separators() -> None:
    # U+2028 and U+2029 are no control characters, but str.splitlines(), and
    # many log viewers and terminals, break lines on them: a request path
    # holding them showed onlookers a forged holder on a line of its own.
    forged = bounded("GET /a\u2028pid 1: celery task forged\u2029/b\x85c")
    assert forged == "GET /a pid 1: celery task forged /b c"
    assert len(forged.splitlines()) == 1


async def test_status_shows_the_holder_s_host_pid_and_what_the_integration_said(
    aredis: Redis,
) -> None:
    lock = FifoLock(aredis, "jobs", **FAST)
    assert (await lock.status()).holder is None
    with describing("nightly\nreport " + "x" * 400):
        lease = await lock.acquire(timeout=5)
    status = await lock.status()
    await lock.release(lease)

    assert status.holder is not None
    assert status.holder.startswith(f"{HERE}: nightly report xxx")
    assert len(status.holder.encode()) <= 256
    assert (await lock.status()).holder is None


async def test_a_waiter_s_description_becomes_the_holder_s_at_the_hand_off(
    aredis: Redis,
) -> None:
    lock = FifoLock(aredis, "jobs", **FAST)
    first = await lock.acquire(timeout=5)

    async def second() -> Lease:
        with describing("second in line"):
            return await lock.acquire(timeout=10)

    waiting = asyncio.create_task(second())

    async def queued() -> bool:
        return (await lock.status()).waiting == 1

    await until(queued, "the second request is queued")
    await lock.release(first)
    lease = await waiting
    status = await lock.status()
    await lock.release(lease)
    assert (status.holder_fence, status.holder) == (lease.fence, f"{HERE}: second in line")


def test_the_sync_facade_records_what_the_calling_thread_said(redis_url: str) -> None:
    lock = SyncFifoLock(redis_url, "jobs", **FAST)
    with describing("sync caller"), lock.hold(timeout=5):
        assert lock.status().holder == f"{HERE}: sync caller"
    with lock.hold(timeout=5):
        assert lock.status().holder == HERE


def start_waiter(redis_url: str, record: Path) -> subprocess.Popen[str]:
    """A process that queues for "jobs" (lease_ms 1000) and prints ``queued TOKEN``."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.contender",
            "--url",
            redis_url,
            "--name",
            "jobs",
            "--record",
            str(record),
            "--lease-ms",
            "1000",
            "--poll-ms",
            "200",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


async def test_a_sigkilled_waiter_stops_counting_as_live_while_it_stays_queued(
    aredis: Redis, redis_url: str, tmp_path: Path
) -> None:
    lock = FifoLock(aredis, "jobs", **FAST)
    assert not (await lock.status()).known
    lease = await lock.acquire(timeout=5)
    waiter = start_waiter(redis_url, tmp_path / "record")
    try:
        assert waiter.stdout is not None
        line = await asyncio.to_thread(waiter.stdout.readline)
        assert line.startswith("queued "), line
        alive = await lock.status()
        os.kill(waiter.pid, signal.SIGKILL)
        waiter.wait(10)

        async def dead() -> bool:
            return (await lock.status()).live_waiting == 0

        await until(dead, "the killed waiter's liveness runs out")
        after = await lock.status()
    finally:
        if waiter.poll() is None:
            waiter.kill()
        await lock.release(lease)

    assert (alive.known, alive.waiting, alive.live_waiting) == (True, 1, 1)
    assert (after.waiting, after.live_waiting) == (1, 0)
