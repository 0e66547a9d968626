"""Lock names and tokens that are refused, and how the refusal is worded."""

from __future__ import annotations

import re

import pytest
from redis.asyncio import Redis

from redis_fifo_lock import FifoLock, SyncFifoLock

SHORT = 300
"""Longest acceptable error message for a huge refused value, in characters."""


@pytest.mark.parametrize(
    ("char", "code"),
    [
        ("\u2028", "U+2028"),  # line separator (Zl)
        ("\u2029", "U+2029"),  # paragraph separator (Zp)
        ("\u202e", "U+202E"),  # right-to-left override (Cf)
        ("\u200b", "U+200B"),  # zero-width space (Cf)
        ("\u0085", "U+0085"),  # next line (Cc)
        ("\x1b", "U+001B"),  # escape (Cc)
    ],
)
def test_invisible_and_line_breaking_characters_are_refused_by_code_point(
    redis_url: str, char: str, code: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(code)) as caught:
        SyncFifoLock(redis_url, f"invoices{char}2024")

    assert char not in str(caught.value)


def test_a_megabyte_name_with_a_brace_gives_a_short_message(redis_url: str) -> None:
    name = "{" + "x" * 1_000_000

    with pytest.raises(ValueError, match="1000001 characters") as caught:
        SyncFifoLock(redis_url, name)

    assert len(str(caught.value)) < SHORT


@pytest.mark.parametrize(
    "name",
    ["x" * 2000, b"x" * 1_000_000, "\x00" * 1_000_000, "\ud800" * 1_000_000],
    ids=["too-long", "bytes", "control", "surrogates"],
)
def test_every_name_error_is_short(redis_url: str, name: object) -> None:
    with pytest.raises(ValueError) as caught:
        SyncFifoLock(redis_url, name)  # type: ignore[arg-type]

    assert len(str(caught.value)) < SHORT


async def test_a_megabyte_token_gives_a_short_message(aredis: Redis) -> None:
    lock = FifoLock(aredis, "tokens")
    for token in ("t" * 1_000_000, "t " * 500_000):
        with pytest.raises(ValueError, match="token") as caught:
            await lock.acquire(0, token=token)
        assert len(str(caught.value)) < SHORT
    assert not (await lock.status()).held


async def test_printable_unicode_names_still_work(aredis: Redis) -> None:
    for name in ("facture é 2024", "注文-42", "emoji 🔒", "tab-free name"):
        lock = FifoLock(aredis, name)
        async with lock.hold(timeout=5) as lease:
            assert lease.fence > 0
