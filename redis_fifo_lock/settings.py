"""Validation of lock names and timing settings, done once at construction."""

from __future__ import annotations

from dataclasses import dataclass

MAX_NAME_BYTES = 1024
"""Longest lock name accepted, in bytes of UTF-8."""

MAX_NAMESPACE_BYTES = 256
"""Longest lock ``namespace`` accepted, in bytes of UTF-8."""

MAX_MS = 31_536_000_000
"""Largest duration accepted for any setting: 365 days, in milliseconds. (The
scripts do integer arithmetic on server time plus these values; far larger
numbers would lose precision in Lua.)"""

MAX_REPLICA_WAIT_MS = 1000
"""Longest default ``replica_wait_ms``, in milliseconds (see ``LockSettings``)."""


def check_name(name: object) -> str:
    """Return ``name`` if it can name a lock, else raise ``ValueError`` saying why.

    A name is a non-empty ``str`` of at most ``MAX_NAME_BYTES`` UTF-8 bytes with no
    ``{`` or ``}`` (the name becomes the Redis Cluster hash tag of every lock key)
    and no control characters.
    """
    if not isinstance(name, str):
        raise ValueError(f"lock name must be a str, got {type(name).__name__}: {name!r}")
    if not name:
        raise ValueError("lock name must not be empty: pick a name that says what it guards")
    if "{" in name or "}" in name:
        raise ValueError(
            f"lock name {name!r} contains '{{' or '}}', which would break the hash tag "
            "that keeps all of the lock's keys in one Redis Cluster slot"
        )
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        raise ValueError(f"lock name {name!r} contains control characters")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValueError(f"lock name {name!r} is not valid Unicode text: {exc.reason}") from exc
    if size > MAX_NAME_BYTES:
        raise ValueError(
            f"lock name {name[:40]!r}... is {size} bytes long; the limit is {MAX_NAME_BYTES}"
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
    def renew_every_s(self) -> float:
        """Seconds between the holder's renewals: a third of ``lease_ms``."""
        return self.lease_ms / 3000
