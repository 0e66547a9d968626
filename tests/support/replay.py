"""Late copies of script calls: what a redis-py retry sends when a reply was lost.

redis-py re-sends a command whose reply did not arrive; if the first copy was
only delayed (a slow network, a proxy, a frozen server), Redis runs both, the
first one possibly long after the retry was answered. ``ScriptCalls`` records
every ``Script.run`` the lock makes (by wrapping it with pytest's
``monkeypatch``; ``script_calls()`` where no test's monkeypatch is at hand, as
in an adversarial scenario), so a test can send the very same EVALSHA again
later, with a raw client, as that late copy.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from redis.exceptions import NoScriptError

from redis_fifo_lock.protocol import AsyncClient, Script


@dataclass(frozen=True)
class ScriptCall:
    """One script call as sent: the script (its SHA and source), the client it
    went out on, keys and arguments."""

    script: Script
    client: AsyncClient
    keys: tuple[str, ...]
    args: tuple[Any, ...]

    def mentions(self, word: str) -> bool:
        """Whether ``word`` is one of the call's arguments (e.g. a request token;
        a script call sends them in one value, separated by spaces: see
        ``protocol.wired``)."""
        return any(
            word in (arg.decode() if isinstance(arg, bytes) else str(arg)).split(" ")
            for arg in self.args
        )

    async def replay(self, client: AsyncClient | None = None) -> Any:
        """Send the same EVALSHA again (EVAL if the server forgot the script), on
        ``client`` (default: the client the call went out on)."""
        target = client or self.client
        try:
            return await target.evalsha(self.script.sha, len(self.keys), *self.keys, *self.args)
        except NoScriptError:
            return await target.eval(self.script.source, len(self.keys), *self.keys, *self.args)


class ScriptCalls:
    """Records every ``Script.run`` made while the test runs, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[ScriptCall] = []
        self.answered: list[ScriptCall] = []
        """The calls whose reply arrived, in the order they arrived."""
        original: Callable[[Script, AsyncClient, list[str], list[Any]], Awaitable[Any]]
        original = Script.run
        calls, answered = self.calls, self.answered

        async def run(self: Script, client: AsyncClient, keys: list[str], args: list[Any]) -> Any:
            call = ScriptCall(self, client, tuple(keys), tuple(args))
            calls.append(call)
            reply = await original(self, client, keys, args)
            answered.append(call)
            return reply

        monkeypatch.setattr(Script, "run", run)

    def mark(self) -> int:
        """A position in the sequence, for ``since``."""
        return len(self.calls)

    def since(self, mark: int, *, mentioning: str, script: str | None = None) -> list[ScriptCall]:
        """The calls made since ``mark`` that name ``mentioning`` among their
        arguments, only of ``<script>.lua`` if ``script`` is given."""
        return [
            call
            for call in self.calls[mark:]
            if call.mentions(mentioning)
            and (script is None or call.script.filename == f"{script}.lua")
        ]


@contextmanager
def script_calls() -> Iterator[ScriptCalls]:
    """A ``ScriptCalls`` recording while the block runs, for code that runs
    without a test's ``monkeypatch`` fixture (an adversarial scenario)."""
    with pytest.MonkeyPatch.context() as patch:
        yield ScriptCalls(patch)


def reply_code(reply: Any) -> int:
    """The outcome code of a script reply: the reply itself (a number), its
    first field (a string of fields, see ``reply`` in lib.lua), or its first
    element (an array)."""
    if isinstance(reply, (list, tuple)):
        reply = reply[0]
    if isinstance(reply, (bytes, str)):
        reply = reply.split(b" " if isinstance(reply, bytes) else " ")[0]
    return int(reply)
