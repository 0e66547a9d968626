"""Call ids and floors: how a process lets Redis forget the requests it ended.

Every acquire call gets an id ``"<process>/<seq>"``: an id of this process (new
in each process, also in a forked child) and a number it never uses twice and
issues in order (12 hex digits, so ids compare as strings in Lua). Redis keeps a
record of how a request ended only so that a late copy of one of its scripts
(redis-py re-sends a script whose reply was lost) changes nothing. With each
acquire, release and withdraw the process sends its *floor* for that lock,
``"<process>/<seq>"``: the lowest seq of its requests there that have a call in
flight or about to be sent (or the next seq, if none), and the held requests
below it. Every request of the process below the floor but those held has been
seen by Redis and answered here, so Redis refuses late copies of them without a
record and drops their records: the records kept are those of the few requests
the process is still talking about, however often the name is used, and however
many event loops (``asyncio.run``, ``async_to_sync``) it uses (see
``lua/lib.lua``).
"""

from __future__ import annotations

import heapq
import os
import secrets
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from . import native

if TYPE_CHECKING:
    from .lease import Lease
    from .protocol import LockKeys

SEQ_DIGITS = 12
"""Hex digits of the seq in a call id (2^48 calls per process)."""

UNKNOWN_CALL = "-"
"""The call id of a request whose acquire call is not known."""


class CallIds:
    """A process's call ids, and which of them are in flight, per lock.

    Thread-safe (every event loop of the process, the sync facade's portal
    included, uses the one ``call_ids()``). Its size is bounded by the calls
    in flight: a lock's entry is removed when its last call ends.
    """

    def __init__(self) -> None:
        self.process = secrets.token_hex(8)
        self._next = 1
        self._counts: dict[LockKeys, dict[int, int]] = {}
        self._lowest: dict[LockKeys, list[int]] = {}
        # Reentrant: a lease garbage-collected while the guard is held (the
        # collector can run anywhere) leaves through ``leave`` on this thread.
        self._guard = native.rlock()
        self._holding: dict[LockKeys, dict[int, int]] = {}
        self._held: weakref.WeakKeyDictionary[Lease, weakref.finalize[..., Lease]] = (
            weakref.WeakKeyDictionary()
        )

    def start(self, keys: LockKeys) -> str:
        """A new call id for a call on ``keys``, in flight from now on: ``leave``
        it once the call got its answer, or failed. Issued and entered in one
        step under the guard, so that no floor read meanwhile, on any thread,
        passes it before it is sent (Redis would refuse it as a late copy)."""
        with self._guard:
            seq = self._next
            self._next += 1
            call = f"{self.process}/{seq:0{SEQ_DIGITS}x}"
            self.enter(keys, call)
        return call

    def enter(self, keys: LockKeys, call: str) -> None:
        """A call for the request made by ``call`` is in flight (or will be sent)."""
        seq = self._seq(call)
        if seq is None:
            return
        with self._guard:
            counts = self._counts.setdefault(keys, {})
            if seq not in counts:
                lowest = self._lowest.setdefault(keys, [])
                if len(lowest) > 2 * len(counts) + 16:
                    # Mostly seqs no longer in flight: rebuild rather than grow.
                    lowest[:] = counts
                    heapq.heapify(lowest)
                heapq.heappush(lowest, seq)
            counts[seq] = counts.get(seq, 0) + 1

    def leave(self, keys: LockKeys, call: str) -> None:
        """One call for the request made by ``call`` got its answer, or failed."""
        seq = self._seq(call)
        if seq is None:
            return
        with self._guard:
            if _count_down(self._counts, keys, seq):
                del self._lowest[keys]

    def hold(self, keys: LockKeys, lease: Lease) -> None:
        """``lease`` was granted: until ``released(lease)`` (or until the lease
        is garbage-collected) floors name its request as held, so that Redis
        keeps its record and never takes its late release for a copy of one
        already answered."""
        seq = self._seq(lease.call)
        if seq is None:
            return
        with self._guard:
            held = self._holding.setdefault(keys, {})
            held[seq] = held.get(seq, 0) + 1
            self._held[lease] = weakref.finalize(lease, self._unhold, keys, seq)

    def released(self, lease: Lease) -> None:
        """``lease``'s release got its answer (see ``hold``)."""
        with self._guard:
            settled = self._held.pop(lease, None)
        if settled is not None:
            settled()

    def _unhold(self, keys: LockKeys, seq: int) -> None:
        with self._guard:
            _count_down(self._holding, keys, seq)

    @contextmanager
    def in_flight(self, keys: LockKeys, call: str) -> Iterator[None]:
        """``enter`` now and ``leave`` when the block ends."""
        self.enter(keys, call)
        try:
            yield
        finally:
            self.leave(keys, call)

    def floor(self, keys: LockKeys) -> str:
        """The floor to send with a call on ``keys``: the lowest seq with a call
        in flight there (or the next seq if there is none), followed by
        ``+<seq>`` for each held request below it (a lease holds at most one
        lock, so these are few)."""
        with self._guard:
            counts = self._counts.get(keys)
            if counts is None:
                lowest = self._next
            else:
                heap = self._lowest[keys]
                while heap[0] not in counts:
                    heapq.heappop(heap)
                lowest = heap[0]
            held = sorted(seq for seq in self._holding.get(keys, ()) if seq < lowest)
        return f"{self.process}/{lowest:0{SEQ_DIGITS}x}" + "".join(
            f"+{seq:0{SEQ_DIGITS}x}" for seq in held
        )

    def _seq(self, call: str) -> int | None:
        process, _, seq = call.partition("/")
        if process != self.process:
            return None  # unknown, or made before this process was forked
        return int(seq, 16)


def _count_down(table: dict[LockKeys, dict[int, int]], keys: LockKeys, seq: int) -> bool:
    """Take one off ``table[keys][seq]``, dropping entries that reach 0; True
    when ``keys`` left the table."""
    counts = table.get(keys)
    if counts is None or seq not in counts:
        return False
    counts[seq] -= 1
    if counts[seq] == 0:
        del counts[seq]
        if not counts:
            del table[keys]
            return True
    return False


_call_ids = CallIds()


def call_ids() -> CallIds:
    """This process's ``CallIds``."""
    return _call_ids


def _after_fork_in_child() -> None:
    # The child is a new process to Redis: its own id, nothing in flight (the
    # parent's calls are the parent's), and a guard no other thread holds.
    global _call_ids
    _call_ids = CallIds()


os.register_at_fork(after_in_child=_after_fork_in_child)
