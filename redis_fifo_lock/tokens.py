"""One token, one request: the tokens of a process's requests, while in use.

A token names one request (``FifoLock.acquire(token=...)``). Two requests of
one process with the same token on one lock are one request to Redis: both
callers would be handed the same grant and fence, and both would be inside at
once. ``take`` refuses the second with ``LockUsageError``, whatever client,
event loop or settings it goes through, from the moment the first acquire
starts until it raised or its lease was released or dropped. A request of the
token of a dropped lease may take its grant over; the late background release
of the dropped lease, sent under the call it replaced, leaves that grant alone
(``release.lua`` checks the call, not only the token and fence).

Every request's token is recorded, fresh ones too: a caller may pass a lease's
token (``lease.token``) to a later acquire. An entry lives as long as its
request or its lease, so the record is bounded by the requests in flight and
the leases held, never by the tokens ever used.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass, field

from . import native
from .errors import LockUsageError
from .lease import Lease
from .protocol import LockKeys
from .settings import shown_value

_in_use: dict[tuple[LockKeys, str], Use] = {}
_guard = native.rlock()  # re-entered by a lease's weak reference dying inside ``take``


def _after_fork_in_child() -> None:
    # A fork while another thread held the guard would leave it held for good.
    global _guard
    _guard = native.rlock()


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
    """

    keys: LockKeys
    token: str
    pid: int = field(default_factory=os.getpid)
    lease: weakref.ref[Lease] | None = None

    @property
    def live(self) -> bool:
        """Whether the token is still in use by this process (bool)."""
        if self.pid != os.getpid():
            return False
        if self.lease is None:
            return True
        lease = self.lease()
        return lease is not None and not lease.released

    def granted(self, lease: Lease) -> None:
        """The request was granted ``lease``: in use until it is released or dropped."""
        self.lease = weakref.ref(lease, self._dropped)

    def _dropped(self, _: object) -> None:
        self.end()

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


def in_use(keys: LockKeys | None = None) -> int:
    """How many tokens are in use in this process (int), on the lock of ``keys``
    or (None, the default) on any lock; for tests of the bound."""
    with _guard:
        return sum(1 for lock, _ in _in_use if keys is None or lock == keys)
