"""One object per event loop and process: ``LoopContext``, found with ``loop_context()``.

A ``redis.asyncio`` client, and all that is built on it (a ``Hub``'s doorbell,
lanes and tasks, a lease's renewal timer), belongs to the event loop it was
made on. Everything this process keeps per loop lives in that loop's
``LoopContext``: the clients ``LoopClients`` built for it, the hubs, and the
renewals to hand over to the portal loop when it closes. ``loop_context()`` is
the one way in: it looks the running loop up and, on a miss, creates the
context and wraps the loop's ``close`` once, so that the context is closed
(``aclose()``) and forgotten when the loop closes - as ``asyncio.run`` and
every ``async_to_sync`` call do. The registry is per process: a forked child
starts with none, and never uses or closes its parent's connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import weakref
from typing import TYPE_CHECKING

from . import native
from .protocol import AsyncClient

if TYPE_CHECKING:
    from .clients import LoopClients
    from .doorbell import Doorbell
    from .renewal import Renewal
    from .waiting import Hub


class LoopContext:
    """What this process keeps for one event loop. Used on that loop's thread only.

    Attributes:
        pid: the process (int) the context belongs to.
        clients: the client each ``LoopClients`` built for the loop.
        hubs: the ``Hub`` of each client used on the loop (by client, held weakly).
        renewals: the renewals running on the loop for leases acquired through a
            ``LoopClients``; they move to the portal loop when the loop closes
            (held weakly).
        doorbells: every hub's doorbell (held weakly), so that a subscription
            still lingering when its client (and so its hub) was dropped is
            closed with the loop too.
    """

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.clients: dict[LoopClients, AsyncClient] = {}
        self.hubs: weakref.WeakKeyDictionary[AsyncClient, Hub] = weakref.WeakKeyDictionary()
        self.renewals: weakref.WeakSet[Renewal] = weakref.WeakSet()
        self.doorbells: weakref.WeakSet[Doorbell] = weakref.WeakSet()

    @property
    def owns_anything(self) -> bool:
        """Whether ``aclose()`` has anything to do (clients to close, renewals to
        hand over)."""
        return (
            bool(self.clients)
            or len(self.renewals) > 0
            or any(hub.busy for hub in list(self.hubs.values()))
            or any(doorbell.active for doorbell in list(self.doorbells))
        )

    async def aclose(self) -> None:
        """Do the releases and withdrawals the hubs still owe Redis
        (``Hub.finish``), hand the renewals of the leases still held over to the
        portal loop, stop the hubs' own tasks (doorbell readers, withdrawers:
        ``Hub.aclose``) and the doorbells of hubs dropped with their client,
        then close the clients (and the Sentinel connections
        they were found through). Never raises: what fails to close is left to
        garbage collection."""
        # The context stays in use meanwhile: a release finishing here looks up
        # its hub and client through it.
        await asyncio.gather(
            *(hub.finish() for hub in list(self.hubs.values())), return_exceptions=True
        )
        renewals, self.renewals = list(self.renewals), weakref.WeakSet()
        await asyncio.gather(*(renewal.hand_over() for renewal in renewals), return_exceptions=True)
        hubs, self.hubs = list(self.hubs.values()), weakref.WeakKeyDictionary()
        await asyncio.gather(*(hub.aclose() for hub in hubs), return_exceptions=True)
        doorbells, self.doorbells = list(self.doorbells), weakref.WeakSet()
        await asyncio.gather(*(doorbell.aclose() for doorbell in doorbells), return_exceptions=True)
        clients, self.clients = list(self.clients.values()), {}
        await asyncio.gather(*(close_client(client) for client in clients), return_exceptions=True)


async def close_client(client: AsyncClient) -> None:
    """Close ``client``; for a Sentinel master client, its sentinels' clients too."""
    await client.aclose()
    # A client from Sentinel.master_for() keeps its sentinels' clients open.
    manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", ()):
        await sentinel.aclose()


_contexts: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopContext] = (
    weakref.WeakKeyDictionary()
)
_guard = native.lock()


def _after_fork_in_child() -> None:
    # The parent's loops and connections are not the child's; a thread of the
    # parent may have held the guard at the moment of the fork, and that thread
    # does not exist here to release it.
    global _contexts, _guard
    _contexts = weakref.WeakKeyDictionary()
    _guard = native.lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def loop_context() -> LoopContext:
    """The ``LoopContext`` of the running event loop in this process, created on
    first use; it is closed just before the loop closes.

    Raises:
        RuntimeError: no event loop is running.
    """
    loop = asyncio.get_running_loop()
    with _guard:
        context = _contexts.get(loop)
        if context is not None and context.pid == os.getpid():
            return context
        context = _contexts[loop] = LoopContext()
    _close_with(loop)
    return context


def contexts() -> dict[asyncio.AbstractEventLoop, LoopContext]:
    """This process's contexts by loop: a copy, for tests and diagnostics."""
    with _guard:
        return {loop: ctx for loop, ctx in _contexts.items() if ctx.pid == os.getpid()}


def _close_with(loop: asyncio.AbstractEventLoop) -> None:
    """Wrap ``loop.close`` (as channels_redis does) to close the loop's context first.

    A loop that refuses the wrapper (a read-only ``close``) keeps its context
    until it is garbage-collected, and its clients are closed by garbage
    collection too.
    """
    original_close = loop.close

    def close() -> None:
        context = None
        if not loop.is_running() and not loop.is_closed():  # else close() refuses anyway
            with _guard:
                context = _contexts.get(loop)
        try:
            if context is not None and context.pid == os.getpid() and context.owns_anything:
                closing = context.aclose()
                try:
                    loop.run_until_complete(closing)
                except BaseException:
                    closing.close()  # never ran (another loop runs here): left to GC
                    raise
        finally:
            if context is not None:
                with _guard:
                    _contexts.pop(loop, None)
            original_close()

    with contextlib.suppress(AttributeError, TypeError):
        loop.close = close  # type: ignore[method-assign]
