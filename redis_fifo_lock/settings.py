"""Validation of lock names and timing settings, done once at construction."""

from __future__ import annotations

import reprlib
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, TypedDict

from .memo import cached_attribute

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

MAX_REPLICAS = 1000
"""Most ``replicas`` accepted: far more than any primary has. (A larger number
could never be acknowledged, and Redis refuses one beyond a 64-bit integer.)"""

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


LOCK_OPTIONS = ("lease_ms", "poll_ms", "max_hold_ms", "replicas", "replica_wait_ms")
"""The lock options: the fields of ``LockSettings``, and the keyword arguments of
every lock (``FifoLock``, ``SyncFifoLock``, ``@fifo_locked``, ``cache.fifo_lock``)."""


class LockOptions(TypedDict, total=False):
    """The lock options as keyword arguments (each optional; see ``LockSettings``
    for units, defaults and rules): ``lease_ms``, ``poll_ms``, ``max_hold_ms``,
    ``replica_wait_ms`` (int milliseconds) and ``replicas`` (int). In the
    Celery and Django integrations None means "the configured value"."""

    lease_ms: int | None
    poll_ms: int | None
    max_hold_ms: int | None
    replicas: int | None
    replica_wait_ms: int | None


Spelling = Callable[[str], str]
"""How a caller spells a lock option in its own settings, for error messages:
``"lease_ms"`` -> ``"FIFOLOCK['LEASE_MS']"``, ``"fifo_lock_lease_ms"``..."""


def check_option(option: str, value: object, spelled: str | None = None) -> int:
    """Return ``value`` if it can be the lock option ``option`` on its own: a
    positive int of milliseconds (at most ``MAX_MS``), or for ``replicas`` an
    int of 0 or more (at most ``MAX_REPLICAS``). The rules between options are ``LockSettings``'.

    Args:
        option: one of ``LOCK_OPTIONS``.
        value: the value to check (None is refused: leave the option out).
        spelled: how the caller spells the option, for the message; default
            ``option``.

    Raises:
        ValueError: naming ``spelled``, for a bool, float, str or out-of-range value.
    """
    setting = spelled or option
    if option == "replicas":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(
                f"{setting} must be a whole number (int), got {type(value).__name__}: {value!r}"
            )
        if value < 0:
            raise ValueError(f"{setting} must be 0 or more, got {value}")
        if value > MAX_REPLICAS:
            raise ValueError(
                f"{setting} must be at most {MAX_REPLICAS}, got {shown_value(value)}: it "
                "counts the replicas that must have each grant"
            )
        return value
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


def given_options(options: Mapping[str, object], spell: Spelling = str) -> dict[str, int]:
    """The lock options given in ``options`` (None values left out), each checked
    on its own (``check_option``); the rules between them are ``LockSettings``'.

    Args:
        options: a value per option; keys among ``LOCK_OPTIONS``.
        spell: how the caller spells an option, for messages; default its name.

    Raises:
        TypeError: a key that is not a lock option.
        ValueError: naming the option as ``spell`` spells it, as ``check_option``.
    """
    unknown = sorted(set(options) - set(LOCK_OPTIONS))
    if unknown:
        raise TypeError(
            f"unknown lock option(s) {', '.join(unknown)}; the options are "
            f"{', '.join(LOCK_OPTIONS)}"
        )
    return {
        option: check_option(option, value, spell(option))
        for option, value in options.items()
        if value is not None
    }


def _check_settings(values: Mapping[str, Any], spell: Spelling, cluster: str | None) -> None:
    """Every rule of ``LockSettings`` on ``values`` (a value per option), the
    messages naming each option as ``spell`` spells it. ``cluster``: where the
    lock lives when that is a Redis Cluster (a description), else None."""
    for option in LOCK_OPTIONS:
        if option != "replica_wait_ms" or values[option] is not None:
            check_option(option, values[option], spell(option))
    lease, poll, hold = values["lease_ms"], values["poll_ms"], values["max_hold_ms"]
    if lease < 30:
        raise ValueError(f"{spell('lease_ms')} must be at least 30 ms, got {lease}")
    if poll * 2 > lease:
        raise ValueError(
            f"{spell('poll_ms')} ({poll}) must be at most half of {spell('lease_ms')} "
            f"({lease}): a waiter whose doorbell was lost must poll before a grant made to "
            "it expires"
        )
    if hold < lease:
        raise ValueError(
            f"{spell('max_hold_ms')} ({hold}) must be at least {spell('lease_ms')} ({lease})"
        )
    wait = values["replica_wait_ms"]
    if wait is not None and wait * 3 > lease:
        raise ValueError(
            f"{spell('replica_wait_ms')} ({wait}) must be at most a third of "
            f"{spell('lease_ms')} ({lease}): a renewal must not wait past the next one"
        )
    if values["replicas"] and cluster is not None:
        raise ValueError(
            f"{spell('replicas')} is {values['replicas']}, but the lock is on a Redis Cluster "
            f"({cluster}), where a lock cannot wait for replicas (WAIT cannot follow the "
            "lock's script on its connection there); set it to 0"
        )


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
            failed. Not supported on Redis Cluster. At most ``MAX_REPLICAS``.
        replica_wait_ms: how long (int, milliseconds) each grant or renewal
            waits for the ``replicas`` acknowledgements (the ``WAIT`` timeout).
            At most ``lease_ms / 3``, the renewal interval. Default None: a
            tenth of ``lease_ms``, at most 1000 ms (see ``ack_wait_ms``).

    Raises:
        ValueError: naming the setting, when a value is not a positive int
            (bools and floats are refused) or the settings are inconsistent.

    ``merged`` builds one from a caller's settings, naming them as it spells them.
    """

    lease_ms: int = 60_000
    poll_ms: int = 30_000
    max_hold_ms: int = 1_800_000
    replicas: int = 0
    replica_wait_ms: int | None = None

    def __post_init__(self) -> None:
        _check_settings(self._values(), str, None)

    def _values(self) -> dict[str, Any]:
        """The options, by name (not the cached hash)."""
        return asdict(self)

    @cached_attribute
    def _hash(self) -> int:
        return hash(tuple(self._values().values()))

    def __hash__(self) -> int:
        # Worked out once: the settings key a hub's dicts, looked up on every call.
        return self._hash

    def __getstate__(self) -> dict[str, Any]:
        # The options, not the cached hash: a pickle may travel to another process.
        return self._values()

    def merged(
        self,
        *layers: tuple[Mapping[str, object], Spelling],
        base_spell: Spelling = str,
        cluster: str | None = None,
    ) -> LockSettings:
        """These settings with each layer of options applied in turn, all rules
        checked once, on the result.

        The one place where a caller's settings become a ``LockSettings``, e.g.
        ``LockSettings().merged((app_settings, app_spelling), (task_options,
        task_spelling))``: a later layer wins, and every message names each
        option as the layer it came from spells it.

        Args:
            *layers: ``(values, spell)`` pairs: a value per option (keys among
                ``LOCK_OPTIONS``; None keeps the value below) and how the caller
                spells an option of that layer (e.g. ``lambda option:
                f"fifo_lock_{option}"``).
            base_spell: how the caller spells an option that no layer gives;
                default its name.
            cluster: where the lock lives when that is a Redis Cluster (a
                description for the message, see ``LockServer.describe``);
                None (default) when it is not.

        Raises:
            TypeError: a key that is not a lock option.
            ValueError: naming each option as the caller spells it, for a value
                ``check_option`` refuses (see ``given_options``), options
                inconsistent with each other (see the class), or ``replicas``
                above 0 on a Redis Cluster.
        """
        values = self._values()
        names = {option: base_spell(option) for option in LOCK_OPTIONS}
        for overrides, spell in layers:
            for option, value in given_options(overrides, spell).items():
                values[option], names[option] = value, spell(option)
        _check_settings(values, names.__getitem__, cluster)
        return LockSettings(**values)

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
