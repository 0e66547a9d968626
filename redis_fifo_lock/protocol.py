"""The Redis side of the lock: key layout, the Lua scripts, and their replies.

Each state transition is one Lua script in ``lua/``, loaded once per server and
run with EVALSHA (reloaded on NOSCRIPT). Each method here runs one script and
turns its reply into a small typed value; redis-py errors become
``RedisUnavailable`` naming the lock. Nothing here keeps state between calls.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from importlib.resources import files
from typing import Any, TypeAlias

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError, RedisError, ResponseError

from .errors import RedisUnavailable

AsyncClient: TypeAlias = "Redis | RedisCluster"
"""The clients the lock runs on: one server (``Redis``) or a Redis Cluster."""

KEY_PREFIX = "fifolock"
"""Prefix of every key and channel the lock uses: ``fifolock:{<name>}:<part>``."""


@dataclass(frozen=True)
class LockKeys:
    """Names of the lock's keys and doorbell channel, all sharing one hash tag.

    ``{<name>}`` is the Redis Cluster hash tag, so every key lands in one slot.
    """

    name: str

    def key(self, part: str) -> str:
        """The full Redis key for ``part`` (e.g. ``"queue"``) of this lock."""
        return f"{KEY_PREFIX}:{{{self.name}}}:{part}"

    @cached_property
    def all(self) -> list[str]:
        """The seven keys in the order every script expects them (see lib.lua).

        Built once per ``LockKeys`` (every script call passes them); treat the
        list as read-only.
        """
        parts = ("queue", "waiters", "alive", "lease", "tickets", "fences", "released")
        return [self.key(part) for part in parts]

    @cached_property
    def doorbell(self) -> str:
        """Prefix of the pub/sub channels rung on grants (passed to the scripts)."""
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

    async def run(self, client: AsyncClient, keys: list[str], args: list[Any]) -> Any:
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


@dataclass(frozen=True)
class Grant:
    """A grant as Redis reported it: fence and ticket, lease time left in ms."""

    fence: int
    ticket: int
    pttl_ms: int


@dataclass(frozen=True)
class PollReply:
    """What a waiting process learns from one poll."""

    holder: str | None
    grant: Grant | None
    head_ticket: int | None


@dataclass(frozen=True)
class StatusReply:
    """Read-only snapshot of the lock's keys."""

    holder: str | None
    grant: Grant | None
    last_fence: int
    waiting: int


RELEASED, ALREADY_RELEASED, NOT_HELD = 1, 0, -1
WITHDRAWN, GAVE_BACK, NOTHING = 1, 2, 0
RENEWED, RENEW_REFUSED, MAX_HOLD_REACHED = 1, 0, -2


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


class Protocol:
    """The scripts of the lock, one method per script.

    Tests swap in variants of single scripts to build deliberately broken locks
    (mutants); production code uses the module-level ``PROTOCOL``.
    """

    def __init__(self, **overrides: Script) -> None:
        names = ("acquire", "release", "renew", "withdraw", "poll", "status")
        self.scripts = {name: overrides.get(name) or Script(f"{name}.lua") for name in names}

    async def _call(self, client: AsyncClient, keys: LockKeys, script: str, *args: Any) -> Any:
        try:
            return await self.scripts[script].run(client, keys.all, list(args))
        except ResponseError as exc:
            raise RedisUnavailable(
                keys.name,
                f"Redis refused the {script} script: {exc}; if it names a key of this lock, "
                "something other than the lock wrote to it",
                cause=exc,
            ) from exc
        except RedisError as exc:
            raise RedisUnavailable(
                keys.name,
                f"Redis failed during {script}: {type(exc).__name__}: {exc}; "
                "check that the server is reachable and the client's credentials",
                cause=exc,
            ) from exc

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
        """Enqueue (or find) ``token``: (grant or None, ticket, holder's fence or 0)."""
        reply = await self._call(
            client,
            keys,
            "acquire",
            keys.doorbell,
            token,
            session,
            lease_ms,
            max_hold_ms,
            alive_ms,
        )
        if reply[0] == 1:
            grant = Grant(int(reply[1]), int(reply[2]), int(reply[3]))
            return grant, grant.ticket, grant.fence
        return None, int(reply[1]), int(reply[2])

    async def release(self, client: AsyncClient, keys: LockKeys, token: str, fence: int) -> int:
        """Release (token, fence); returns RELEASED, ALREADY_RELEASED or NOT_HELD."""
        return int(await self._call(client, keys, "release", keys.doorbell, token, fence))

    async def renew(
        self, client: AsyncClient, keys: LockKeys, token: str, fence: int, lease_ms: int
    ) -> tuple[int, int]:
        """Renew (token, fence); returns (RENEWED|RENEW_REFUSED|MAX_HOLD_REACHED, pttl_ms)."""
        reply = await self._call(client, keys, "renew", token, fence, lease_ms)
        return int(reply[0]), int(reply[1]) if len(reply) > 1 else 0

    async def withdraw(self, client: AsyncClient, keys: LockKeys, token: str) -> int:
        """Withdraw ``token``; returns WITHDRAWN, GAVE_BACK or NOTHING."""
        return int(await self._call(client, keys, "withdraw", keys.doorbell, token))

    async def poll(
        self, client: AsyncClient, keys: LockKeys, session: str, alive_ms: int
    ) -> PollReply:
        """Refresh ``session``'s liveness, grant if free, report holder and queue head."""
        reply = await self._call(client, keys, "poll", keys.doorbell, session, alive_ms)
        holder = _text(reply[0])
        grant = Grant(int(reply[1]), int(reply[2]), int(reply[3])) if holder else None
        head = int(reply[4]) if reply[4] is not None else None
        return PollReply(holder, grant, head)

    async def status(self, client: AsyncClient, keys: LockKeys) -> StatusReply:
        """Read the holder, the last fence granted and the queue length."""
        reply = await self._call(client, keys, "status")
        holder = _text(reply[0])
        grant = Grant(int(reply[1]), int(reply[2]), int(reply[3])) if holder else None
        return StatusReply(holder, grant, int(reply[4]), int(reply[5]))


PROTOCOL = Protocol()
