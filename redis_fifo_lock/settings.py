"""Validation of lock names and timing settings, done once at construction."""

from __future__ import annotations

import reprlib
import unicodedata
from dataclasses import dataclass

MAX_NAME_BYTES = 1024
"""Longest lock name accepted, in bytes of UTF-8."""

REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
"""Unicode categories refused in a lock name: control characters, format
characters (invisible ones such as U+200B zero-width space, and U+202E
right-to-left override) and the line and paragraph separators."""

SHOWN_CHARS = 50
"""Most characters of a refused value an error message shows."""

_short = reprlib.Repr()
_short.maxstring = _short.maxother = SHOWN_CHARS
MAX_NAMESPACE_BYTES = 256
"""Longest lock ``namespace`` accepted, in bytes of UTF-8."""

MAX_MS = 31_536_000_000
"""Largest duration accepted for any setting: 365 days, in milliseconds. (The
scripts do integer arithmetic on server time plus these values; far larger
numbers would lose precision in Lua.)"""

KEEP_FLOOR_MS = 10_000
"""Shortest time, in milliseconds, an idle lock name's keys and the record of a
finished request are kept (see ``LockSettings.keep_ms``)."""

MAX_REPLICA_WAIT_MS = 1000
"""Longest default ``replica_wait_ms``, in milliseconds (see ``LockSettings``)."""


def shown_value(value: object) -> str:
    """``repr(value)`` cut to about ``SHOWN_CHARS`` characters, for error messages:
    a long ``str`` or ``bytes`` is shown by its start and its length."""
    if isinstance(value, (str, bytes)):
        text = repr(value[:SHOWN_CHARS])
        if len(text) <= SHOWN_CHARS + 3 and len(value) <= SHOWN_CHARS:
            return text
        unit = "characters" if isinstance(value, str) else "bytes"
        return f"{text[:SHOWN_CHARS]}... ({len(value)} {unit})"
    return _short.repr(value)


def check_name(name: object) -> str:
    """Return ``name`` if it can name a lock, else raise ``ValueError`` saying why.

    A name is a non-empty ``str`` of at most ``MAX_NAME_BYTES`` UTF-8 bytes with no
    ``{`` or ``}`` (the name becomes the Redis Cluster hash tag of every lock key)
    and no character of the ``REFUSED_CATEGORIES`` (control, invisible format
    and line or paragraph separator characters), which the message names by
    code point (``U+202E``). The message shows at most ``SHOWN_CHARS``
    characters of the name.
    """
    if not isinstance(name, str):
        raise ValueError(f"lock name must be a str, got {type(name).__name__}: {shown_value(name)}")
    if not name:
        raise ValueError("lock name must not be empty: pick a name that says what it guards")
    if "{" in name or "}" in name:
        raise ValueError(
            f"lock name {shown_value(name)} contains '{{' or '}}', which would break the "
            "hash tag that keeps all of the lock's keys in one Redis Cluster slot"
        )
    # A longer name is refused for its length anyway: look no further.
    for index, char in enumerate(name[: MAX_NAME_BYTES + 1]):
        category = unicodedata.category(char)
        if category in REFUSED_CATEGORIES:
            raise ValueError(
                f"lock name {shown_value(name)} contains U+{ord(char):04X} "
                f"({unicodedata.name(char, 'a control character')}, category {category}) at "
                f"index {index}: control, invisible format and line or paragraph separator "
                "characters are refused, as they hide what a name says in logs and tools; "
                "remove it"
            )
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"lock name {shown_value(name)} is not valid Unicode text: {exc.reason}"
        ) from None
    if size > MAX_NAME_BYTES:
        raise ValueError(
            f"lock name {shown_value(name)} is {size} bytes long (UTF-8); the limit is "
            f"{MAX_NAME_BYTES}: use a shorter name"
        )
    return name


def check_namespace(namespace: object) -> str:
    """Return ``namespace`` if it can go in front of a lock's keys, else raise
    ``ValueError`` saying why.

    A namespace is a ``str`` ("" for none) of at most ``MAX_NAMESPACE_BYTES``
    UTF-8 bytes with no ``{`` or ``}`` (the lock name must stay the keys' only
    hash tag) and no control characters.
    """
    if not isinstance(namespace, str):
        raise ValueError(
            f"lock namespace must be a str, got {type(namespace).__name__}: {namespace!r}"
        )
    size = len(namespace.encode("utf-8", errors="replace"))
    if size > MAX_NAMESPACE_BYTES:
        raise ValueError(
            f"lock namespace {namespace[:40]!r}... is {size} bytes long; the limit is "
            f"{MAX_NAMESPACE_BYTES}"
        )
    for brace in "{}":
        if brace in namespace:
            raise ValueError(
                f"lock namespace {namespace!r} contains {brace!r}: the lock name must stay "
                "the only Redis Cluster hash tag of the lock's keys"
            )
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in namespace):
        raise ValueError(f"lock namespace {namespace!r} contains control characters")
    return namespace


def _positive_ms(setting: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"{setting} must be a whole number of milliseconds (int), "
            f"got {type(value).__name__}: {value!r}"
        )
    if value <= 0:
        raise ValueError(f"{setting} must be positive, got {value}")
    if value > MAX_MS:
        raise ValueError(f"{setting} must be at most {MAX_MS} (365 days), got {value}")
    return value


def _count(setting: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"{setting} must be a whole number (int), got {type(value).__name__}: {value!r}"
        )
    if value < 0:
        raise ValueError(f"{setting} must be 0 or more, got {value}")
    return value


@dataclass(frozen=True)
class LockSettings:
    """The timing settings of a lock, validated on construction.

    Attributes:
        lease_ms: how long (int, milliseconds) a grant survives without renewal;
            bounds crash detection. Default 60_000.
        poll_ms: how often (int, milliseconds) a waiting process asks Redis for
            its grant when no doorbell rang. Must be at most ``lease_ms / 2``.
            Default 30_000.
        max_hold_ms: how long (int, milliseconds) one grant may be renewed in
            total. Must be at least ``lease_ms``. Default 1_800_000.
        replicas: how many replicas (int) must have each grant and renewal
            before it counts (Redis ``WAIT``, sent in the same round trip as
            the script). Default 0: count what the master replied, as plain
            Redis does. With Sentinel, 1 or more makes a grant or renewal
            survive a failover to a replica that acknowledged it; a grant that
            is not acknowledged in time is given back and ``acquire`` raises
            ``NotReplicated``, and a renewal that is not acknowledged counts as
            failed. Not supported on Redis Cluster.
        replica_wait_ms: how long (int, milliseconds) each grant or renewal
            waits for the ``replicas`` acknowledgements (the ``WAIT`` timeout).
            At most ``lease_ms / 3``, the renewal interval. Default None: a
            tenth of ``lease_ms``, at most 1000 ms (see ``ack_wait_ms``).

    Raises:
        ValueError: naming the setting, when a value is not a positive int
            (bools and floats are refused) or the settings are inconsistent.
    """

    lease_ms: int = 60_000
    poll_ms: int = 30_000
    max_hold_ms: int = 1_800_000
    replicas: int = 0
    replica_wait_ms: int | None = None

    def __post_init__(self) -> None:
        _positive_ms("lease_ms", self.lease_ms)
        _positive_ms("poll_ms", self.poll_ms)
        _positive_ms("max_hold_ms", self.max_hold_ms)
        if self.lease_ms < 30:
            raise ValueError(f"lease_ms must be at least 30 ms, got {self.lease_ms}")
        if self.poll_ms * 2 > self.lease_ms:
            raise ValueError(
                f"poll_ms ({self.poll_ms}) must be at most half of lease_ms ({self.lease_ms}): "
                "a waiter whose doorbell was lost must poll before a grant made to it expires"
            )
        if self.max_hold_ms < self.lease_ms:
            raise ValueError(
                f"max_hold_ms ({self.max_hold_ms}) must be at least lease_ms ({self.lease_ms})"
            )
        _count("replicas", self.replicas)
        if self.replica_wait_ms is not None:
            _positive_ms("replica_wait_ms", self.replica_wait_ms)
            if self.replica_wait_ms * 3 > self.lease_ms:
                raise ValueError(
                    f"replica_wait_ms ({self.replica_wait_ms}) must be at most a third of "
                    f"lease_ms ({self.lease_ms}): a renewal must not wait past the next one"
                )

    @property
    def ack_wait_ms(self) -> int:
        """Milliseconds each grant or renewal waits for its replica acknowledgements:
        ``replica_wait_ms``, or by default a tenth of ``lease_ms``, at most 1000."""
        if self.replica_wait_ms is not None:
            return self.replica_wait_ms
        return max(1, min(MAX_REPLICA_WAIT_MS, self.lease_ms // 10))

    @property
    def keep_ms(self) -> int:
        """Milliseconds a lock name's keys outlive its last use (no holder, no
        waiter, no script call), and a process's records of ended requests
        outlive the last script that spoke of that process, so that a late
        copy of one of its scripts changes nothing (``redis_fifo_lock.calls``):
        twice ``lease_ms``, at least ``KEEP_FLOOR_MS`` (10 s)."""
        return max(2 * self.lease_ms, KEEP_FLOOR_MS)

    @property
    def renew_every_s(self) -> float:
        """Seconds between the holder's renewals: a third of ``lease_ms``."""
        return self.lease_ms / 3000
