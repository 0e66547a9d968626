"""Late copies of script calls: capture a call as it is sent, send it again later.

``tapped(script, token)`` wraps ``redis_fifo_lock.protocol.Script.run`` (every
script of every lock variant goes through it) while its block runs, and keeps
each call of ``<script>.lua`` whose arguments name ``token``. ``Captured.replay``
sends the very same EVALSHA (same keys, same arguments) again: what Redis sees
when a message delayed in the network, or re-sent by a client, arrives late.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from redis_fifo_lock.protocol import AsyncClient, Script

_ORIGINAL_RUN = Script.run


@dataclass(frozen=True)
class Captured:
    """One script call as it was sent."""

    script: Script
    client: AsyncClient
    keys: list[str]
    args: list[Any]

    async def replay(self, client: AsyncClient | None = None) -> Any:
        """Send the same call again (on ``client``, default the original one)."""
        return await _ORIGINAL_RUN(self.script, client or self.client, self.keys, self.args)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@contextmanager
def tapped(script: str, token: str) -> Iterator[list[Captured]]:
    """Capture, while the block runs, every call of ``<script>.lua`` naming ``token``."""
    seen: list[Captured] = []
    filename = f"{script}.lua"

    async def run(self: Script, client: AsyncClient, keys: list[str], args: list[Any]) -> Any:
        if self.filename == filename and token in (_text(arg) for arg in args):
            seen.append(Captured(self, client, list(keys), list(args)))
        return await _ORIGINAL_RUN(self, client, keys, args)

    Script.run = run  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        Script.run = _ORIGINAL_RUN  # type: ignore[method-assign]
