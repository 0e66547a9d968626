"""``fifo-floor``: the bare FIFO hand-off on redis-py's asyncio client, a yardstick.

It sends the same messages per grant as ``FifoLock`` under contention, and
nothing else: an acquire script (a ticket, and the lock or a place in the
queue), a release script that gives the lock to the head of the queue in the
same step, a ring on the next holder's process's channel (none when that is
the releaser's own process: it learns of the grant from the reply). It has none
of the lock's safety: no lease (a crashed holder keeps it for ever), no
signature on the ring (a forged ring lets a waiter in), no record of requests
(a re-sent script queues twice), no polling (a lost ring is a lost grant), no
bound on its keys. It is not a lock to use; it measures what any FIFO lock with
these messages costs on this machine and client, so that ``FifoLock``'s
figures can be split into the messages' cost and the cost of its safety.

Run it with the contended or uncontended workloads only (``benchmarks.run``
refuses the others: it cannot be held through an idle window or survive a
crash), e.g.::

    python -m benchmarks.run --size smoke --only fifolock fifo-floor python-redis-lock \\
        --workloads contended --parsers python
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import redis.asyncio
from redis.asyncio.client import PubSub

from benchmarks.libraries import Connection, Granted

LUA = Path(__file__).parent / "lua"

PROCESS = uuid.uuid4().hex[:12]
"""This process's id: its doorbell channel's suffix and its contenders' prefix."""


class _Hub:
    """A process's shared state for one lock name on one event loop: the
    scripts, the subscription to its doorbell channel and the waiting futures
    by contender id."""

    def __init__(self, client: redis.asyncio.Redis, name: str) -> None:
        self.keys = [f"floor:{{{name}}}:{part}" for part in ("holder", "queue", "tickets", "ring:")]
        self.acquire = client.register_script((LUA / "floor_acquire.lua").read_text())
        self.release = client.register_script((LUA / "floor_release.lua").read_text())
        self.waiting: dict[str, asyncio.Future[None]] = {}
        self._client = client
        self._subscribed: asyncio.Future[PubSub] | None = None
        self._reader: asyncio.Future[None] | None = None

    async def subscribed(self) -> None:
        """Subscribe to this process's channel, once; later calls wait for that."""
        if self._subscribed is None:
            self._subscribed = asyncio.ensure_future(self._subscribe())
        await self._subscribed

    async def _subscribe(self) -> PubSub:
        pubsub = self._client.pubsub()
        await pubsub.subscribe(self.keys[3] + PROCESS)
        self._reader = asyncio.ensure_future(self._read(pubsub))
        return pubsub

    async def _read(self, pubsub: PubSub) -> None:
        async for message in pubsub.listen():
            if message["type"] == "message":
                self.grant(message["data"].decode())

    def grant(self, contender: str) -> None:
        """Wake ``contender``'s acquire, which now holds the lock."""
        waiting = self.waiting.pop(contender, None)
        if waiting is not None and not waiting.done():
            waiting.set_result(None)


_hubs: dict[tuple[asyncio.AbstractEventLoop, str], _Hub] = {}


class FifoFloor:
    """One contender of the yardstick (an ``AsyncContender``; see the module)."""

    def __init__(self, conn: Connection, name: str, lease_ms: int | None) -> None:
        key = (asyncio.get_running_loop(), name)
        if key not in _hubs:
            _hubs[key] = _Hub(conn.async_(), name)
        self._hub = _hubs[key]
        self._id = f"{PROCESS}/{uuid.uuid4().hex[:12]}"

    async def acquire(self) -> Granted:
        """Take a ticket; return with the lock, at once or when it is handed over."""
        hub = self._hub
        await hub.subscribed()
        granted = asyncio.get_running_loop().create_future()
        hub.waiting[self._id] = granted  # before the script: the ring may come first
        at_once, ticket = await hub.acquire(keys=hub.keys, args=[self._id])
        if at_once:
            hub.waiting.pop(self._id, None)
        else:
            await granted
        return Granted(int(ticket), None)

    async def release(self) -> None:
        """Hand the lock to the next in the queue, or free it."""
        hub = self._hub
        next_holder = await hub.release(keys=hub.keys, args=[self._id, PROCESS])
        if next_holder == -1:
            raise RuntimeError(f"fifo-floor: {self._id} released a lock it did not hold")
        if next_holder and next_holder.decode().startswith(f"{PROCESS}/"):
            hub.grant(next_holder.decode())
