"""Deliberately broken variants of the lock, for proving the adversarial suite can fail.

Nothing here edits the core. A Lua mutant is a text substitution applied to the
live script sources (``lib.lua`` + the script, as ``Script`` loads them) and run
through ``Protocol(**overrides)``; every substitution asserts that its snippet
occurs exactly once, so a refactor of the scripts breaks the mutant loudly
instead of silently turning it into the real lock. A Python mutant is a
subclass of ``FifoLock``, ``Protocol`` or ``WaitGroup``; ``Mutant.installed()``
swaps the ``WaitGroup`` class for the duration of a ``with`` block (contender
processes hold it for their whole life, selected with ``--mutant NAME``).

``REAL`` is the unmodified lock, so that every caller builds locks one way.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

import redis_fifo_lock.waiting as waiting_module
from redis_fifo_lock import FifoLock, Lease, RedisUnavailable
from redis_fifo_lock.protocol import (
    GAVE_BACK,
    RELEASED,
    WITHDRAWN,
    AsyncClient,
    Grant,
    LockKeys,
    PollReply,
    Protocol,
    Script,
)
from redis_fifo_lock.waiting import Hub, WaitGroup
from tests.adversarial.actors import cancelling

SCRIPTS = ("acquire", "release", "renew", "withdraw", "poll", "status")


class MutantOutdated(AssertionError):
    """A mutant's snippet is no longer in the core: update the mutant to the new code."""


@dataclass(frozen=True)
class Substitution:
    """Replace ``old`` (which must occur exactly once) by ``new`` in each of ``scripts``."""

    scripts: tuple[str, ...]
    old: str
    new: str


class SourceScript(Script):
    """A ``Script`` whose source text is given, not read from ``lua/``."""

    def __init__(self, filename: str, source: str) -> None:
        self.filename = filename
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


def lua_source(filename: str) -> str:
    """The text of ``redis_fifo_lock/lua/<filename>`` as the core ships it."""
    return (files("redis_fifo_lock") / "lua" / filename).read_text()


def substituted(mutant: str, script: str, edits: list[Substitution]) -> SourceScript:
    """The live source of ``script`` with ``edits`` applied, checked to apply exactly once."""
    source = Script(f"{script}.lua").source
    for edit in edits:
        found = source.count(edit.old)
        if found != 1:
            raise MutantOutdated(
                f"mutant {mutant!r}: expected the snippet {edit.old!r} once in {script}.lua "
                f"(with lib.lua), found it {found} times; the core changed - update "
                "tests/adversarial/mutants.py"
            )
        source = source.replace(edit.old, edit.new)
    return SourceScript(f"{script}.lua", source)


def require_source(mutant: str, function: object, snippet: str) -> None:
    """Fail loudly if the core function a Python mutant relies on no longer has ``snippet``."""
    source = inspect.getsource(function)  # type: ignore[arg-type]
    if snippet not in source:
        raise MutantOutdated(
            f"mutant {mutant!r}: {getattr(function, '__qualname__', function)} no longer "
            f"contains {snippet!r}; the core changed - update tests/adversarial/mutants.py"
        )


# --- Python mutants --------------------------------------------------------------------


class NoRenewalLock(FifoLock):
    """MUTANT renewal-never-started: the lease is handed out with no renewal task."""

    def _start_lease(self, hub: Hub, token: str, grant: Grant) -> Lease:
        return Lease(self.name, token, grant.fence, grant.ticket)


class UnboundedRenewalLock(FifoLock):
    """MUTANT renewal-unbounded: a renewal waits for its reply however long it takes,
    so a holder cut off from Redis is told its lease is gone only when a reply
    finally comes, long after the lease expired and the lock moved on."""

    async def _renew_once(self, hub: Hub, lease: Lease) -> tuple[int, int]:
        call = asyncio.ensure_future(super()._renew_once(hub, lease))
        while True:
            try:
                return await asyncio.shield(call)
            except asyncio.CancelledError:
                if call.done():
                    return call.result()
                # the mutation: the bound on the reply (a cancellation) is ignored


_ACQUIRING: contextvars.ContextVar[asyncio.Task[Any] | None] = contextvars.ContextVar(
    "fifolock_mutant_acquiring", default=None
)


class CancelWithoutWithdrawLock(FifoLock):
    """MUTANT cancel-without-withdraw: a cancelled acquire leaves its request behind.

    Timeouts still withdraw; only the cancellation paths (which run the withdrawal
    while the acquiring task is being cancelled) skip it.
    """

    async def acquire(self, timeout: float | None = None, *, token: str | None = None) -> Lease:
        _ACQUIRING.set(asyncio.current_task())
        return await super().acquire(timeout, token=token)

    async def _withdraw(self, hub: Hub, token: str) -> None:
        task = _ACQUIRING.get()
        if task is not None and cancelling(task):
            return  # the mutation: cancelled, and nothing is withdrawn
        await super()._withdraw(hub, token)


class DoorbellOnlyGroup(WaitGroup):
    """MUTANT doorbell-only: the poll is removed; waiters rely on the doorbell alone."""

    async def _poll_once(self) -> float:
        return 3600.0  # never asks Redis: no liveness refresh, no grant, no re-queue


class SplitGrantProtocol(Protocol):
    """MUTANT split-grant: the hand-off reads "is it free?" in one round trip and
    grants the head in a second one, as the peer implementation did.

    Every script runs with ``grant_next`` disabled; after each call that can free
    the lock or queue a request, ``EXISTS lease`` is read, and if the lock looked
    free a separate script grants the current head without checking again.
    """

    def __init__(self, **overrides: Script) -> None:
        super().__init__(**overrides)
        body = "\nlocal g = grant_next(now_ms(), ARGV[1])\nif g then return g end\nreturn false\n"
        lib = lua_source("lib.lua")
        check = "    if redis.call('EXISTS', K_LEASE) == 1 then\n        return nil\n    end\n"
        if lib.count(check) != 1:
            raise MutantOutdated(f"mutant 'split-grant': {check!r} not found once in lib.lua")
        self.scripts["grant"] = SourceScript("grant.lua", lib.replace(check, "") + body)

    async def _hand_off(self, client: AsyncClient, keys: LockKeys) -> tuple[str, Grant] | None:
        """Round trip 1 reads, round trip 2 writes; returns (token, grant) if one was made."""
        try:
            free = not await client.exists(keys.key("lease"))
        except RedisError as exc:
            raise RedisUnavailable(keys.name, f"split-grant read failed: {exc}") from exc
        if not free:
            return None
        reply = await self._call(client, keys, "grant", keys.doorbell)
        if not reply:
            return None
        token = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        return token, Grant(int(reply[1]), int(reply[2]), int(reply[3]))

    async def acquire(
        self,
        client: AsyncClient,
        keys: LockKeys,
        token: str,
        session: str,
        lease_ms: int,
        max_hold_ms: int,
        alive_ms: int,
    ) -> tuple[Grant | None, int, int]:
        grant, ticket, holder = await super().acquire(
            client, keys, token, session, lease_ms, max_hold_ms, alive_ms
        )
        if grant is None:
            made = await self._hand_off(client, keys)
            if made is not None and made[0] == token:
                return made[1], made[1].ticket, made[1].fence
        return grant, ticket, holder

    async def release(self, client: AsyncClient, keys: LockKeys, token: str, fence: int) -> int:
        outcome = await super().release(client, keys, token, fence)
        if outcome == RELEASED:
            await self._hand_off(client, keys)
        return outcome

    async def withdraw(self, client: AsyncClient, keys: LockKeys, token: str) -> int:
        outcome = await super().withdraw(client, keys, token)
        if outcome in (WITHDRAWN, GAVE_BACK):
            await self._hand_off(client, keys)
        return outcome

    async def poll(
        self, client: AsyncClient, keys: LockKeys, session: str, alive_ms: int
    ) -> PollReply:
        await self._hand_off(client, keys)
        return await super().poll(client, keys, session, alive_ms)


# --- the catalogue ---------------------------------------------------------------------


@dataclass(frozen=True)
class Mutant:
    """One deliberately broken lock (or, for ``REAL``, the lock itself)."""

    name: str
    summary: str
    lua: tuple[Substitution, ...] = ()
    lock_class: type[FifoLock] = FifoLock
    protocol_class: type[Protocol] = Protocol
    group_class: type[WaitGroup] | None = None
    requires: tuple[tuple[object, str], ...] = field(default=())

    def check(self) -> None:
        """Build every part once, so an outdated mutant fails before any scenario runs."""
        for function, snippet in self.requires:
            require_source(self.name, function, snippet)
        self.protocol()

    def protocol(self) -> Protocol:
        """The scripts of this variant, as a ``Protocol``."""
        by_script: dict[str, list[Substitution]] = {}
        for edit in self.lua:
            for script in edit.scripts:
                by_script.setdefault(script, []).append(edit)
        overrides = {
            script: substituted(self.name, script, edits) for script, edits in by_script.items()
        }
        return self.protocol_class(**overrides)

    def lock(self, client: Redis, name: str, **settings: int) -> FifoLock:
        """A lock of this variant on ``client`` (settings as for ``FifoLock``)."""
        lock = self.lock_class(client, name, **settings)
        if self.lua or self.protocol_class is not Protocol:
            lock._protocol = self.protocol()
        return lock

    @contextmanager
    def installed(self) -> Iterator[None]:
        """Swap in this variant's ``WaitGroup`` (if any) while the block runs."""
        if self.group_class is None:
            yield
            return
        original = waiting_module.WaitGroup
        waiting_module.WaitGroup = self.group_class  # type: ignore[misc]
        try:
            yield
        finally:
            waiting_module.WaitGroup = original  # type: ignore[misc]


def _all(old: str, new: str) -> Substitution:
    """A substitution in ``lib.lua``'s text, so in every script."""
    return Substitution(SCRIPTS, old, new)


REAL = Mutant("real", "the lock as shipped")

MUTANTS: dict[str, Mutant] = {
    mutant.name: mutant
    for mutant in (
        Mutant(
            "grant-not-head",
            "acquire takes a free lock for the caller without checking it heads the queue",
            lua=(
                Substitution(
                    ("acquire",),
                    "local granted = grant_next(now, doorbell)",
                    "local granted = nil\n"
                    "if redis.call('EXISTS', K_LEASE) == 0 then -- MUTANT grant-not-head\n"
                    "    redis.call('ZREM', K_QUEUE, token)\n"
                    "    redis.call('HDEL', K_WAITERS, token)\n"
                    "    local fence = redis.call('INCR', K_FENCES)\n"
                    "    redis.call('HSET', K_LEASE, 'token', token, 'fence', fence,\n"
                    "        'ticket', ticket, 'deadline', now + max_hold_ms)\n"
                    "    redis.call('PEXPIRE', K_LEASE, lease_ms)\n"
                    "    redis.call('PUBLISH', doorbell .. ':' .. session,\n"
                    "        token .. ' ' .. fence .. ' ' .. ticket .. ' ' .. lease_ms)\n"
                    "    granted = {token, fence, ticket, lease_ms}\n"
                    "end",
                ),
            ),
        ),
        Mutant(
            "split-grant",
            "the grant is a read round trip (is it free?) then a write round trip (grant)",
            lua=(
                _all(
                    "local function grant_next(now, doorbell)\n",
                    "local function grant_next(now, doorbell)\n"
                    "    do return nil end -- MUTANT split-grant: granted from Python\n",
                ),
            ),
            protocol_class=SplitGrantProtocol,
        ),
        Mutant(
            "release-no-owner-check",
            "release frees the lock whoever holds it",
            lua=(
                Substitution(
                    ("release",),
                    "if held and held[1] == token and held[2] == fence then",
                    "if held then -- MUTANT release-no-owner-check",
                ),
            ),
        ),
        Mutant(
            "renew-no-owner-check",
            "renewal extends whatever lease exists",
            lua=(
                Substitution(
                    ("renew",),
                    "if held[1] ~= token or tonumber(held[2]) ~= fence then",
                    "if not held[1] then -- MUTANT renew-no-owner-check",
                ),
            ),
        ),
        Mutant(
            "fence-not-incremented",
            "the hand-off in release reuses the last fence instead of incrementing it",
            lua=(
                Substitution(
                    ("release",),
                    "local fence = redis.call('INCR', K_FENCES)",
                    "local fence = tonumber(redis.call('GET', K_FENCES)) or 0 -- MUTANT",
                ),
            ),
        ),
        Mutant(
            "cancel-without-withdraw",
            "a cancelled acquire propagates CancelledError without withdrawing its request",
            lock_class=CancelWithoutWithdrawLock,
            requires=(
                (FifoLock._wait, "except asyncio.CancelledError"),
                (FifoLock._wait, "self._withdraw("),
                (FifoLock._withdraw_after, "self._withdraw("),
            ),
        ),
        Mutant(
            "withdraw-keeps-grant",
            "a request cancelled after its grant landed keeps the grant (no give-back)",
            lua=(
                Substitution(
                    ("withdraw",),
                    "local held = current_grant()\nif held and held[1] == token then",
                    "local held = current_grant()\nif false then -- MUTANT withdraw-keeps-grant",
                ),
            ),
        ),
        Mutant(
            "no-dead-waiter-skipping",
            "the hand-off treats every queued waiter as alive",
            lua=(
                _all(
                    "local alive_until = session and tonumber(redis.call('ZSCORE', K_ALIVE, "
                    "session))",
                    "local alive_until = session and now + tonumber(lease_ms) -- MUTANT",
                ),
            ),
        ),
        Mutant(
            "doorbell-only",
            "waiting processes never poll; only the doorbell wakes them",
            group_class=DoorbellOnlyGroup,
            requires=((WaitGroup._poll_loop, "await self._poll_once()"),),
        ),
        Mutant(
            "renewal-never-started",
            "the holder never renews its lease",
            lock_class=NoRenewalLock,
            requires=((FifoLock.acquire, "self._start_lease("),),
        ),
        Mutant(
            "renewal-unbounded",
            "a renewal waits for its reply past the lease's expiry (no local deadline)",
            lock_class=UnboundedRenewalLock,
            requires=((FifoLock._renew, "self._renew_once("),),
        ),
        Mutant(
            "max-hold-ignored",
            "renewal ignores the max_hold_ms deadline",
            lua=(
                Substitution(("renew",), "if remaining <= 0 then", "if false then -- MUTANT"),
                Substitution(
                    ("renew",), "local ttl = math.min(lease_ms, remaining)", "local ttl = lease_ms"
                ),
            ),
        ),
        Mutant(
            "acquire-not-idempotent",
            "a re-sent acquire with the same token takes a new ticket at the back",
            lua=(
                Substitution(
                    ("acquire",),
                    "local ticket = tonumber(redis.call('ZSCORE', K_QUEUE, token))",
                    "local ticket = nil -- MUTANT acquire-not-idempotent",
                ),
            ),
        ),
    )
}


def variant(name: str) -> Mutant:
    """The mutant called ``name``, or ``REAL`` for ``"real"``."""
    if name == REAL.name:
        return REAL
    try:
        return MUTANTS[name]
    except KeyError:
        raise ValueError(f"no mutant {name!r}; known: {', '.join(MUTANTS)}") from None
