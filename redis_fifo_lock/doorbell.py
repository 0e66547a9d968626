"""The doorbell: one pub/sub subscription per client, shared by all its waiters.

Every grant made by a script is published as ``"<token> <fence> <ticket>
<pttl_ms> <call> <queued> <proof>"`` (the proof signs the rest with a secret of
the acquire call, see ``grant_next`` in lib.lua) on the doorbell channel of the
session that waits for it,
``fifolock:{<name>}:doorbell:<session>``, so a grant wakes only the process it
is for, however many processes wait. A process subscribes to the channel of each
of its wait groups and routes each ring to that group's waiters. The doorbell is
only an optimisation: a lost ring costs latency, never correctness, because
every waiting process also polls (see ``waiting.py``).

When the subscription's connection breaks, redis-py reconnects it (and
subscribes again) before raising the error if the server is still there; the
doorbell then reads on. If not, the doorbell builds a new pub/sub from the
client and subscribes it to every watched channel again, every
``RECONNECT_DELAY_S`` until that works. Rebuilding (rather than letting the
broken pub/sub reconnect to its own address) matters on Redis Cluster: a
``ClusterPubSub`` stays bound to the node it first connected to, which may
never come back after a failover. A new one goes to the node the client's slot
map names for the first channel, and if that fails (the map may still name the
dead node), to each other node the client knows: with classic pub/sub any node
hears every ring.

A ``SUBSCRIBE`` refused by the server (an ACL without ``+subscribe`` or without
the lock's channel pattern) fails that channel's ``watch`` at once with the
server's error; the wait group then reports it (``report_refusal``: one
WARNING per server and rule in the process) and its waiters poll. A ring the
server refuses to a script fails nothing (the script rings with
``redis.pcall``), so ``check_ringing`` tries a ``PUBLISH`` of its own once per
server, user and namespace, and reports an error reply the same way.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import threading
from collections import deque
from collections.abc import Callable

import redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError, ResponseError

from .acl import RULES_HINT, refusal
from .eviction import server_of
from .protocol import AsyncClient, Grant, LockKeys
from .timeouts import within

log = logging.getLogger(__name__)

Ring = Callable[[str, Grant], None]
"""Called with (token, grant) for every grant rung on a channel."""

RECONNECT_DELAY_S = 0.5
"""Pause, in seconds, before a broken subscription is rebuilt (and between tries)."""

RESUBSCRIBE_TIMEOUT_S = 2.0
"""Longest wait, in seconds, for a rebuilt subscription to one node to be sent."""

FAILURES = (RedisError, RedisClusterException, OSError)
"""What a pub/sub call raises when Redis (or a cluster node) cannot be reached.
``RedisClusterException`` (e.g. ``SlotNotCoveredError``) is not a ``RedisError``."""

_warned_no_pubsub: set[type] = set()
"""Client classes already warned about having no asyncio pub/sub, in this process."""

_refusals_reported: set[tuple[object, str]] = set()
"""(server, what to add) pairs already reported at WARNING, in this process."""
_refusals_guard = threading.Lock()

_ringing_checked: set[tuple[object, ...]] = set()
"""(server, user, namespace) whose permission to ring the doorbell this process
has checked, or is checking (``check_ringing``): a handful, one per server and
lock user."""

UNWATCHED_SESSION = "check"
"""A session no waiter has (sessions are hex digits and a dot): the channel of
``check_ringing``'s empty PUBLISH, which nobody hears."""


def _after_fork_in_child() -> None:
    # A thread of the parent may have held the guard at the moment of the fork,
    # and that thread does not exist here to release it.
    global _refusals_guard
    _refusals_guard = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Doorbell:
    """Subscriptions of one client: ``watch``/``unwatch`` channels, rings routed
    to one callback per channel. Holds one connection while anything is watched.
    """

    def __init__(self, client: Callable[[], AsyncClient | None]) -> None:
        self._client = client  # a weak reference, as the hub holds it
        self._handlers: dict[str, Ring] = {}
        # Per channel: done with None once Redis confirmed the subscription, or
        # with the error it refused it with (a result, not an exception, so that
        # an unawaited refusal is not logged as never retrieved).
        self._confirmed: dict[str, asyncio.Future[ResponseError | None]] = {}
        # (command, channel) of each SUBSCRIBE / UNSUBSCRIBE sent and not yet
        # answered, in sending order: Redis answers in that order, and an error
        # reply (an ACL refusal) does not name its channel.
        self._unanswered: deque[tuple[str, str]] = deque()
        self._pubsub: PubSub | None = None
        self._reader: asyncio.Task[None] | None = None
        self._change = asyncio.Lock()

    async def watch(self, channel: str, ring: Ring) -> bool:
        """Subscribe to ``channel`` and return True once Redis confirmed it, so that
        no grant published after this returns can be missed.

        Returns False at once, subscribing nothing, when the client has no
        asyncio pub/sub at all (``redis.asyncio.RedisCluster`` before redis-py
        8.0): its waiters rely on polling. A warning says so once per process.

        Raises:
            redis.exceptions.ResponseError: the server refused the subscription
                (e.g. ``NoPermissionError``: its ACL); the caller reports it
                (``report_refusal``), falls back to polling and calls ``unwatch``.
            redis.exceptions.RedisError, redis.exceptions.RedisClusterException,
            OSError: when the subscription fails; the caller falls back to polling
                and calls ``unwatch``.
        """
        async with self._change:
            if self._pubsub is None:
                factories = self._factories()
                if not factories:
                    return False
                self._pubsub = factories[0]()
            self._handlers[channel] = ring
            confirmed = self._confirmed.get(channel)
            if confirmed is None or (confirmed.done() and confirmed.result() is not None):
                confirmed = self._confirmed[channel] = asyncio.get_running_loop().create_future()
            # Before sending: the reply may be read while the send still awaits.
            self._unanswered.append(("subscribe", channel))
            try:
                await self._pubsub.subscribe(channel)
            except BaseException:
                _forget(self._unanswered, ("subscribe", channel))
                raise
            if self._reader is None or self._reader.done():
                self._reader = asyncio.create_task(self._read())
        # Shielded: the future is shared by every watch of the channel, and the
        # caller's timeout must not cancel it for the others.
        refused = await asyncio.shield(confirmed)
        if refused is not None:
            raise refused
        return True

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
                self._unanswered.append(("unsubscribe", channel))
                try:
                    await pubsub.unsubscribe(channel)
                except FAILURES:
                    _forget(self._unanswered, ("unsubscribe", channel))
                    log.debug("doorbell: unsubscribe from %s failed", channel, exc_info=True)
                return
            self._pubsub, reader, self._reader = None, self._reader, None
            self._unanswered.clear()
        await _stop(reader, pubsub)

    @property
    def active(self) -> bool:
        """Whether the doorbell holds a subscription (and so a connection and a reader)."""
        return self._pubsub is not None

    async def aclose(self) -> None:
        """Drop every subscription and the connection, and stop the reader."""
        async with self._change:
            self._handlers.clear()
            self._confirmed.clear()
            self._unanswered.clear()
            pubsub, self._pubsub = self._pubsub, None
            reader, self._reader = self._reader, None
        if pubsub is not None:
            await _stop(reader, pubsub)

    def _factories(self) -> list[Callable[[], PubSub]]:
        """Ways to make a new, unsubscribed pub/sub of the client, best first:
        the client's own choice, then on a cluster one bound to each node the
        client knows. Empty when the client has no pub/sub (warned once)."""
        client = self._client()
        if client is None:
            raise RuntimeError("the doorbell's Redis client was garbage-collected")
        make = getattr(client, "pubsub", None)
        if make is None:
            _warn_no_pubsub(client)
            return []
        # On Redis Cluster this is a ClusterPubSub: its one connection goes to
        # the master owning the first channel's slot, and the channels of all
        # other locks ride on it too, which is right for classic (not sharded)
        # pub/sub: a PUBLISH, also one made by a script, is broadcast to every
        # node of the cluster, replicas included.
        factories: list[Callable[[], PubSub]] = [make]
        if isinstance(client, RedisCluster):
            factories += [functools.partial(make, node=node) for node in client.get_nodes()]
        return factories

    async def _read(self) -> None:
        """Route rings until cancelled, rebuilding the subscription when it breaks."""
        failures = 0
        while True:
            pubsub = self._pubsub
            if pubsub is None:
                return
            try:
                message = await pubsub.get_message(timeout=None)
            except asyncio.CancelledError:
                raise
            except ResponseError as exc:
                # An error reply: the server refused a SUBSCRIBE or UNSUBSCRIBE
                # (its ACL); the connection is fine, and resubscribing would only
                # be refused again.
                failures = 0
                self._refused(exc)
                continue
            except FAILURES:
                failures += 1
                if failures == 1 and _connected(pubsub):
                    # redis-py reconnected it (subscribing again) before raising
                    # the error: read on, rings may be waiting in it already.
                    continue
                log.debug("doorbell connection lost; resubscribing", exc_info=True)
                await asyncio.sleep(RECONNECT_DELAY_S)
                await self._resubscribe(pubsub)
                continue
            failures = 0
            if message is not None:
                self._dispatch(message)
                if message["type"] == "message":
                    # A ring woke a waiter, which is to hold the lock now: it
                    # runs before this reader reads on, for until it runs the
                    # lock serves nobody.
                    await asyncio.sleep(0)

    async def _resubscribe(self, broken: PubSub) -> None:
        """Replace ``broken`` by a new pub/sub subscribed to every watched channel.

        On failure ``broken`` stays in place: the reader reads it again (it may
        reconnect by itself) and comes back here after the next delay.
        """
        async with self._change:
            channels = list(self._handlers)
            if self._pubsub is not broken or not channels:
                return  # closed or replaced meanwhile, or about to be dropped
            fresh = await self._subscribed(channels)
            if fresh is None:
                return
            self._pubsub = fresh
            # The broken connection's replies never come; the new one answers
            # (confirms or refuses) each channel's SUBSCRIBE, in this order.
            self._unanswered = deque(("subscribe", channel) for channel in channels)
            await _close(broken)
        log.info("doorbell: subscription rebuilt for %d channel(s)", len(channels))

    async def _subscribed(self, channels: list[str]) -> PubSub | None:
        """The first new pub/sub that subscribed to ``channels``; None if none did."""
        for factory in self._factories():
            try:
                fresh = factory()
            except FAILURES:  # e.g. a node the client dropped meanwhile
                continue
            try:
                await within(fresh.subscribe(*channels), RESUBSCRIBE_TIMEOUT_S)
            except BaseException as exc:
                await _close(fresh)
                if isinstance(exc, (*FAILURES, asyncio.TimeoutError)):
                    log.debug("doorbell: resubscribing failed; next node", exc_info=True)
                    continue
                raise
            return fresh
        return None

    def _refused(self, exc: ResponseError) -> None:
        """The server answered the oldest unanswered SUBSCRIBE or UNSUBSCRIBE
        with ``exc``: fail that channel's ``watch``, or report it."""
        command, channel = self._unanswered.popleft() if self._unanswered else ("", "")
        confirmed = self._confirmed.get(channel) if command == "subscribe" else None
        if confirmed is not None and not confirmed.done():
            confirmed.set_result(exc)
            return
        # An UNSUBSCRIBE, or a SUBSCRIBE sent again after a reconnection: the
        # channel's waiters already poll, or will at their next poll.
        client = self._client()
        if client is not None:
            report_refusal(client, exc, None, None)

    def _dispatch(self, message: dict[str, object]) -> None:
        channel = _text(message["channel"])
        if message["type"] in ("subscribe", "unsubscribe"):
            _forget(self._unanswered, (str(message["type"]), channel))
        if message["type"] == "subscribe":
            confirmed = self._confirmed.get(channel)
            if confirmed is not None and not confirmed.done():
                confirmed.set_result(None)
        elif message["type"] == "message":
            ring = self._handlers.get(channel)
            if ring is None:
                return
            try:
                token, fence, ticket, pttl_ms, call, queued, proof = _text(message["data"]).split(
                    " "
                )
                if not _PROOF.fullmatch(proof):
                    raise ValueError(proof)
                grant = Grant(int(fence), int(ticket), int(pttl_ms), call, int(queued), proof)
            except ValueError:
                # Not rung by the lock's scripts: ignored (the poll is the truth).
                log.debug("doorbell: ignored a malformed ring on %s", channel)
                return
            try:
                ring(token, grant)
            except Exception:
                # Anyone allowed to PUBLISH here can send anything: whatever one
                # message does, the reader goes on serving every lock's waiters.
                log.exception("doorbell: a ring on %s could not be handled", channel)


def report_refusal(
    client: AsyncClient, exc: ResponseError, keys: LockKeys | None, poll_ms: int | None
) -> None:
    """Log that the server refused the doorbell ``exc``, naming the rule to add:
    at WARNING once per server and rule in this process, then at DEBUG.

    Args:
        client: the client whose server refused.
        exc: the server's refusal.
        keys: the keys of the lock whose channel was refused (for its name and
            namespace), or None when not known (an UNSUBSCRIBE, a resubscription).
        poll_ms: how often that lock's waiters poll (int), or None.
    """
    namespace = keys.namespace if keys is not None else ""
    refused = refusal(str(exc), namespace) or f"the server refused it: {exc}"
    server = server_of(client) or ("client", id(client))
    with _refusals_guard:
        first = (server, refused) not in _refusals_reported
        _refusals_reported.add((server, refused))
    who = f"FIFO lock {keys.name!r}" if keys is not None else "FIFO locks"
    waits = f"up to poll_ms, {poll_ms} ms" if poll_ms is not None else "up to poll_ms"
    log.log(
        logging.WARNING if first else logging.DEBUG,
        "%s: Redis's ACL refused the doorbell (%s): %s to the lock user's ACL rules. "
        "Until then grants are not rung, and each hand-off waits for the next "
        "waiter's poll (%s); %s",
        who,
        exc,
        refused,
        waits,
        RULES_HINT,
    )


async def check_ringing(client: AsyncClient, keys: LockKeys, poll_ms: int) -> bool:
    """Check that Redis lets the lock ring its doorbell: ``PUBLISH`` an empty
    message, as the scripts do to ring a grant, on a channel of ``keys`` that
    nobody hears. Made once per server, user and namespace in this process
    (``claim_ringing_check``).

    A script rings with ``redis.pcall``, so a refused ring fails nothing and
    says nothing, and every hand-off to another process then waits for that
    waiter's poll. An error reply here (an ACL refusal, or a server whose
    ``PUBLISH`` was renamed away) is reported like a refused subscription
    (``report_refusal``: a WARNING per server and rule, naming the rule to add).

    Returns:
        True once Redis answered (the check is made); False when it could not
        be reached (the caller drops its claim, and a later wait checks).
    """
    try:
        await client.publish(keys.doorbell_of(UNWATCHED_SESSION), "")
    except ResponseError as exc:
        if refusal(str(exc), keys.namespace) is not None:
            report_refusal(client, exc, keys, poll_ms)
        else:
            log.warning(
                "FIFO lock %r: Redis refused PUBLISH on the lock's doorbell channel (%s); "
                "grants are not rung, and each hand-off waits for the next waiter's poll "
                "(up to poll_ms, %d ms). The lock needs PUBLISH (check rename-command)",
                keys.name,
                exc,
                poll_ms,
            )
    except FAILURES:
        return False
    return True


def claim_ringing_check(client: AsyncClient, keys: LockKeys) -> bool:
    """Whether ``check_ringing`` is still to be made for ``client``'s server and
    user and the namespace of ``keys`` in this process. If so, the caller makes
    it, and it counts as made for everyone else, unless the caller hands it
    back (``drop_ringing_check``) because it could not make it."""
    identity = _ringing_identity(client, keys)
    with _refusals_guard:
        if identity in _ringing_checked:
            return False
        _ringing_checked.add(identity)
        return True


def drop_ringing_check(client: AsyncClient, keys: LockKeys) -> None:
    """Hand back a ``claim_ringing_check`` whose check was not made: the next
    wait makes it."""
    with _refusals_guard:
        _ringing_checked.discard(_ringing_identity(client, keys))


def _ringing_identity(client: AsyncClient, keys: LockKeys) -> tuple[object, ...]:
    # Not the client's identity: a process may make clients without end. All
    # clusters share one entry (a cluster has no one server).
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    user = kwargs.get("username") if isinstance(kwargs, dict) else None
    return (server_of(client) or ("cluster",), user, keys.namespace)


def _forget(unanswered: deque[tuple[str, str]], entry: tuple[str, str]) -> None:
    """Drop the first ``entry`` from ``unanswered``, if there."""
    if entry in unanswered:
        unanswered.remove(entry)


def _warn_no_pubsub(client: AsyncClient) -> None:
    kind = type(client)
    if kind in _warned_no_pubsub:
        return
    _warned_no_pubsub.add(kind)
    log.warning(
        "redis-py %s's asyncio %s has no pubsub() (it came in redis-py 8.0): FIFO locks "
        "on it work without the doorbell, and each hand-off waits for the next waiter's "
        "poll (up to poll_ms); upgrade redis-py for immediate hand-offs",
        redis.__version__,
        kind.__name__,
    )


def _connected(pubsub: PubSub) -> bool:
    connection = pubsub.connection
    return connection is not None and bool(connection.is_connected)


async def _close(pubsub: PubSub) -> None:
    try:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
    except FAILURES:
        log.debug("doorbell: closing the pub/sub connection failed", exc_info=True)


async def _stop(reader: asyncio.Task[None] | None, pubsub: PubSub) -> None:
    if reader is not None:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    await _close(pubsub)


_PROOF = re.compile(r"[0-9a-f]{40}")
"""A ring's proof, as the scripts write it: a SHA-1 digest in lower-case hex."""


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
