"""System checks (``manage.py check``) for the FIFO lock settings.

Registered under the ``caches`` tag when ``"fifolock_django"`` is in
``INSTALLED_APPS``. Each function returns a list of messages; ids are stable:

- ``fifolock.E001`` the ``FIFOLOCK['CACHE']`` cache has no ``fifo_lock()``
  (it is not a Redis FIFO lock backend).
- ``fifolock.E002`` ``FIFOLOCK['CACHE']`` is not an alias in ``CACHES``.
- ``fifolock.E003`` the ``FIFOLOCK`` setting is invalid.
- ``fifolock.E004`` a cache with ``fifo_lock()`` cannot make locks (a
  ``KEY_PREFIX`` with ``{`` or ``}``, an unsupported ``LOCATION``...).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.cache import caches
from django.core.checks import CheckMessage, Error, Tags, register
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from .conf import SETTING, fifolock_settings

LOCK_BACKEND = "fifolock_django.cache.RedisCache"
"""Dotted path of the cache backend that provides ``fifo_lock()``."""


@register(Tags.caches)
def check_fifolock_setting(
    app_configs: Sequence[AppConfig] | None, **kwargs: Any
) -> list[CheckMessage]:
    """``fifolock.E003`` when ``settings.FIFOLOCK`` is invalid."""
    try:
        fifolock_settings()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), hint=f"Fix settings.{SETTING}.", id="fifolock.E003")]
    return []


@register(Tags.caches)
def check_lock_cache(app_configs: Sequence[AppConfig] | None, **kwargs: Any) -> list[CheckMessage]:
    """``fifolock.E002``/``E001`` when ``FIFOLOCK['CACHE']`` names no cache, or
    a cache whose backend has no ``fifo_lock()``."""
    try:
        alias = fifolock_settings().cache
    except ImproperlyConfigured:
        return []  # reported as fifolock.E003
    config = settings.CACHES.get(alias)
    if config is None:
        return [
            Error(
                f"{SETTING}['CACHE'] is {alias!r}, which is not an alias in CACHES.",
                hint=f"Set {SETTING}['CACHE'] to one of {sorted(settings.CACHES)}.",
                id="fifolock.E002",
            )
        ]
    backend = config.get("BACKEND", "")
    try:
        has_lock = callable(getattr(import_string(backend), "fifo_lock", None))
    except ImportError:
        return []  # Django reports the broken BACKEND itself
    if has_lock:
        return []
    return [
        Error(
            f"The FIFO lock cache {alias!r} uses BACKEND {backend!r}, which is not a "
            "Redis FIFO lock backend (it has no fifo_lock()).",
            hint=(
                f"Set CACHES[{alias!r}]['BACKEND'] to {LOCK_BACKEND!r}, or point "
                f"{SETTING}['CACHE'] at a cache that uses it."
            ),
            id="fifolock.E001",
        )
    ]


@register(Tags.caches)
def check_lock_caches_make_locks(
    app_configs: Sequence[AppConfig] | None, **kwargs: Any
) -> list[CheckMessage]:
    """``fifolock.E004`` for each cache with ``fifo_lock()`` whose configuration
    cannot make a lock (nothing is sent to Redis)."""
    try:
        fifolock_settings()
    except ImproperlyConfigured:
        return []  # reported as fifolock.E003
    errors: list[CheckMessage] = []
    for alias in settings.CACHES:
        fifo_lock = getattr(caches[alias], "fifo_lock", None)
        if not callable(fifo_lock):
            continue
        try:
            fifo_lock("fifolock-check")
        except ImproperlyConfigured as exc:
            errors.append(
                Error(
                    f"Cache {alias!r} cannot make FIFO locks: {exc}",
                    hint=f"Fix CACHES[{alias!r}].",
                    id="fifolock.E004",
                )
            )
    return errors
