"""Faults the adversarial scenarios inject into a server or a contender's
connections, shared by several scenario modules."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from tests.adversarial.arena import Arena
from tests.support.record import Record

KEY_PARTS = ("queue", "waiters", "alive", "lease", "counters", "finished")


async def kill_connections(arena: Arena, who: str) -> int:
    """``CLIENT KILL`` every connection of contender ``who``; returns how many."""
    victims = [c for c in await arena.admin.client_list() if c.get("name") == f"adv-{who}"]
    for entry in victims:
        await arena.admin.client_kill_filter(_id=entry["id"])
    return len(victims)


async def pause_server(admin: Redis, faults: Record, pause_ms: int) -> None:
    """``CLIENT PAUSE ALL`` for ``pause_ms`` and wait it out; recorded as a fault."""
    faults.fault("pause", f"{pause_ms}ms")
    await admin.execute_command("CLIENT", "PAUSE", pause_ms, "ALL")  # type: ignore[no-untyped-call]
    await asyncio.sleep(pause_ms / 1000)  # the fault itself: the server is paused


async def not_redis_server(*, answer: bool) -> tuple[asyncio.AbstractServer, int]:
    """A TCP server on 127.0.0.1 that is not Redis: it answers like an HTTP server
    (``answer``) or accepts and never answers. Returns (server, port)."""

    async def http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(64)
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 16)  # reads and never answers

    server = await asyncio.start_server(http if answer else silent, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]
