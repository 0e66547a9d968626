"""A TCP fault proxy between test clients and a private Redis server.

``FaultProxy`` listens on ``127.0.0.1`` (a free port) and forwards every
connection it accepts to one target address, byte for byte, in both
directions. A test steers each direction separately, at any moment:

* ``delay(direction, ms)``: every byte is delivered ``ms`` milliseconds after
  it arrived (order kept);
* ``hold(direction)``: black-hole: bytes are read from the sender (so it sees
  them accepted) and kept, not delivered; ``current_only=True`` holds only the
  connections open now, so a client that reconnects (redis-py's retry) gets
  through while the original bytes wait;
* ``release(direction, after_ms=..., deliver=...)``: the held bytes go out
  (late, in order) or are dropped; never calling it holds them for good;
* ``reset()``: every open connection is closed with a TCP RST on both sides;
* ``accepted`` and ``open`` count connections (ever accepted, open now).

``hold_the_subscription_only`` makes a client's one pub/sub connection
half-open, and no other; ``lose_the_reconnection_handshake`` and
``watch_through_a_lost_handshake`` leave redis-py waiting for a reconnection's
handshake reply that never comes.

``"up"`` is client to server, ``"down"`` server to client. With a hold on
``"up"`` a command never reaches Redis until released; with a hold on
``"down"`` Redis runs it and the reply is lost or late - which is what makes
redis-py time out and re-send a script whose first copy ran (or arrives later).

The proxy runs its own event loop in a daemon thread, so a test that blocks
its own loop (``time.sleep``) does not stop the traffic of other clients. It is
bounded: at most ``max_connections`` connections at once (more are refused),
and at most ``max_buffered_bytes`` waiting per direction of a connection (the
sender is then no longer read from, as TCP would push back). ``close()``
(called by the ``fault_proxy`` fixture at teardown) resets every connection,
stops listening and ends the thread.

Control methods are called from any thread except the proxy's own; each
returns once the proxy loop applied the change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from redis_fifo_lock.doorbell import CONFIRM_TIMEOUT_S, Doorbell
from redis_fifo_lock.waiting import hub_for
from tests.support.polling import until

if TYPE_CHECKING:
    from redis.asyncio.client import PubSub

    from redis_fifo_lock.doorbell import Ring
    from redis_fifo_lock.protocol import Grant

Direction = Literal["up", "down"]
"""``"up"``: client to server; ``"down"``: server to client."""

DIRECTIONS: tuple[Direction, Direction] = ("up", "down")
LOOPBACK = "127.0.0.1"
CHUNK = 65_536
CONTROL_TIMEOUT_S = 5.0
"""Longest wait for the proxy loop to apply a control call, in seconds."""

T = TypeVar("T")


@dataclass
class _Pipe:
    """One direction of one proxied connection: bytes read from ``source``, kept
    in ``queue`` (with their arrival time) until delivered to ``sink``."""

    direction: Direction
    source: asyncio.StreamReader
    sink: asyncio.StreamWriter
    held: bool
    queue: deque[tuple[float, bytes]] = field(default_factory=deque)
    buffered: int = 0
    eof: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False)  # identity: links live in a set
class _Link:
    """One proxied connection: the client's and the server's streams, two pipes."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    pipes: dict[Direction, _Pipe]
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class FaultProxy:
    """A TCP proxy to ``target_host:target_port`` with per-direction faults.

    Args:
        target_host: address of the server to forward to (loopback only).
        target_port: its port.
        max_connections: connections open at once (int); more are refused.
        max_buffered_bytes: bytes kept per direction of a connection (int)
            before the sender is no longer read.

    Use ``start()`` (or the ``fault_proxy`` fixture), then connect clients to
    ``url`` (or ``host``, ``port``).
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        max_connections: int = 256,
        max_buffered_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        if target_host not in (LOOPBACK, "localhost", "::1"):
            raise ValueError(f"the fault proxy forwards to loopback only, not {target_host!r}")
        self.target = (target_host, target_port)
        self.max_connections = max_connections
        self.max_buffered_bytes = max_buffered_bytes
        self.host = LOOPBACK
        self.port = 0
        self.accepted = 0
        """Connections accepted since start (int)."""
        self.refused = 0
        """Connections refused because ``max_connections`` were open (int)."""
        self._delay_s: dict[Direction, float] = {"up": 0.0, "down": 0.0}
        self._hold_new: dict[Direction, bool] = {"up": False, "down": False}
        self._links: set[_Link] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None

    def __repr__(self) -> str:
        return (
            f"<FaultProxy {self.host}:{self.port} -> {self.target[0]}:{self.target[1]} "
            f"open={self.open} accepted={self.accepted}>"
        )

    # --- life cycle ------------------------------------------------------------------

    def start(self) -> FaultProxy:
        """Start listening on a free loopback port; returns ``self``.

        Raises:
            RuntimeError: the proxy could not start within a few seconds.
        """
        if self._thread is not None:
            raise RuntimeError("the fault proxy was started already")
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(CONTROL_TIMEOUT_S) or self._failure is not None:
            raise RuntimeError(f"the fault proxy did not start: {self._failure!r}")
        return self

    def close(self) -> None:
        """Reset every connection, stop listening and end the thread. Idempotent."""
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop ended meanwhile
                loop.call_soon_threadsafe(stopping.set)
        if self._thread is not None:
            self._thread.join(CONTROL_TIMEOUT_S)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        """``redis://`` URL of database 0 through the proxy."""
        return f"redis://{self.host}:{self.port}/0"

    @property
    def open(self) -> int:
        """Connections open now (int)."""
        return len(self._links)

    def client_ports(self) -> set[int]:
        """The client-side ports of the connections open now."""
        return self._call(self._client_ports)

    # --- faults ----------------------------------------------------------------------

    def delay(self, direction: Direction, ms: float) -> None:
        """Deliver the bytes of ``direction`` ``ms`` milliseconds after they arrive
        (0 for no delay), on every connection, now and later."""
        if ms < 0:
            raise ValueError(f"delay must be >= 0 ms, got {ms!r}")
        self._call(self._set_delay, direction, ms / 1000)

    def hold(self, direction: Direction, *, current_only: bool = False) -> None:
        """Keep every byte of ``direction`` from now on, undelivered, until ``release``.

        Args:
            direction: ``"up"`` or ``"down"``.
            current_only: hold only the connections open now; connections made
                later (a client's reconnection) pass freely.
        """
        self._call(self._set_hold, direction, current_only)

    def release(self, direction: Direction, *, after_ms: float = 0, deliver: bool = True) -> None:
        """End the hold on ``direction``: the held bytes go out in order (``deliver``)
        or are dropped. With ``after_ms`` the hold ends that many milliseconds
        from now (this call returns at once)."""
        self._call(self._schedule_release, direction, after_ms / 1000, deliver)

    def reset(self) -> int:
        """Close every open connection with a TCP RST on both sides; returns how many."""
        return self._call(self._reset_all)

    def held_bytes(self, direction: Direction) -> int:
        """Bytes of ``direction`` received and not yet delivered, over all connections."""
        return self._call(self._count_held, direction)

    # --- the proxy loop ----------------------------------------------------------------

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)  # this thread's own loop
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported by start() if it happens there
            self._failure = exc
            self._ready.set()
        finally:
            left = asyncio.all_tasks(loop)
            for task in left:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            await self._stopping.wait()
        finally:
            self._server.close()
            self._reset_all()
            await self._server.wait_closed()

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the proxy loop and return its result."""
        loop = self._loop
        if loop is None or not self._ready.is_set():
            raise RuntimeError("the fault proxy is not running: call start() first")
        if threading.current_thread() is self._thread:
            raise RuntimeError("fault proxy controls must not be called from its own thread")

        async def call() -> T:
            return fn(*args)

        future = asyncio.run_coroutine_threadsafe(call(), loop)
        return future.result(CONTROL_TIMEOUT_S)

    def _pipes(self, direction: Direction) -> list[_Pipe]:
        return [link.pipes[direction] for link in self._links]

    def _set_delay(self, direction: Direction, seconds: float) -> None:
        self._delay_s[direction] = seconds
        for pipe in self._pipes(direction):
            pipe.changed.set()

    def _set_hold(self, direction: Direction, current_only: bool) -> None:
        if not current_only:
            self._hold_new[direction] = True
        for pipe in self._pipes(direction):
            pipe.held = True

    def _schedule_release(self, direction: Direction, after_s: float, deliver: bool) -> None:
        if after_s > 0:
            assert self._loop is not None
            self._loop.call_later(after_s, self._release_now, direction, deliver)
        else:
            self._release_now(direction, deliver)

    def _release_now(self, direction: Direction, deliver: bool) -> None:
        self._hold_new[direction] = False
        for pipe in self._pipes(direction):
            if not deliver:
                pipe.queue.clear()
                pipe.buffered = 0
            pipe.held = False
            pipe.changed.set()

    def _client_ports(self) -> set[int]:
        return {link.client.get_extra_info("peername")[1] for link in self._links}

    def _count_held(self, direction: Direction) -> int:
        return sum(pipe.buffered for pipe in self._pipes(direction))

    def _reset_all(self) -> int:
        links = list(self._links)
        for link in links:
            self._drop(link, rst=True)
        return len(links)

    def _drop(self, link: _Link, *, rst: bool) -> None:
        """Close both sides of ``link`` (with a RST if ``rst``) and stop its pumps."""
        if link not in self._links:
            return
        self._links.discard(link)
        for writer in (link.client, link.server):
            if rst:
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        linger = struct.pack("ii", 1, 0)  # close with a RST
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                writer.transport.abort()
            else:
                writer.close()
        current = asyncio.current_task()
        for task in link.tasks:
            if task is not current:
                task.cancel()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._links) >= self.max_connections:
            self.refused += 1
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()  # the server is gone: so is this connection
            return
        self.accepted += 1
        pipes: dict[Direction, _Pipe] = {
            "up": _Pipe("up", reader, up_writer, self._hold_new["up"]),
            "down": _Pipe("down", up_reader, writer, self._hold_new["down"]),
        }
        link = _Link(writer, up_writer, pipes)
        self._links.add(link)
        for pipe in pipes.values():
            link.tasks.append(asyncio.ensure_future(self._guarded(link, self._read, pipe)))
            link.tasks.append(asyncio.ensure_future(self._guarded(link, self._write, pipe)))

    async def _guarded(
        self, link: _Link, pump: Callable[[_Pipe], Coroutine[Any, Any, None]], pipe: _Pipe
    ) -> None:
        """Run one pump; a connection error on either side closes the whole link.
        The pump's coroutine is made here, so a link reset before its tasks
        first ran leaves no coroutine never awaited."""
        try:
            await pump(pipe)
        except (OSError, asyncio.IncompleteReadError):
            self._drop(link, rst=True)
            return
        if all(pipe.eof and not pipe.queue for pipe in link.pipes.values()):
            self._drop(link, rst=False)  # both sides said goodbye and all was delivered

    async def _read(self, pipe: _Pipe) -> None:
        """Take bytes from the sender as they come, stamped with their arrival."""
        while True:
            while pipe.buffered >= self.max_buffered_bytes:
                pipe.changed.clear()
                await pipe.changed.wait()  # backpressure: the writer drains first
            data = await pipe.source.read(CHUNK)
            if not data:
                pipe.eof = True
                pipe.changed.set()
                return
            pipe.queue.append((time.monotonic(), data))
            pipe.buffered += len(data)
            pipe.changed.set()

    async def _write(self, pipe: _Pipe) -> None:
        """Deliver queued bytes in order, once due and not held; forward the EOF."""
        while True:
            if pipe.held or not pipe.queue:
                if pipe.eof and not pipe.queue:
                    with contextlib.suppress(OSError):
                        if pipe.sink.can_write_eof():
                            pipe.sink.write_eof()
                    return
                pipe.changed.clear()
                await pipe.changed.wait()
                continue
            arrived, data = pipe.queue[0]
            wait_s = arrived + self._delay_s[pipe.direction] - time.monotonic()
            if wait_s > 0:
                pipe.changed.clear()
                # Woken early by a change (a hold, a new delay): look again.
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(pipe.changed.wait(), wait_s)
                continue
            pipe.queue.popleft()
            pipe.buffered -= len(data)
            pipe.changed.set()
            pipe.sink.write(data)
            await pipe.sink.drain()


class OutageEndsAtRetry(logging.Handler):
    """A handler for the ``redis_fifo_lock`` logger: when a release's first try
    is reported failed ("trying again"), ``proxy`` lets connections through
    again (an outage refused by ``max_connections = 0`` that ends within the
    release's retries), then ``then()`` runs, if given."""

    def __init__(self, proxy: FaultProxy, then: Callable[[], object] | None = None) -> None:
        super().__init__()
        self.proxy = proxy
        self.then = then

    def emit(self, record: logging.LogRecord) -> None:
        if "trying again" in record.getMessage():
            self.proxy.max_connections = 256
            if self.then is not None:
                self.then()


def taken_for_dead(doorbell: Doorbell) -> list[str]:
    """What ``doorbell`` found unanswered each time, from now on, it took its
    subscription's connection for dead (``Doorbell._rebuild``: every watched
    group polls, and a new connection is tried). A count of the connections a
    proxy accepted would also count a pooled one opened after a call was cut
    short on a slow link, and a rebuild that could not connect changes no
    subscription on the server."""
    taken: list[str] = []
    rebuild = doorbell._rebuild

    def recorded(silent: PubSub, what: str, waited_s: float) -> None:
        taken.append(what)
        rebuild(silent, what, waited_s)

    doorbell._rebuild = recorded  # type: ignore[method-assign]
    return taken


async def hold_the_subscription_only(client: Redis, proxy: FaultProxy) -> None:
    """Make ``client``'s lingering pub/sub connection (through ``proxy``)
    half-open: what Redis sends on it is held, and on no other connection.

    Every other connection of the client's pool is closed first, and again until
    the subscription's is the only one open when the hold starts. A command
    still on its way when the pool was first emptied (a wait group's one-off
    ``PUBLISH`` check, on a slow machine) would otherwise go back to the pool
    on a held connection, and the next command would hang on it.

    Raises:
        AssertionError: the client has no subscription open (its channel no
            longer lingers, or it was never watched), or the proxy never had
            its connection open alone (within ``polling.DEADLINE_S``).
    """
    await until(
        partial(_hold_alone, client, proxy, current_only=True),
        "the subscription's connection is open, and the only one open",
    )


async def lose_the_reconnection_handshake(client: Redis, admin: Redis, proxy: FaultProxy) -> None:
    """Cut ``client``'s subscription (through ``proxy``; ``admin`` talks to the
    server directly) and lose Redis's reply to the handshake of the
    reconnection redis-py then makes inside the doorbell's reader, which, on a
    client with no ``socket_timeout``, waits for it for ever. The connection
    stays open. As in ``hold_the_subscription_only``, the subscription's is
    the only connection open when the replies start being held, so no other
    reply is lost.

    Raises:
        AssertionError: as ``hold_the_subscription_only``, or redis-py did not
            reconnect (within ``polling.DEADLINE_S``).
    """
    await until(
        partial(_hold_alone, client, proxy, current_only=False),
        "the subscription's connection is open, and the only one open",
    )
    accepted = proxy.accepted
    await admin.client_kill_filter(_type="pubsub")
    await until(lambda: proxy.accepted > accepted, "redis-py reconnected the subscription")
    await until(lambda: proxy.held_bytes("down") > 0, "the reconnection's handshake was answered")
    proxy.release("down", deliver=False)


async def watch_through_a_lost_handshake(
    admin: Redis, proxy: FaultProxy, doorbell_class: type[Doorbell], *, second_lingers: bool
) -> str | None:
    """Watch a doorbell channel through a SUBSCRIBE that redis-py sends while
    reconnecting, whose handshake reply is lost; what went wrong, or None.

    A ``doorbell_class`` doorbell of a client through ``proxy`` (``admin``
    talks to the server directly), with no ``socket_timeout`` and no retries,
    watches a first channel. Its connection is reset and the reader's
    reconnection refused, so the reader waits to rebuild it; a watch of a
    second channel (new, or lingering: then its SUBSCRIBE is the probe) sent
    meanwhile reconnects inside the call, and the handshake's reply is
    dropped. The watch must return (or fail, as when its SUBSCRIBE went out
    on the broken connection) within ``CONFIRM_TIMEOUT_S`` + 2 s; then both
    channels, the second watched again if its watch failed, must be
    subscribed on a live connection (rebuilt, or reconnected by redis-py) and
    rung.
    """
    client = Redis.from_url(proxy.url, socket_timeout=None, retry=Retry(NoBackoff(), 0))
    rung: list[str] = []

    def ring(token: str, grant: Grant) -> None:
        rung.append(token)

    doorbell = doorbell_class(weakref.ref(client))
    what = "the probe of a lingering channel" if second_lingers else "a new channel's SUBSCRIBE"
    first, second = "fifolock:{unsent}:doorbell:first", "fifolock:{unsent}:doorbell:second"
    try:
        await doorbell.watch(first, ring)
        if second_lingers:
            await doorbell.watch(second, ring)
            await doorbell.unwatch(second, ring)
        proxy.max_connections = 0  # the reader's reconnection is refused
        proxy.reset()
        await until(
            lambda: proxy.refused > 0, "the reader's reconnection was refused", pause_s=0.002
        )
        proxy.hold("down")  # on the connections made from now on, too
        proxy.max_connections = 8
        accepted = proxy.accepted
        started = time.monotonic()
        watching = asyncio.create_task(doorbell.watch(second, ring))
        await until(
            lambda: proxy.accepted > accepted and proxy.held_bytes("down") > 0,
            "the SUBSCRIBE reconnected, and Redis answered its handshake (held)",
            pause_s=0.002,
        )
        proxy.release("down", deliver=False)
        bound = CONFIRM_TIMEOUT_S + 2.0
        done, _ = await asyncio.wait({watching}, timeout=bound + 8.0)
        if not done:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
            return f"a watch behind {what} never returned: its lost handshake held it"
        took = time.monotonic() - started
        if took > bound:
            return f"a watch behind {what} returned after {took:.2f} s (bound {bound:g} s)"
        failed = watching.exception()
        if failed is not None:
            if not isinstance(failed, RedisConnectionError):
                return f"a watch behind {what} raised {failed!r}"
            # Its SUBSCRIBE went out on the broken connection: as a lock's wait
            # does, stop watching, poll, and watch again at a later wait.
            await doorbell.unwatch(second, ring)
            await until(partial(_watched, doorbell, second, ring), "a later watch succeeded")
        await until(
            lambda: all(doorbell.steady_since(c) is not None for c in (first, second)),
            "both channels were subscribed again on a live connection",
        )
        for channel in (first, second):
            await admin.publish(channel, f"{channel[-5:]} 5 7 1000 call 0 " + "a" * 40)
        await until(lambda: len(rung) == 2, "both channels were rung")
        return None
    finally:
        await doorbell.aclose()
        await client.aclose()


async def _watched(doorbell: Doorbell, channel: str, ring: Ring) -> bool:
    """Whether ``doorbell`` watches ``channel`` now; a watch that fails is
    undone, as a lock's wait undoes it."""
    try:
        return await doorbell.watch(channel, ring)
    except RedisConnectionError:
        await doorbell.unwatch(channel, ring)
        return False


async def _hold_alone(client: Redis, proxy: FaultProxy, *, current_only: bool) -> bool:
    """Close the idle connections of ``client``'s pool and, if its subscription's
    is then the only one open through ``proxy``, hold what Redis sends (on that
    connection, or also on later ones: ``current_only``). Whether it is held;
    not while the subscription has no connection yet (a waiter is queued
    before its wait group's SUBSCRIBE even connects, on a slow machine)."""
    pubsub = hub_for(client).doorbell._pubsub
    writer = getattr(getattr(pubsub, "connection", None), "_writer", None)
    if writer is None:
        return False
    await client.connection_pool.disconnect(inuse_connections=False)
    only = {int(writer.get_extra_info("sockname")[1])}
    if proxy.client_ports() != only:
        return False
    proxy.hold("down", current_only=current_only)
    if proxy.client_ports() == only:
        return True
    proxy.release("down")  # another opened meanwhile: held with it
    return False
