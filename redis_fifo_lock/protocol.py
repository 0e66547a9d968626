"""The Redis side of the lock: key layout, the Lua scripts, and their replies.

Each state transition is one Lua script in ``lua/``, loaded once per server and
run with EVALSHA (reloaded on NOSCRIPT). Each method here runs one script and
turns its reply into a small typed value; redis-py errors become
``RedisUnavailable`` naming the lock. Nothing here keeps state between calls.

A protocol made by ``Protocol.acknowledged(replicas, wait_ms)`` sends the
acquire and renew scripts in one pipeline with ``WAIT replicas wait_ms``, on
the same connection and in the same round trip, and counts a grant or renewal
only when enough replicas acknowledged it (``NotReplicated`` otherwise).
"""

from __future__ import annotations

import asyncio
import codecs
import copy
import functools
import hashlib
import os
import re
import secrets
import sys
from collections.abc import Awaitable, Mapping
from dataclasses import asdict, dataclass
from importlib.resources import files
from typing import Any, NamedTuple, TypeAlias, TypeVar

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    ClusterError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)

from .errors import LockUsageError, NotReplicated, RedisUnavailable
from .memo import cached_attribute
from .settings import LockSettings
from .timeouts import within

AsyncClient: TypeAlias = "Redis | RedisCluster"
"""The clients the lock runs on: one server (``Redis``) or a Redis Cluster."""

CALL_TIMEOUT_S = 5.0
"""Longest wait for Redis's reply to one script call, in seconds (plus
``replica_wait_ms`` when the call waits for replicas), when the client has no
``socket_timeout`` to bound it (redis-py before 8 has none by default;
docs/performance.md advises none on Python 3.11, and ``LoopClients`` builds
its plain clients with none on 3.11+). A client's own
``socket_timeout`` is left to bound its calls, as redis-py does. Not applied
on Python 3.10, where ``within`` runs the call in a task of its own, whose
reply reaches the caller loop iterations later (the next holder then ran
before a release returned, which a test of a blocked loop caught); nor through
``async_timeout`` in the caller's task, which on 3.10 turns a cancellation of
the caller that lands as the bound runs out into a timeout: a waiter's claim
or poll then retried, and a loop's shutdown waited for that waiter for ever."""

T = TypeVar("T")

_NON_LOCAL_KEY = "Script attempted to access a non local key"
"""Start of the error a Redis Cluster node raises inside a script that touches a
key it does not have while the key's slot is migrating (Redis 7 wording)."""

KEY_PREFIX = "fifolock"
"""Prefix of every key and channel the lock uses: ``fifolock:{<name>}:<part>``, or
``<namespace>:fifolock:{<name>}:<part>`` with a namespace."""


@dataclass(frozen=True)
class LockKeys:
    """Names of the lock's keys and doorbell channel, all sharing one hash tag.

    ``{<name>}`` is the Redis Cluster hash tag, so every key lands in one slot.
    ``namespace`` (str, default "": none), checked by the lock, goes in front
    of every key and channel, so that an ACL key pattern such as ``~tenantA:*``
    covers them.
    """

    name: str
    namespace: str = ""

    @cached_attribute
    def _hash(self) -> int:
        return hash((self.name, self.namespace))

    def __hash__(self) -> int:
        # Worked out once: the keys are looked up in a few dicts on every call.
        return self._hash

    def __getstate__(self) -> dict[str, object]:
        # The fields, not the cached values: a str's hash differs from one
        # process to the next.
        return asdict(self)

    def key(self, part: str) -> str:
        """The full Redis key for ``part`` (e.g. ``"queue"``) of this lock."""
        prefix = f"{self.namespace}:{KEY_PREFIX}" if self.namespace else KEY_PREFIX
        return f"{prefix}:{{{self.name}}}:{part}"

    @cached_attribute
    def all(self) -> list[str]:
        """The six keys in the order every script expects them (see lib.lua).

        Built once per ``LockKeys`` (every script call passes them); treat the
        list as read-only.
        """
        parts = ("queue", "waiters", "alive", "lease", "counters", "finished")
        return [self.key(part) for part in parts]

    @cached_attribute
    def wire(self) -> list[bytes]:
        """``all`` in UTF-8, encoded once per ``LockKeys`` (see ``wired``)."""
        return [key.encode() for key in self.all]

    @cached_attribute
    def doorbell(self) -> str:
        """Prefix of the pub/sub channels rung on grants (the scripts derive the
        same from the keys: ``DOORBELL`` in lib.lua)."""
        return self.key("doorbell")

    def doorbell_of(self, session: str) -> str:
        """The channel on which grants to ``session``'s waiters are rung."""
        return f"{self.doorbell}:{session}"


class Script:
    """One Lua script file, with ``lib.lua`` prepended, run by SHA."""

    def __init__(self, filename: str) -> None:
        folder = files(__package__) / "lua"
        self.filename = filename
        self.source = (folder / "lib.lua").read_text() + "\n" + (folder / filename).read_text()
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()
        # The commands it calls, named when Redis's ACL refuses one of them
        # without saying which (Redis 6.2 and 7.0).
        called = re.findall(r"redis\.p?call\('([A-Za-z]+)'", self.source)
        self.commands = tuple(dict.fromkeys(command.lower() for command in called))

    async def run(self, client: AsyncClient, keys: list[bytes], args: list[bytes]) -> Any:
        """EVALSHA the script; EVAL it (which caches it) if the server does not know it."""
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            # EVAL, not SCRIPT LOAD + EVALSHA: on Redis Cluster redis-py routes
            # EVAL by its first key, so the script runs on (and is cached by) the
            # master owning the lock's slot, while SCRIPT LOAD goes to every
            # master and fails if any one of them is down. One round trip fewer
            # on a single server, too.
            return await client.eval(self.source, len(keys), *keys, *args)

    async def run_acknowledged(
        self, client: Redis, keys: list[bytes], args: list[bytes], replicas: int, wait_ms: int
    ) -> tuple[Any, int]:
        """Run the script, then ``WAIT replicas wait_ms``, in one round trip.

        Both go in one non-transactional pipeline, so on one connection, where
        ``WAIT`` waits for the replication of everything the master had
        written when the script ended (the script's own writes included).

        Returns:
            The script's reply and the number of replicas that acknowledged.
        """
        reply, acked = await self._pipeline(
            client, "EVALSHA", self.sha, keys, args, replicas, wait_ms
        )
        if isinstance(reply, NoScriptError):
            reply, acked = await self._pipeline(
                client, "EVAL", self.source, keys, args, replicas, wait_ms
            )
        for result in (reply, acked):
            if isinstance(result, Exception):
                raise result
        return reply, int(acked)

    @staticmethod
    async def _pipeline(
        client: Redis,
        command: str,
        script: str,
        keys: list[bytes],
        args: list[bytes],
        replicas: int,
        wait_ms: int,
    ) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        pipe.execute_command(command, script, len(keys), *keys, *args)
        pipe.execute_command("WAIT", replicas, wait_ms)
        return await pipe.execute(raise_on_error=False)


class Grant(NamedTuple):
    """A grant as Redis reported it: fence and ticket, lease time left in ms,
    (in a ring or a hand-over) the id of the acquire call it answers ("" if not
    given), ``queued``, the number of requests still queued behind it when it
    was made (0 if not given), and (in a ring) ``proof``, the ring's signature
    (see ``ring_proof``; "" if none).

    A named tuple, not a frozen dataclass: one is made for every grant, and a
    frozen dataclass sets each field through ``object.__setattr__`` (some 150
    bytecodes a grant).
    """

    fence: int
    ticket: int
    pttl_ms: int
    call: str = ""
    queued: int = 0
    proof: str = ""


def new_ring_key() -> str:
    """A new secret for one acquire call (16 hex digits): the script keeps it
    with the queued request and signs the ring of its grant with it."""
    return secrets.token_hex(8)


def ring_proof(ring_key: str, token: str, grant: Grant) -> str:
    """The signature a script puts on the ring of ``grant`` to request ``token``
    made by a call with secret ``ring_key`` (see ``grant_next`` in lib.lua): the
    SHA-1 of the key and the ring's other fields, in hex."""
    body = (
        f"{ring_key} {token} {grant.fence} {grant.ticket} {grant.pttl_ms} {grant.call} "
        f"{grant.queued}"
    )
    return hashlib.sha1(body.encode(), usedforsecurity=True).hexdigest()


@dataclass(frozen=True)
class ClaimReply:
    """What a waiter learns when it claims a grant it was told of.

    ``grant`` is set when the request holds the lock (its lease re-armed);
    otherwise ``queued_ticket`` is the request's ticket if it is still queued,
    or None when it lost its place (its grant expired unclaimed, or its process
    was presumed dead). ``max_hold_reached`` when held past its max-hold deadline.
    """

    grant: Grant | None
    queued_ticket: int | None
    max_hold_reached: bool = False


@dataclass(frozen=True)
class PollReply:
    """What a waiting process learns from one poll."""

    holder: str | None
    grant: Grant | None
    head_ticket: int | None


@dataclass(frozen=True)
class RenewReply:
    """Redis's answer to a renewal: ``outcome`` (``RENEWED``, 0 when the lease
    is not held by the holder any more, -2 past its max-hold deadline), the
    lease's new time to live in ms (0 unless renewed), and the server's clock
    when the script ran (``server_ms``, Unix ms: the clock Redis expires keys
    by)."""

    outcome: int
    pttl_ms: int
    server_ms: int


@dataclass(frozen=True)
class StatusReply:
    """Read-only snapshot of the lock's keys.

    ``description`` is the holder's recorded description ("" when none);
    ``live_waiting`` counts the queued requests whose process is alive;
    ``known`` is False when no key of the name exists (never used, or expired).
    """

    holder: str | None
    grant: Grant | None
    last_fence: int
    waiting: int
    description: str = ""
    live_waiting: int = 0
    known: bool = True


RELEASED, ALREADY_RELEASED, NOT_HELD = 1, 0, -1
ENDED_HOW = (
    "released",
    "withdrawn",
    "lost (its lease expired)",
    "dropped (its process was presumed dead)",
    "ended (its process had already settled it)",
)
"""How a request ended, by the code the acquire script refuses a finished request with."""
WITHDRAWN, GAVE_BACK = 1, 2
RENEWED = 1


def client_options(client: AsyncClient) -> Mapping[str, Any]:
    """The options ``client`` opens its connections with (redis-py's
    ``connection_kwargs``: ``encoding``, ``decode_responses``, ...)."""
    if isinstance(client, RedisCluster):
        return client.connection_kwargs
    return getattr(client.connection_pool, "connection_kwargs", {})


def client_encoding(client: AsyncClient) -> tuple[str, str]:
    """The ``encoding`` and ``encoding_errors`` that ``client`` decodes replies
    with when it has ``decode_responses`` (redis-py's defaults: UTF-8, strict)."""
    options = client_options(client)
    return options.get("encoding", "utf-8"), options.get("encoding_errors", "strict")


def check_client_encoding(name: str, options: Mapping[str, Any]) -> None:
    """Refuse a client whose text options (redis-py's ``encoding``,
    ``encoding_errors`` and ``decode_responses``, in ``options``) cannot carry
    what lock ``name`` sends and reads back.

    The lock writes its keys, arguments and channels in UTF-8 and reads them
    back as such (see ``wired`` and ``as_text``); what other processes wrote is
    read back too (their tokens and descriptions, in any script's reply). So a
    client must write ASCII as ASCII (Redis's commands and the scripts' SHA-1
    digests go through its encoder), and one with ``decode_responses`` must
    decode any UTF-8 and give back the same bytes: strict UTF-8 or Latin-1.

    Raises:
        ValueError: naming the lock and the option, saying what to use instead.
    """
    encoding = str(options.get("encoding", "utf-8"))
    errors = str(options.get("encoding_errors", "strict"))
    try:
        codec = codecs.lookup(encoding).name
        ascii_as_ascii = KEY_PREFIX.encode(encoding, errors) == KEY_PREFIX.encode()
    except (LookupError, UnicodeError):
        codec, ascii_as_ascii = encoding, False
    if not ascii_as_ascii:
        raise ValueError(
            f"FIFO lock {name!r}: the client's encoding {encoding!r} does not write ASCII "
            "as ASCII, which Redis's commands need; use a client with encoding 'utf-8' "
            "(redis-py's default)"
        )
    if options.get("decode_responses") and (
        codec not in ("utf-8", "iso8859-1") or errors != "strict"
    ):
        raise ValueError(
            f"FIFO lock {name!r}: a client with decode_responses must decode with "
            f"encoding 'utf-8' or 'latin-1' and encoding_errors 'strict', not {encoding!r} "
            f"and {errors!r}: the lock reads back what every process wrote in UTF-8 "
            "(names, tokens, descriptions), which this would garble or refuse; give the "
            "lock a client without decode_responses, or with encoding 'utf-8'"
        )


@functools.lru_cache(maxsize=16)
def _is_utf8(encoding: str) -> bool:
    try:
        return codecs.lookup(encoding).name == "utf-8"
    except LookupError:
        return False


def as_text(value: object, encoding: str = "utf-8", errors: str = "strict") -> str:
    """Text the lock stored or sent (UTF-8, see ``wired``), as redis-py returned
    it: bytes are decoded as UTF-8; a ``str``, which redis-py decoded with the
    client's ``encoding`` and ``errors`` (``decode_responses``), is first turned
    back into the bytes Redis sent.

    Raises:
        UnicodeError: the bytes are not UTF-8 (not written by the lock).
    """
    if isinstance(value, bytes):
        return value.decode()
    text = str(value)
    if not isinstance(value, str) or _is_utf8(encoding):
        return text
    return text.encode(encoding, errors).decode()


def _fields(reply: bytes | str) -> list[Any]:
    """The fields of a script's reply of several (see ``reply`` in lib.lua).
    Split on spaces only: in text a client decoded as Latin-1, a UTF-8 byte
    can read as a space of another kind (NBSP)."""
    return reply.split(b" ") if isinstance(reply, bytes) else reply.split(" ")


def _text(value: Any, client: AsyncClient) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode()
    return as_text(value, *client_encoding(client))


class Protocol:
    """The scripts of the lock, one method per script.

    Tests swap in variants of single scripts to build deliberately broken locks
    (mutants); production code uses the module-level ``PROTOCOL``, or its
    ``acknowledged`` variant for locks with ``replicas``.

    Attributes:
        replicas: replicas (int) that must acknowledge each grant and renewal;
            0 for none (no ``WAIT`` is sent).
        wait_ms: ``WAIT`` timeout (int, milliseconds) when ``replicas`` > 0.
    """

    replicas: int = 0
    wait_ms: int = 0

    def __init__(self, **overrides: Script) -> None:
        names = (
            "acquire",
            "claim",
            "release",
            "renew",
            "withdraw",
            "poll",
            "status",
            "force_release",
        )
        self.scripts = {name: overrides.get(name) or Script(f"{name}.lua") for name in names}
        self._variants: dict[tuple[int, int], Protocol] = {}

    def acknowledged(self, replicas: int, wait_ms: int) -> Protocol:
        """This protocol, counting grants and renewals only once ``replicas``
        replicas acknowledged them within ``wait_ms`` milliseconds.

        Returns ``self`` when ``replicas`` is 0. Variants share the scripts and
        are cached, so locks with equal settings share one (and one wait group).
        """
        if replicas == 0:
            return self
        variant = self._variants.get((replicas, wait_ms))
        if variant is None:
            variant = copy.copy(self)  # shares self.scripts
            variant.replicas, variant.wait_ms = replicas, wait_ms
            variant._variants = {}
            self._variants[(replicas, wait_ms)] = variant
        return variant

    async def _call(self, client: AsyncClient, keys: LockKeys, script: str, *args: Any) -> Any:
        try:
            call = self.scripts[script].run(client, *wired(keys, args))
            return await bounded(client, call)
        except asyncio.TimeoutError:
            raise _silent(keys, script) from None
        except (AttributeError, TypeError, RuntimeError, RedisError, RedisClusterException) as exc:
            if isinstance(exc, (AttributeError, TypeError, RuntimeError)) and not (
                lost_in_transport(exc)
                or (isinstance(exc, AttributeError) and isinstance(client, RedisCluster))
            ):
                raise
            raise _unavailable(keys, script, exc, self.scripts[script].commands) from exc

    async def _call_acknowledged(
        self, client: AsyncClient, keys: LockKeys, script: str, *args: Any
    ) -> tuple[Any, int]:
        """Run ``script`` followed by ``WAIT``; (reply, replicas that acknowledged)."""
        if isinstance(client, RedisCluster):
            # A cluster pipeline sends WAIT (no key) to some node over some
            # connection, not after the script on the script's connection.
            raise LockUsageError(
                keys.name,
                f"replicas={self.replicas} is not supported on Redis Cluster (WAIT cannot "
                "follow the script on its connection there); use replicas=0",
            )
        try:
            return await bounded(
                client,
                self.scripts[script].run_acknowledged(
                    client, *wired(keys, args), self.replicas, self.wait_ms
                ),
                self.wait_ms / 1000,
            )
        except asyncio.TimeoutError:
            raise _silent(keys, script, self.wait_ms / 1000) from None
        except (AttributeError, TypeError, RuntimeError, RedisError, RedisClusterException) as exc:
            if isinstance(exc, (AttributeError, TypeError, RuntimeError)) and not lost_in_transport(
                exc
            ):
                raise
            raise _unavailable(keys, script, exc, self.scripts[script].commands) from exc

    def _not_replicated(self, keys: LockKeys, what: str, acked: int) -> NotReplicated:
        return NotReplicated(
            keys.name,
            f"{what} was acknowledged by {acked} of the {self.replicas} replica(s) required "
            f"within {self.wait_ms} ms; a failover could lose it. Check the replicas "
            "(INFO replication), or lower replicas / raise replica_wait_ms",
            replicas=self.replicas,
            acknowledged=acked,
        )

    async def acquire(
        self,
        client: AsyncClient,
        keys: LockKeys,
        token: str,
        session: str,
        settings: LockSettings,
        *,
        call: str,
        floor: str,
        holder: str = "",
        ring_key: str | None = None,
    ) -> tuple[Grant | None, int, int, int]:
        """Enqueue (or find) ``token``: (grant or None, ticket, holder's fence or
        0, the holder's lease's time to live in ms or 0).

        ``call``: id of this acquire call, "<session>/<seq>" (see lib.lua);
        ``floor``: the session's floor for this lock (see ``Calls.floor``);
        ``holder``: the caller's description, recorded for onlookers (see
        ``holder.py``); ``ring_key``: this call's secret (no spaces), with which
        the ring of its grant is signed (see ``ring_proof``); None: a new one.

        Raises:
            NotReplicated: (with ``replicas``) granted, but not acknowledged by
                enough replicas; the grant is still made, for the caller to give back.
            LockUsageError: this call's request already ended (released,
                withdrawn...) within ``settings.keep_ms``.
        """
        args = (
            token,
            session,
            settings.lease_ms,
            settings.max_hold_ms,
            settings.lease_ms,
            settings.keep_ms,
            floor,
            call,
            ring_key or new_ring_key(),
            holder,
        )
        acked = 0
        if self.replicas:
            reply, acked = await self._call_acknowledged(client, keys, "acquire", *args)
        else:
            reply = await self._call(client, keys, "acquire", *args)
        outcome, *fields = map(int, _fields(reply))
        if outcome == 1:
            fence, ticket, pttl_ms, queued = fields
            grant = Grant(fence, ticket, pttl_ms, queued=queued)
            if acked < self.replicas:
                raise self._not_replicated(keys, f"the grant of fence {grant.fence}", acked)
            return grant, ticket, fence, pttl_ms
        if outcome == -1:
            raise LockUsageError(
                keys.name,
                f"the request with token {token!r} already ended "
                f"({ENDED_HOW[fields[0]]}): this was a late copy of its acquire "
                "call; call acquire again",
            )
        ticket, holder_fence, holder_pttl_ms = fields
        return None, ticket, holder_fence, holder_pttl_ms

    async def claim(
        self, client: AsyncClient, keys: LockKeys, token: str, ticket: int, settings: LockSettings
    ) -> ClaimReply:
        """Check that request (token, ticket) holds the lock and re-arm its lease.

        Raises:
            NotReplicated: (with ``replicas``) held, but the re-armed lease was not
                acknowledged by enough replicas; the caller gives the grant back.
        """
        args = (token, ticket, settings.lease_ms, settings.keep_ms)
        acked = 0
        if self.replicas:
            reply, acked = await self._call_acknowledged(client, keys, "claim", *args)
        else:
            reply = await self._call(client, keys, "claim", *args)
        if reply == -2:
            return ClaimReply(None, None, max_hold_reached=True)
        outcome, *fields = map(int, _fields(reply))
        if outcome == 1:
            fence, ticket, pttl_ms, queued = fields
            grant = Grant(fence, ticket, pttl_ms, queued=queued)
            if acked < self.replicas:
                raise self._not_replicated(keys, f"the grant of fence {grant.fence}", acked)
            return ClaimReply(grant, None)
        return ClaimReply(None, fields[0] or None)

    async def release(
        self,
        client: AsyncClient,
        keys: LockKeys,
        token: str,
        fence: int,
        keep_ms: int,
        call: str,
        session: str,
        floor: str,
    ) -> tuple[int, tuple[str, Grant] | None]:
        """Release (token, fence), granted to acquire call ``call``; ``floor`` is
        ``session``'s floor for this lock (see ``Calls.floor``).

        Returns (RELEASED, ALREADY_RELEASED or NOT_HELD; the hand-over), where the
        hand-over is (token, grant) when the lock went to a waiter of ``session``
        (not rung: the caller hands it over), else None.
        """
        reply = await self._call(
            client, keys, "release", token, fence, keep_ms, call, session, floor
        )
        if isinstance(reply, int):
            return reply, None
        # The grant made to a waiter of this process, not this lease's.
        outcome, to_token, to_fence, to_ticket, pttl_ms, to_call, queued = _fields(reply)
        grant = Grant(
            int(to_fence), int(to_ticket), int(pttl_ms), _text(to_call, client) or "", int(queued)
        )
        return int(outcome), (_text(to_token, client) or "", grant)

    async def renew(
        self, client: AsyncClient, keys: LockKeys, token: str, fence: int, settings: LockSettings
    ) -> RenewReply:
        """Renew (token, fence); returns Redis's answer.

        Raises:
            NotReplicated: (with ``replicas``) renewed, but not acknowledged by
                enough replicas: the renewal does not count.
        """
        args = (token, fence, settings.lease_ms, settings.keep_ms)
        acked = 0
        if self.replicas:
            reply, acked = await self._call_acknowledged(client, keys, "renew", *args)
        else:
            reply = await self._call(client, keys, "renew", *args)
        outcome, pttl_ms, server_ms = map(int, _fields(reply))
        if outcome == RENEWED and acked < self.replicas:
            raise self._not_replicated(keys, f"the renewal of fence {fence}", acked)
        return RenewReply(outcome, pttl_ms, server_ms)

    async def withdraw(
        self,
        client: AsyncClient,
        keys: LockKeys,
        token: str,
        ticket: int,
        session: str,
        keep_ms: int,
        call: str,
        floor: str,
    ) -> int:
        """Withdraw request (token, ticket) of ``session`` (ticket 0: not known,
        then the request made by acquire call ``call``); ``floor`` is the
        session's floor for this lock (see ``Calls.floor``). Returns WITHDRAWN,
        GAVE_BACK or NOTHING."""
        return int(
            await self._call(
                client,
                keys,
                "withdraw",
                token,
                ticket,
                session,
                keep_ms,
                call,
                floor,
            )
        )

    async def poll(
        self, client: AsyncClient, keys: LockKeys, session: str, settings: LockSettings
    ) -> PollReply:
        """Refresh ``session``'s liveness, grant if free, report holder and queue head."""
        reply = await self._call(client, keys, "poll", session, settings.lease_ms, settings.keep_ms)
        holder = _text(reply[0], client)
        grant = Grant(int(reply[1]), int(reply[2]), int(reply[3])) if holder else None
        head = int(reply[4]) if reply[4] is not None else None
        return PollReply(holder, grant, head)

    async def status(self, client: AsyncClient, keys: LockKeys) -> StatusReply:
        """Read the holder, the last fence granted and the queue length."""
        reply = await self._call(client, keys, "status")
        holder = _text(reply[0], client)
        grant = Grant(int(reply[1]), int(reply[2]), int(reply[3])) if holder else None
        return StatusReply(
            holder,
            grant,
            int(reply[4]),
            int(reply[5]),
            _text(reply[6], client) or "",
            int(reply[7]),
            bool(int(reply[8])),
        )

    async def force_release(
        self, client: AsyncClient, keys: LockKeys, fence: int, keep_ms: int
    ) -> tuple[int | None, int, str]:
        """Evict the holder (only if its fence is ``fence``; 0: whoever holds it).

        Returns (evicted fence or None, the holder's fence when nothing was
        evicted (0 when free), the evicted holder's description).
        """
        reply = await self._call(client, keys, "force_release", fence, keep_ms)
        if int(reply[0]) == 1:
            return int(reply[1]), 0, _text(reply[2], client) or ""
        return None, int(reply[1]), ""


PROTOCOL = Protocol()


def wired(keys: LockKeys, args: tuple[str | int, ...]) -> tuple[list[bytes], list[bytes]]:
    """The keys and arguments of a script call, as Redis receives them: the
    arguments in one value (``arguments`` in lib.lua), separated by single
    spaces, so that no argument but the last may contain one; text in UTF-8
    (whatever encoding the client uses for its other commands, so that a name
    means the same keys and doorbell channels to every client), integers in
    decimal; the keys encoded once per ``LockKeys``. redis-py sends bytes as
    they are, and packs each value of a command in Python, which cost about as
    much per value as the rest of a script call's handling of it."""
    if not args:
        return keys.wire, []
    # From each argument's value: str() of a subclass of str or int (an Enum
    # member) may give another text.
    return keys.wire, [
        b" ".join([arg.encode() if isinstance(arg, str) else b"%d" % arg for arg in args])
    ]


def bounded(client: AsyncClient, call: Awaitable[T], waiting_s: float = 0.0) -> Awaitable[T]:
    """``call``, a command or script sent on ``client``, bounded in time.

    Args:
        client: the ``Redis`` or ``RedisCluster`` client ``call`` runs on.
        call: the awaitable to bound (not yet awaited).
        waiting_s: seconds Redis is asked to wait within the call (``WAIT`` for
            replicas), added to the bound; default 0.

    Returns:
        ``call`` itself when the client has a ``socket_timeout`` (redis-py
        bounds it) or on Python 3.10 (see ``CALL_TIMEOUT_S``); else ``call``
        bounded by ``CALL_TIMEOUT_S + waiting_s`` seconds, since redis-py
        would wait for ever.

    Raises (when awaited):
        asyncio.TimeoutError: the lock's bound ran out (``call`` was cancelled,
            and redis-py dropped its connection).
    """
    if sys.version_info < (3, 11) or client_options(client).get("socket_timeout"):
        return call
    return within(call, CALL_TIMEOUT_S + waiting_s)


def _silent(keys: LockKeys, script: str, waiting_s: float = 0.0) -> RedisUnavailable:
    """The ``RedisUnavailable`` for a ``script`` call that ``bounded`` gave up on."""
    return RedisUnavailable(
        keys.name,
        f"Redis did not answer the {script} script within {CALL_TIMEOUT_S + waiting_s:g} s (the "
        "client has no socket_timeout, so the lock bounds its calls itself); it may "
        "have run: check that the server is reachable, and retry",
    )


_TRANSPORT_FILES = frozenset(
    os.path.join(os.path.dirname(asyncio.__file__), module)
    for module in ("selector_events.py", "sslproto.py", "transports.py", "streams.py")
)


def lost_in_transport(exc: BaseException) -> bool:
    """Whether ``exc``, raised as redis-py wrote a command, is the event loop's
    transport refusing a connection that was already lost (closed by the
    other side while idle: a restart, a proxy, a firewall). asyncio drops such
    a write, and redis-py then raises a ``ConnectionError``; but

    - uvloop's transport raises a bare ``RuntimeError`` ("unable to perform
      operation on <TCPTransport closed=True ...>; the handler is closed")
      before writing anything, which redis-py lets through;
    - on Python 3.12 and 3.13 before the fix of CPython gh-136234, asyncio's
      ``_SelectorSocketTransport.writelines`` uses the event loop the lost
      connection let go of, and raises ``AttributeError`` (or ``TypeError``)
      from inside asyncio (told by its traceback's last frame).

    Either is the same dead connection: an outage, not a bug of the caller's.
    """
    if isinstance(exc, RuntimeError):
        return "the handler is closed" in str(exc)
    if not isinstance(exc, (AttributeError, TypeError)) or exc.__traceback__ is None:
        return False
    last = exc.__traceback__
    while last.tb_next is not None:
        last = last.tb_next
    return last.tb_frame.f_code.co_filename in _TRANSPORT_FILES


def _unavailable(
    keys: LockKeys, script: str, exc: Exception, commands: tuple[str, ...] = ()
) -> RedisUnavailable:
    """The ``RedisUnavailable`` (naming the lock, saying what to do) to raise for
    ``exc``, raised by redis-py while running ``script``, which calls ``commands``."""
    if lost_in_transport(exc):
        return RedisUnavailable(
            keys.name,
            f"the connection was lost as the {script} script was sent (the event loop's "
            f"transport raised {type(exc).__name__}: {exc}); it did not run: check that the "
            "server is reachable, and retry (a new connection is opened)",
            cause=exc,
        )
    if isinstance(exc, AttributeError):
        # Only from a RedisCluster client, which can close a node's connections
        # (on a topology refresh during a slot migration or failover) while a
        # command is being sent on one of them: its writer is gone mid-send.
        return RedisUnavailable(
            keys.name,
            f"redis-py's cluster client lost a connection while sending the {script} "
            f"script ({exc}); the lock's slot is moving or failing over: retry",
            cause=exc,
        )
    if isinstance(exc, (ClusterError, AskError, TryAgainError)):
        # Redirections redis-py gave up on (ClusterError "TTL exhausted"), or
        # that it does not follow: the slot is moving or failing over, and the
        # script did not run. (AskError covers MovedError.)
        return RedisUnavailable(
            keys.name,
            f"Redis Cluster did not run the {script} script: {type(exc).__name__}: {exc}; "
            "the lock's slot is moving between masters or failing over: retry",
            cause=exc,
        )
    if isinstance(exc, ResponseError):
        if _NON_LOCAL_KEY in str(exc):
            # A script admitted on the master a slot migrates from (all keys
            # there) that then touches a key it deleted itself: the release or
            # withdrawal went through, its hand-off did not and is left to the
            # waiters' next poll (or a retried release). Retrying finds it done.
            return RedisUnavailable(
                keys.name,
                f"the {script} script was cut short as the lock's slot started moving "
                f"to another master ({exc}); it may have taken effect in part: retry",
                cause=exc,
            )
        # Imported here: acl imports this module for the key prefix.
        from .acl import RULES_HINT, refusal

        refused = refusal(str(exc), keys.namespace, commands)
        if refused is not None:
            # NOPERM; a command refused inside the script is a plain ERR, whose
            # text (Redis 6.2, 7.0) does not name the command.
            return RedisUnavailable(
                keys.name,
                f"Redis's ACL refused the {script} script ({exc}): {refused} to the lock "
                f"user's ACL rules; {RULES_HINT}",
                cause=exc,
            )
        return RedisUnavailable(
            keys.name,
            f"Redis refused the {script} script: {exc}; if it names a key of this lock, "
            "something other than the lock wrote to it",
            cause=exc,
        )
    # RedisClusterException (e.g. SlotNotCoveredError, no node reachable) is not
    # a RedisError, and would otherwise escape untyped.
    return RedisUnavailable(
        keys.name,
        f"Redis failed during {script}: {type(exc).__name__}: {exc}; "
        "check that the server is reachable and the client's credentials",
        cause=exc,
    )
