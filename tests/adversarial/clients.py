"""Redis clients that misbehave on purpose: duplicated script calls, and a pause
between sending a command and reading its reply.

Both subclass ``redis.asyncio.Redis``, so the lock takes them like any client.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff, NoBackoff

AfterSend = Callable[[Any, str, tuple[Any, ...]], Awaitable[None]]
"""Called with (connection, command name, args) after a command was sent, before its
reply is read."""


def names(args: tuple[Any, ...], word: str) -> bool:
    """Whether a command's ``args`` name ``word`` (a request token, say): as one
    of them, or as one of the space-separated arguments a script call sends
    in one value (see ``protocol.wired``)."""
    return any(
        word in (arg.decode() if isinstance(arg, bytes) else str(arg)).split(" ") for arg in args
    )


class StagedRedis(Redis):
    """Runs ``after_send`` (when set) between sending a command and reading its reply.

    With it a test can act at the one stage no public hook reaches: the command
    is on its way (or already ran) but the caller has no answer yet - cancel the
    caller, drop the connection, pause the server.
    """

    after_send: AfterSend | None = None

    async def _send_command_parse_response(  # type: ignore[no-untyped-def]
        self, conn, command_name, *args, **options
    ) -> Any:
        hook = self.after_send
        if hook is None:
            return await super()._send_command_parse_response(  # type: ignore[no-untyped-call]
                conn, command_name, *args, **options
            )
        await conn.send_command(*args)
        try:
            await hook(conn, str(command_name).upper(), args)
        except BaseException:
            # As redis-py does when a call is interrupted mid-read: never hand a
            # connection with an unread reply back to the pool.
            await conn.disconnect(nowait=True)
            raise
        return await self.parse_response(conn, command_name, **options)


class DoubleEvalRedis(StagedRedis):
    """Sends every script call (``EVALSHA``, ``EVAL``) twice; returns the second reply.

    This is what a redis-py retry does when a reply is lost after the server ran
    the script: the same script, same arguments, executed again. The lock must
    give the same results and raise no false ``LeaseLost``.
    """

    async def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        await super().evalsha(sha, numkeys, *keys_and_args)
        return await super().evalsha(sha, numkeys, *keys_and_args)

    async def eval(self, script: str, numkeys: int, *keys_and_args: Any) -> Any:
        await super().eval(script, numkeys, *keys_and_args)
        return await super().eval(script, numkeys, *keys_and_args)


if not hasattr(Redis, "_send_command_parse_response"):  # pragma: no cover - redis-py changed
    raise ImportError(
        "redis.asyncio.Redis has no _send_command_parse_response any more; update "
        "tests/adversarial/clients.py:StagedRedis to the new send/parse seam"
    )


RESENDS = 3
"""How many times a client with retries re-sends a command whose connection failed."""


def make_client(
    url: str,
    *,
    dup_exec: bool = False,
    name: str | None = None,
    retries: bool = True,
) -> StagedRedis:
    """A ``StagedRedis`` for ``url`` (a ``DoubleEvalRedis`` with ``dup_exec``).

    Args:
        dup_exec: send every script call twice (``DoubleEvalRedis``).
        name: ``CLIENT SETNAME`` for every connection, to find them in CLIENT LIST.
        retries: redis-py re-sends a command whose connection failed (3 times,
            10-100 ms apart), as ``Redis(...)`` does by default - a client made
            ``from_url`` has no retries unless given some; False makes a dropped
            connection surface as an error at once.
    """
    cls: type[StagedRedis] = DoubleEvalRedis if dup_exec else StagedRedis
    options: dict[str, Any] = {"client_name": name}
    if retries:
        options["retry"] = Retry(ExponentialBackoff(cap=0.1, base=0.01), RESENDS)
    else:
        options["retry"] = Retry(NoBackoff(), 0)
    return cast(StagedRedis, cls.from_url(url, **options))
