"""The ``FIFOLOCK`` setting: project-wide defaults for Django's FIFO locks.

Every key is optional; the defaults are the core's::

    FIFOLOCK = {
        "LEASE_MS": 60_000,       # int, milliseconds a grant survives unrenewed
        "POLL_MS": 30_000,        # int, milliseconds between a waiter's polls
        "MAX_HOLD_MS": 1_800_000, # int, milliseconds one grant may be renewed for
        "REPLICAS": 0,            # int, replicas that must acknowledge each grant/renewal
        "REPLICA_WAIT_MS": None,  # int or None, milliseconds to wait for them
        "CACHE": "default",       # str, alias in CACHES: fifo_locked_command, fifolock, lock_name
    }

The setting is read each time a lock is made, never cached at import, so
``override_settings(FIFOLOCK=...)`` takes effect at once. ``POLL_MS`` must be at
most half of ``LEASE_MS``, ``MAX_HOLD_MS`` at least ``LEASE_MS`` and
``REPLICA_WAIT_MS`` at most a third of ``LEASE_MS`` (None: a tenth of
``LEASE_MS``, at most 1000); see ``redis_fifo_lock.LockSettings``. ``REPLICAS``
above 0 (for Sentinel set-ups) makes every grant and renewal wait for that many
replicas, and cannot be used with a Redis Cluster cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from redis_fifo_lock import LockSettings
from redis_fifo_lock.settings import LOCK_OPTIONS

SETTING = "FIFOLOCK"
"""Name of the Django setting (a dict) read by this module."""

DEFAULTS: dict[str, Any] = {
    "LEASE_MS": 60_000,
    "POLL_MS": 30_000,
    "MAX_HOLD_MS": 1_800_000,
    "REPLICAS": 0,
    "REPLICA_WAIT_MS": None,
    "CACHE": "default",
}
"""Value of each ``FIFOLOCK`` key when the project does not set it."""


def setting_name(option: str) -> str:
    """How the project spells a lock option (``LockSettings`` field) in its
    settings: ``lease_ms`` -> ``FIFOLOCK['LEASE_MS']``."""
    return f"{SETTING}[{option.upper()!r}]"


@dataclass(frozen=True)
class FifoLockConfig:
    """The ``FIFOLOCK`` setting, validated.

    Attributes:
        cache: alias (str) of the cache in ``CACHES`` whose ``fifo_lock()`` the
            management-command decorator, ``manage.py fifolock``, ``lock_name()``
            and the system checks use by default.
        lock: the defaults (``LockSettings``: ``lease_ms``, ``poll_ms``,
            ``max_hold_ms``, ``replica_wait_ms`` in int milliseconds, and
            ``replicas``) of every ``fifo_lock()``.
    """

    cache: str
    lock: LockSettings


def fifolock_settings() -> FifoLockConfig:
    """Read and validate ``settings.FIFOLOCK`` now (nothing is cached).

    Raises:
        ImproperlyConfigured: naming the key, e.g. ``FIFOLOCK['POLL_MS']``, when
            the setting is not a dict, has an unknown key, or holds a value the
            core refuses (not a positive int of milliseconds, ``POLL_MS`` more
            than half of ``LEASE_MS``, ``MAX_HOLD_MS`` under ``LEASE_MS``,
            ``REPLICAS`` not an int of 0 to 1000, ``REPLICA_WAIT_MS`` more than
            a third of ``LEASE_MS``).
    """
    given = getattr(settings, SETTING, None)
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise ImproperlyConfigured(
            f"{SETTING} must be a dict with keys among {sorted(DEFAULTS)}, "
            f"got {type(given).__name__}: {given!r}"
        )
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise ImproperlyConfigured(
            f"{SETTING} has unknown key(s) {unknown}; the keys are {sorted(DEFAULTS)}"
        )
    values = {**DEFAULTS, **given}
    cache = values["CACHE"]
    if not isinstance(cache, str) or not cache:
        raise ImproperlyConfigured(
            f"{SETTING}['CACHE'] must be the alias (str) of a cache in CACHES, got {cache!r}"
        )
    try:
        configured = {option: values[option.upper()] for option in LOCK_OPTIONS}
        lock = LockSettings().merged((configured, setting_name))
    except ValueError as exc:
        raise ImproperlyConfigured(str(exc)) from exc
    return FifoLockConfig(cache=cache, lock=lock)
