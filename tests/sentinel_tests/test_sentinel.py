"""The core lock through Redis Sentinel, on a real master, replica and three sentinels.

What ``tests/test_lock.py`` checks on one server, with clients that find the
master through the sentinels (``Sentinel.master_for`` and
``LoopClients.sentinel``): FIFO order across processes, mutual exclusion over
holds spanning polls, a killed holder replaced within one lease; plus the
``replicas`` setting on a healthy replica, and ``LoopClients.sentinel``
closing its sentinel connections with the loop. Failover is in
``test_failover.py``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from redis.asyncio import Redis

from redis_fifo_lock import FifoLock, LoopClients, SyncFifoLock
from tests.sentinel_tests.conftest import close_master_client, master_client, sentinel_url
from tests.support.polling import until
from tests.support.processes import (
    ROOT,
    killed_holder_replaced,
    never_overlap,
    served_in_arrival_order,
)
from tests.support.sentinel import PrivateSentinelSetup

pytestmark = pytest.mark.sentinel


def connection(setup: PrivateSentinelSetup) -> list[str]:
    """The contender's arguments to reach the master through the sentinels."""
    return ["--url", sentinel_url(setup)]


def test_the_set_up_reports_its_master_replica_and_sentinels(
    sentinel_setup: PrivateSentinelSetup,
) -> None:
    assert sentinel_setup.master_address() == (
        sentinel_setup.master.host,
        sentinel_setup.master.port,
    )
    assert len(sentinel_setup.replicas) == 1 and len(sentinel_setup.sentinels) == 3
    ports = {sentinel_setup.master.port, sentinel_setup.replica.port}
    ports |= {port for _, port in sentinel_setup.sentinel_addresses}
    assert len(ports) == 5


async def test_waiting_processes_are_served_in_arrival_order(
    amaster: Redis, sentinel_setup: PrivateSentinelSetup, tmp_path: Path
) -> None:
    gate = FifoLock(amaster, "fifo", lease_ms=5000, poll_ms=500)
    await served_in_arrival_order(gate, connection(sentinel_setup), tmp_path / "record", 5)


async def test_processes_never_overlap_while_holds_span_many_polls(
    amaster: Redis, sentinel_setup: PrivateSentinelSetup, tmp_path: Path
) -> None:
    await never_overlap(connection(sentinel_setup), tmp_path / "record", poll_ms=50)


async def test_a_killed_holder_is_replaced_within_one_lease_with_a_higher_fence(
    amaster: Redis, sentinel_setup: PrivateSentinelSetup, tmp_path: Path
) -> None:
    await killed_holder_replaced(connection(sentinel_setup), tmp_path / "record")


async def test_grants_and_renewals_acknowledged_by_the_replica_keep_the_lock(
    amaster: Redis, sentinel_setup: PrivateSentinelSetup
) -> None:
    # replicas=1: the grant (uncontended: the acquire's own reply) and every
    # renewal wait for the replica; a contended grant (made by the release
    # script) is confirmed by the next holder before it counts.
    first = FifoLock(amaster, "acked", lease_ms=600, poll_ms=100, replicas=1)
    lease = await first.acquire()
    await asyncio.sleep(1.5)  # more than two leases: kept alive by acknowledged renewals
    assert not lease.lost
    second_client = await master_client(sentinel_setup)
    try:
        second = FifoLock(second_client, "acked", lease_ms=600, poll_ms=100, replicas=1)
        waiting = asyncio.create_task(second.acquire(timeout=10, token="second"))

        async def queued() -> bool:
            return await amaster.zscore(first.keys.key("queue"), "second") is not None

        await until(queued, "the second request is queued")
        await first.release(lease)
        next_lease = await waiting
        assert next_lease.fence > lease.fence
        replica = Redis(host=sentinel_setup.replica.host, port=sentinel_setup.replica.port)
        try:
            # Confirmed on the replica before acquire returned.
            fence = await replica.hget(first.keys.key("lease"), "fence")
            assert int(fence or 0) == next_lease.fence
        finally:
            await replica.aclose()
        await second.release(next_lease)
    finally:
        await close_master_client(second_client)


async def test_loop_clients_sentinel_serve_each_loop_and_a_sync_lock(
    sentinel_setup: PrivateSentinelSetup,
) -> None:
    clients = LoopClients.sentinel(
        sentinel_setup.sentinel_addresses,
        sentinel_setup.service_name,
        sentinel_kwargs={"socket_timeout": 2.0},
        socket_timeout=2.0,
    )
    lock = FifoLock(clients, "loops", lease_ms=600, poll_ms=100)
    lease = await lock.acquire()
    await lock.release(lease)

    def in_threads() -> list[int]:
        sync_lock = SyncFifoLock(clients, "loops", lease_ms=600, poll_ms=100)
        fences = []
        for _ in range(2):
            with sync_lock.hold(timeout=10) as held:
                time.sleep(0.5)  # spans a renewal, done by the portal loop
                assert not held.lost
                fences.append(held.fence)
        return fences

    fences = await asyncio.to_thread(in_threads)
    assert lease.fence < fences[0] < fences[1]


CLOSE_CHECK = textwrap.dedent(
    """
    import asyncio, sys, time
    from redis import Redis
    from redis_fifo_lock import FifoLock, LoopClients

    service, ports, mode = sys.argv[1:]
    sentinels = [("127.0.0.1", int(port)) for port in ports.split(",")]
    named = {"client_name": "fifolock-close-check"}

    clients = LoopClients.sentinel(sentinels, service, sentinel_kwargs=named)

    def still_open() -> int:
        # Waits up to 2 s for them to close, except in the control.
        deadline = time.monotonic() + (0 if mode == "control" else 2)
        while True:
            total = 0
            for host, port in sentinels:
                with Redis(host=host, port=port) as sentinel:
                    listed = sentinel.client_list()
                total += sum(1 for client in listed if client["name"] == named["client_name"])
            if total == 0 or time.monotonic() > deadline:
                return total
            time.sleep(0.05)

    async def use(close: bool) -> int:
        lock = FifoLock(clients, "closing", lease_ms=600, poll_ms=100)
        await lock.release(await lock.acquire())
        if not close:
            return -1
        if mode == "control":
            await clients.client().aclose()  # the master client alone
        else:
            await clients.aclose()
        return await asyncio.to_thread(still_open)

    # aclose() on a running loop, then the loop-close hook, three loops each.
    on_aclose = [asyncio.run(use(close=True)) for _ in range(3)]
    on_loop_close = []
    for _ in range(3):
        asyncio.run(use(close=False))
        assert len(clients) == 0, len(clients)
        on_loop_close.append(still_open())
    print(max(on_aclose), max(on_loop_close))
    """
)


@pytest.mark.parametrize("mode", ["loop-clients", "control"])
def test_loop_clients_sentinel_close_the_sentinel_connections_with_the_loop(
    sentinel_setup: PrivateSentinelSetup, mode: str
) -> None:
    # A fresh interpreter under -W error; the sentinels are asked for the
    # connections still open under the script's client name. The control
    # closes the master client alone, as code that forgets the sentinels
    # would: their connections stay open while the loop runs.
    ports = ",".join(str(port) for _, port in sentinel_setup.sentinel_addresses)
    done = subprocess.run(
        [
            sys.executable,
            "-W",
            "error",
            "-c",
            CLOSE_CHECK,
            sentinel_setup.service_name,
            ports,
            mode,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no ResourceWarning, not even an ignored one
    on_aclose, on_loop_close = map(int, done.stdout.split())
    if mode == "control":
        assert on_aclose > 0
    else:
        assert (on_aclose, on_loop_close) == (0, 0)
