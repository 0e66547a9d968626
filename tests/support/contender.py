"""A contender process: acquires a lock, records its hold, releases.

Run as ``python -m tests.support.contender --url URL --name NAME --record PATH``
with options below; a URL ``sentinel://HOST:PORT[,HOST:PORT...]/SERVICE`` finds
the master of SERVICE through those sentinels. Prints ``queued <token>`` once
its first request is queued (or ``granted`` if it got the lock at once) so a
test can order processes by arrival, then ``done`` at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from redis_fifo_lock import FifoLock, LoopClients
from tests.support.polling import until
from tests.support.record import Record


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--record", required=True)
    parser.add_argument("--lease-ms", type=int, default=1000)
    parser.add_argument("--poll-ms", type=int, default=200)
    parser.add_argument("--hold-ms", type=float, default=50.0)
    parser.add_argument("--rounds", type=int, default=1, help="acquisitions per task")
    parser.add_argument("--tasks", type=int, default=1, help="concurrent tasks")
    parser.add_argument("--who", default="-")
    parser.add_argument("--cluster", action="store_true", help="--url names a Redis Cluster node")
    return parser.parse_args()


def connect(url: str, cluster: bool) -> Redis | RedisCluster:
    """A client for ``url`` on the running loop (see the module docstring)."""
    if url.startswith("sentinel://"):
        addresses, _, service = url.removeprefix("sentinel://").partition("/")
        pairs = (address.rpartition(":") for address in addresses.split(","))
        sentinels = [(host, int(port)) for host, _, port in pairs]
        # Closed with the loop, sentinel connections included.
        return LoopClients.sentinel(sentinels, service).client()
    return RedisCluster.from_url(url) if cluster else Redis.from_url(url)


async def contend(args: argparse.Namespace) -> None:
    client = connect(args.url, args.cluster)
    lock = FifoLock(client, args.name, lease_ms=args.lease_ms, poll_ms=args.poll_ms)
    record = Record(args.record)

    async def one_task(first: bool) -> None:
        for round_ in range(args.rounds):
            token = secrets.token_hex(8)
            acquiring = asyncio.create_task(lock.acquire(token=token))
            if first and round_ == 0:
                await announce(client, lock, token, acquiring)
            lease = await acquiring
            record.enter(lease, args.who)
            await asyncio.sleep(args.hold_ms / 1000)
            record.exit(lease)
            await lock.release(lease)

    await asyncio.gather(*(one_task(i == 0) for i in range(args.tasks)))
    print("done", flush=True)
    await client.aclose()


async def announce(
    client: Redis | RedisCluster, lock: FifoLock, token: str, acquiring: asyncio.Task[object]
) -> None:
    """Print once the request is queued in Redis (or granted)."""
    queue = lock.keys.key("queue")

    async def settled() -> bool:
        return acquiring.done() or await client.zscore(queue, token) is not None

    await until(settled, "the first request is queued or granted")
    print("granted" if acquiring.done() else f"queued {token}", flush=True)


if __name__ == "__main__":
    asyncio.run(contend(parse()))
    sys.exit(0)
