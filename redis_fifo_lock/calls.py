"""Call ids and floors: how a process lets Redis forget the requests it ended.

Every acquire call gets an id ``"<session>/<seq>"``: the session of the wait
group that sends it and a number its hub never uses twice and issues in
order (12 hex digits, so ids compare as strings in Lua). Redis keeps a record
of how a request ended only so that a late copy of one of its scripts (redis-py
re-sends a script whose reply was lost) changes nothing. With each acquire,
release and withdraw the hub sends its *floor* for that lock and session: the
lowest seq of its requests there that have a call in flight or about to be
sent (or the next seq, if none). Every request of the session below the floor
has been seen by Redis and is settled here, so Redis refuses late copies of
them without a record and drops their records: the records kept are those of
the few requests the process is still talking about, however often the name
is used (see ``lua/lib.lua``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .protocol import LockKeys

SEQ_DIGITS = 12
"""Hex digits of the seq in a call id (2^48 calls per hub)."""

UNKNOWN_CALL = "-"
"""The call id of a request whose acquire call is not known (a ring for a token
nobody here waits for)."""


class CallIds:
    """One hub's call ids, and which of them are in flight, per lock and session.

    Only the hub's event loop uses it. Its size is bounded by the calls in
    flight: an entry is removed when its last call ends.
    """

    def __init__(self) -> None:
        self._next = 1
        self._counts: dict[tuple[LockKeys, str], dict[int, int]] = {}
        self._lowest: dict[tuple[LockKeys, str], list[int]] = {}

    def new(self, session: str) -> str:
        """A new call id for a request of ``session``. Enter ``in_flight`` for it
        before the next await, so that no floor passes it before it is sent."""
        seq = self._next
        self._next += 1
        return f"{session}/{seq:0{SEQ_DIGITS}x}"

    def enter(self, keys: LockKeys, call: str) -> None:
        """A call for the request made by ``call`` is in flight (or will be sent)."""
        parsed = _parse(call)
        if parsed is None:
            return
        session, seq = parsed
        counts = self._counts.setdefault((keys, session), {})
        if seq not in counts:
            lowest = self._lowest.setdefault((keys, session), [])
            if len(lowest) > 2 * len(counts) + 16:
                # Mostly seqs no longer in flight: rebuild rather than grow.
                lowest[:] = counts
                heapq.heapify(lowest)
            heapq.heappush(lowest, seq)
        counts[seq] = counts.get(seq, 0) + 1

    def leave(self, keys: LockKeys, call: str) -> None:
        """One call for the request made by ``call`` got its answer, or failed."""
        parsed = _parse(call)
        if parsed is None:
            return
        session, seq = parsed
        counts = self._counts.get((keys, session))
        if counts is None or seq not in counts:
            return
        counts[seq] -= 1
        if counts[seq] == 0:
            del counts[seq]
            if not counts:
                del self._counts[(keys, session)]
                del self._lowest[(keys, session)]

    @contextmanager
    def in_flight(self, keys: LockKeys, call: str) -> Iterator[None]:
        """``enter`` now and ``leave`` when the block ends."""
        self.enter(keys, call)
        try:
            yield
        finally:
            self.leave(keys, call)

    def floor(self, keys: LockKeys, session: str) -> str:
        """The floor to send with a call of ``session`` on ``keys``: the lowest
        seq with a call in flight there, or the next seq if there is none."""
        counts = self._counts.get((keys, session))
        if counts is None:
            return f"{self._next:0{SEQ_DIGITS}x}"
        lowest = self._lowest[(keys, session)]
        while lowest[0] not in counts:
            heapq.heappop(lowest)
        return f"{lowest[0]:0{SEQ_DIGITS}x}"


def _parse(call: str) -> tuple[str, int] | None:
    session, _, seq = call.rpartition("/")
    if not session:
        return None
    return session, int(seq, 16)
