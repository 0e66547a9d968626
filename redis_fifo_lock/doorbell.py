"""The doorbell: one pub/sub subscription per client, shared by all its waiters.

Every grant made by a script is published as ``"<token> <fence> <ticket> <pttl_ms>"``
on the doorbell channel of the session that waits for it,
``fifolock:{<name>}:doorbell:<session>``, so a grant wakes only the process it
is for, however many processes wait. A process subscribes to the channel of
each of its wait groups and routes each ring to that group's waiters. The
doorbell is only an optimisation: a lost ring costs latency, never correctness,
because every waiting process also polls (see ``waiting.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from redis.asyncio.client import PubSub
from redis.exceptions import RedisError

from .protocol import AsyncClient, Grant

log = logging.getLogger(__name__)

Ring = Callable[[str, Grant], None]
"""Called with (token, grant) for every grant rung on a channel."""

RECONNECT_DELAY_S = 0.5


class Doorbell:
    """Subscriptions of one client: ``watch``/``unwatch`` channels, rings routed
    to one callback per channel. Holds one connection while anything is watched.
    """

    def __init__(self, client: Callable[[], AsyncClient | None]) -> None:
        self._client = client  # a weak reference, as the hub holds it
        self._handlers: dict[str, Ring] = {}
        self._confirmed: dict[str, asyncio.Event] = {}
        self._pubsub: PubSub | None = None
        self._reader: asyncio.Task[None] | None = None
        self._change = asyncio.Lock()

    async def watch(self, channel: str, ring: Ring) -> None:
        """Subscribe to ``channel`` and return once Redis confirmed it, so that no
        grant published after this returns can be missed.

        Raises:
            redis.exceptions.RedisError: when the subscription fails; the caller
                falls back to polling.
        """
        async with self._change:
            self._handlers[channel] = ring
            confirmed = self._confirmed.setdefault(channel, asyncio.Event())
            if self._pubsub is None:
                client = self._client()
                if client is None:
                    raise RuntimeError("the doorbell's Redis client was garbage-collected")
                # On Redis Cluster this is a ClusterPubSub: its one connection
                # goes to the master owning the first channel's slot, and the
                # channels of all other locks ride on it too, which is right
                # for classic (not sharded) pub/sub: a PUBLISH, also one made
                # by a script, is broadcast to every node of the cluster.
                self._pubsub = client.pubsub()
            await self._pubsub.subscribe(channel)
            if self._reader is None or self._reader.done():
                self._reader = asyncio.create_task(self._read(self._pubsub))
        await confirmed.wait()

    async def unwatch(self, channel: str, ring: Ring) -> None:
        """Stop routing ``channel`` to ``ring``; drop the connection when nothing is
        watched. Does nothing if the channel was watched again by another ring."""
        async with self._change:
            if self._handlers.get(channel) != ring:
                return
            del self._handlers[channel]
            self._confirmed.pop(channel, None)
            pubsub = self._pubsub
            if pubsub is None:
                return
            if self._handlers:
                try:
                    await pubsub.unsubscribe(channel)
                except RedisError:
                    log.debug("doorbell: unsubscribe from %s failed", channel, exc_info=True)
                return
            self._pubsub, reader, self._reader = None, self._reader, None
        await _stop(reader, pubsub)

    async def aclose(self) -> None:
        """Drop every subscription and the connection."""
        async with self._change:
            self._handlers.clear()
            self._confirmed.clear()
            pubsub, self._pubsub = self._pubsub, None
            reader, self._reader = self._reader, None
        if pubsub is not None:
            await _stop(reader, pubsub)

    async def _read(self, pubsub: PubSub) -> None:
        while True:
            try:
                message = await pubsub.get_message(timeout=None)
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError):
                log.debug("doorbell connection lost; reconnecting", exc_info=True)
                await asyncio.sleep(RECONNECT_DELAY_S)
                continue
            if message is not None:
                self._dispatch(message)

    def _dispatch(self, message: dict[str, object]) -> None:
        channel = _text(message["channel"])
        if message["type"] == "subscribe":
            confirmed = self._confirmed.get(channel)
            if confirmed is not None:
                confirmed.set()
        elif message["type"] == "message":
            ring = self._handlers.get(channel)
            if ring is None:
                return
            token, fence, ticket, pttl_ms = _text(message["data"]).split(" ")
            ring(token, Grant(int(fence), int(ticket), int(pttl_ms)))


async def _stop(reader: asyncio.Task[None] | None, pubsub: PubSub) -> None:
    if reader is not None:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    try:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
    except RedisError:
        log.debug("doorbell: closing the pub/sub connection failed", exc_info=True)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
