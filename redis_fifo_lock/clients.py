"""One async Redis client per event loop and process: ``LoopClients``.

A ``redis.asyncio`` client's connections belong to the event loop that opened
them. A client cached in a global outlives its loop, and the next loop that
uses it fails with "RuntimeError: Event loop is closed" - which is exactly what
``async_to_sync`` (Django, Celery, management commands) produces, since it runs
each call on a new loop. ``LoopClients`` keeps one client per running loop,
builds a new one after ``fork()``, and closes each client when its loop closes.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis

Cleanup = Callable[[], Awaitable[object]]

_cleanups: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[Cleanup]] = (
    weakref.WeakKeyDictionary()
)


def at_loop_close(loop: asyncio.AbstractEventLoop, cleanup: Cleanup) -> None:
    """Run ``cleanup()`` on ``loop`` just before ``loop.close()`` closes it.

    The first registration on a loop wraps its ``close`` method (as
    channels_redis does); loops that refuse the wrapper (uvloop) just skip the
    cleanups, and the clients are closed by garbage collection instead.
    """
    pending = _cleanups.get(loop)
    if pending is not None:
        pending.append(cleanup)
        return
    _cleanups[loop] = [cleanup]
    original_close = loop.close

    def close() -> None:
        for_loop = _cleanups.pop(loop, [])
        try:
            if for_loop and not loop.is_running() and not loop.is_closed():
                loop.run_until_complete(_run_all(for_loop))
        finally:
            original_close()

    try:
        loop.close = close  # type: ignore[method-assign]
    except (AttributeError, TypeError):
        del _cleanups[loop]


async def _run_all(cleanups: list[Cleanup]) -> None:
    await asyncio.gather(*(step() for step in cleanups), return_exceptions=True)


class LoopClients:
    """Builds and caches one ``redis.asyncio.Redis`` per running event loop.

    Args:
        url: a ``redis://``, ``rediss://`` or ``unix://`` URL; None to build the
            client from ``connection_kwargs`` alone.
        **connection_kwargs: passed to ``Redis.from_url`` (or ``Redis``), e.g.
            ``password``, ``db``, ``ssl``, ``socket_timeout``, ``max_connections``.

    ``client()`` must be called on a running loop. The cache is keyed by the
    loop (weakly) and the process id: a forked child never uses its parent's
    connections. Each client is closed when its loop closes.
    """

    def __init__(self, url: str | None = None, **connection_kwargs: Any) -> None:
        self.url = url
        self.connection_kwargs = connection_kwargs
        self._pid = os.getpid()
        self._guard = threading.Lock()
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Redis] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        return f"<LoopClients {self.url or self.connection_kwargs!r} loops={len(self)}>"

    def __len__(self) -> int:
        """How many loops of this process have a live client (for tests)."""
        return len(self._clients) if self._pid == os.getpid() else 0

    def client(self) -> Redis:
        """The client for the running event loop, created on first use.

        Raises:
            RuntimeError: when called with no running event loop.
        """
        loop = asyncio.get_running_loop()
        with self._guard:
            return self._client_for(loop)

    def _client_for(self, loop: asyncio.AbstractEventLoop) -> Redis:
        if self._pid != os.getpid():
            # Forked: the inherited clients share sockets with the parent. Drop
            # them without closing (closing would disturb the parent's streams).
            self._pid = os.getpid()
            self._clients = weakref.WeakKeyDictionary()
        client = self._clients.get(loop)
        if client is None:
            client = self._build()
            self._clients[loop] = client
            at_loop_close(loop, lambda: self._close(loop))
        return client

    def _build(self) -> Redis:
        if self.url is not None:
            return Redis.from_url(self.url, **self.connection_kwargs)
        return Redis(**self.connection_kwargs)

    async def _close(self, loop: asyncio.AbstractEventLoop) -> None:
        client = self._clients.pop(loop, None)
        if client is not None:
            await client.aclose()

    async def aclose(self) -> None:
        """Close the running loop's client now (it is rebuilt on next use)."""
        await self._close(asyncio.get_running_loop())
