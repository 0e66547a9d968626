"""One token, one request: the tokens a process's callers gave, while in use.

A token names one request (``FifoLock.acquire(token=...)``). Two requests of
one process with the same token on one lock are one request to Redis: both
callers would be handed the same grant and fence, and both would be inside at
once. ``take`` refuses the second with ``LockUsageError``, whatever client,
event loop or settings it goes through, from the moment the first acquire
starts until it raised or its lease was released. A lease its holder dropped
unreleased keeps its token in use until the background release of its grant
is done, or its lease has run out: a request of that token taking the grant
over meanwhile would be freed by that late release.

Only tokens given by a caller are recorded (fresh random ones never meet). An
entry lives as long as its request or its lease (and a dropped lease's grant),
so the record is bounded by the requests in flight and the leases held, never
by the tokens ever used.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from dataclasses import dataclass, field

from .errors import LockUsageError
from .lease import Lease
from .protocol import LockKeys
from .settings import shown_value

_in_use: dict[tuple[LockKeys, str], Use] = {}
_guard = threading.RLock()  # re-entered by a lease's weak reference dying inside ``take``


def _after_fork_in_child() -> None:
    # A fork while another thread held the guard would leave it held for good.
    global _guard
    _guard = threading.RLock()


os.register_at_fork(after_in_child=_after_fork_in_child)


@dataclass(eq=False)
class Use:
    """One caller's use of a token on one lock: waiting, then holding.

    Attributes:
        keys: the lock's keys.
        token: the token (str).
        pid: the process that took it (int); a child forked meanwhile has its
            own requests, and its parent's uses are none of its own.
        lease: a weak reference to the lease once granted; None while waiting.
        lease_s: the lease's length in seconds (float), once granted.
        dropped_until: once the lease was dropped unreleased, when
            (``time.monotonic()``) its grant has run out at the latest.
    """

    keys: LockKeys
    token: str
    pid: int = field(default_factory=os.getpid)
    lease: weakref.ref[Lease] | None = None
    lease_s: float = 0.0
    dropped_until: float | None = None

    @property
    def live(self) -> bool:
        """Whether the token is still in use by this process (bool)."""
        if self.pid != os.getpid():
            return False
        if self.lease is None:
            return True
        if self.dropped_until is not None:
            return time.monotonic() < self.dropped_until
        lease = self.lease()
        return lease is not None and not lease.released

    def granted(self, lease: Lease, lease_s: float) -> None:
        """The request was granted ``lease`` (of ``lease_s`` seconds): in use
        until it is released, or, dropped, until its grant is released or ran
        out."""
        self.lease_s = lease_s
        self.lease = weakref.ref(lease, self._dropped)

    def _dropped(self, _: object) -> None:
        self.dropped_until = time.monotonic() + self.lease_s
        _forget_ended_drops()

    def end(self) -> None:
        """The request raised, or its lease was released or dropped: the token
        is free again."""
        with _guard:
            if _in_use.get((self.keys, self.token)) is self:
                del _in_use[(self.keys, self.token)]


def take(keys: LockKeys, token: str) -> Use:
    """Record that this process's caller uses ``token`` on the lock of ``keys``.

    Raises:
        LockUsageError: the token is in use on that lock in this process (its
            request waits, or its lease is held); nothing was sent to Redis.
    """
    with _guard:
        current = _in_use.get((keys, token))
        if current is not None and current.live:
            state = "waits for" if current.lease is None else "holds"
            raise LockUsageError(
                keys.name,
                f"a request of token {shown_value(token)} already {state} this lock in this "
                "process; a token names one request: use it again only once that acquire "
                "raised, or its lease was released",
            )
        use = Use(keys, token)
        _in_use[(keys, token)] = use
        return use


def released(keys: LockKeys, lease: Lease) -> None:
    """``lease`` (of the lock of ``keys``) was released: its token is free again."""
    with _guard:
        use = _in_use.get((keys, lease.token))
        if use is not None and use.lease is not None and use.lease() is lease:
            del _in_use[(keys, lease.token)]


def dropped_released(keys: LockKeys, token: str) -> None:
    """The grant of a lease its holder dropped (token ``token``, lock of
    ``keys``) was released in the background: the token is free again."""
    with _guard:
        use = _in_use.get((keys, token))
        if use is not None and use.dropped_until is not None:
            del _in_use[(keys, token)]


def _forget_ended_drops() -> None:
    """Forget the dropped leases whose grants have run out, whose background
    release never came (it failed, or their loop had closed)."""
    now = time.monotonic()
    with _guard:
        for key, use in list(_in_use.items()):
            if use.dropped_until is not None and use.dropped_until <= now:
                del _in_use[key]


def in_use() -> int:
    """How many tokens are in use in this process (int), for tests of the bound."""
    return len(_in_use)
