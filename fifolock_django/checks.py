"""System checks (``manage.py check``) for the FIFO lock settings and servers.

Registered under the ``caches`` tag when ``"fifolock_django"`` is in
``INSTALLED_APPS``. Each function returns a list of messages; ids are stable:

- ``fifolock.E001`` the ``FIFOLOCK['CACHE']`` cache has no ``fifo_lock()``
  (not a Redis backend at all - locmem, dummy, file and database caches lock
  nothing across processes - or a Redis backend without this package's mixin).
- ``fifolock.E002`` ``FIFOLOCK['CACHE']`` is not an alias in ``CACHES``.
- ``fifolock.E003`` the ``FIFOLOCK`` setting is invalid.
- ``fifolock.E004`` a cache with ``fifo_lock()`` cannot make locks (a
  ``KEY_PREFIX`` with ``{`` or ``}``, Sentinel options without ``SENTINELS``
  or without django-redis's Sentinel connection factory, a Redis Cluster URL
  with a database other than 0, Sentinel on Django's built-in backend, a
  ``SOCKET_TIMEOUT``/``socket_timeout``/``socket_connect_timeout`` that is no
  number of seconds above 0...).
- ``fifolock.E007`` ``FIFOLOCK['REPLICAS']`` is above 0 and a cache with
  ``fifo_lock()`` keeps its locks on a Redis Cluster, which cannot wait for
  replicas.
- ``fifolock.E008`` the current Celery app (when ``fifolock_celery`` is
  installed) keeps its FIFO locks on another server, database or namespace
  than the cache ``FIFOLOCK`` names, so ``@fifo_locked(NAME)`` and
  ``cache.fifo_lock(NAME)`` would be different locks (see
  ``fifolock_celery.under_django``).
  When no Celery app was made in the process (the project package does not
  import it, as Celery's Django recipe does), the ``CELERY_*`` settings are
  checked as that recipe reads them.

With ``manage.py check --deploy`` only (they talk to each lock cache's server,
waiting at most ``SERVER_CHECK_TIMEOUT_S`` seconds for it). The server is the
master found through the sentinels for a Sentinel cache, and every primary
for a Redis Cluster:

- ``fifolock.E005`` the server's ``maxmemory-policy`` can evict lock keys.
- ``fifolock.E006`` the server cannot be reached, or cannot be used: it
  refuses the credentials, or answers with another error than a refusal of
  ``CONFIG GET`` (such as ``DB index is out of range`` for a database it does
  not have), which every lock would meet too.
- ``fifolock.W001`` the server refuses ``CONFIG GET`` (``NOPERM``, or the
  command renamed or disabled, as is common on managed services), so its
  eviction policy is unknown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.cache import caches
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string
from redis.exceptions import RedisClusterException, RedisError, ResponseError

from redis_fifo_lock import LockUsageError, LoopClients
from redis_fifo_lock.eviction import EVICTING_POLICIES, refuses_config_get
from redis_fifo_lock.eviction import eviction_policies as eviction_policies_of
from redis_fifo_lock.portal import portal

from .conf import SETTING, fifolock_settings
from .lock import LOCK_BACKENDS, FifoLockMixin, suggested_backend

SERVER_CHECK_TIMEOUT_S = 5.0
"""Seconds the deploy checks wait for each lock server before calling it unreachable."""

CHECK_LOCK = "fifolock-check"
"""Lock name used to try a cache's ``fifo_lock()`` (nothing is sent to Redis)."""


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
    if backend in LOCK_BACKENDS:
        return [
            Error(
                f"The FIFO lock cache {alias!r} uses BACKEND {backend!r}, which has no "
                "fifo_lock().",
                hint=(
                    f"Set CACHES[{alias!r}]['BACKEND'] to {suggested_backend(backend)}: the "
                    "same backend plus fifo_lock()."
                ),
                id="fifolock.E001",
            )
        ]
    return [
        Error(
            f"The FIFO lock cache {alias!r} uses BACKEND {backend!r}, which is not a Redis "
            "backend: it cannot make locks that exclude other processes (locmem, dummy, "
            "file and database caches give no lock across processes).",
            hint=(
                f"Use a Redis cache with BACKEND {suggested_backend(backend)} for "
                f"CACHES[{alias!r}], or point {SETTING}['CACHE'] at one."
            ),
            id="fifolock.E001",
        )
    ]


def _lock_caches() -> list[tuple[str, Any]]:
    """(alias, backend) of every cache in ``CACHES`` that has ``fifo_lock()``."""
    found = []
    for alias in settings.CACHES:
        cache = caches[alias]
        if callable(getattr(cache, "fifo_lock", None)):
            found.append((alias, cache))
    return found


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
    for alias, cache in _lock_caches():
        try:
            cache.fifo_lock(CHECK_LOCK, replicas=0)  # replicas: fifolock.E007
        except ImproperlyConfigured as exc:
            errors.append(
                Error(
                    f"Cache {alias!r} cannot make FIFO locks: {exc}",
                    hint=f"Fix CACHES[{alias!r}].",
                    id="fifolock.E004",
                )
            )
    return errors


@register(Tags.caches)
def check_replicas_on_cluster(
    app_configs: Sequence[AppConfig] | None, **kwargs: Any
) -> list[CheckMessage]:
    """``fifolock.E007`` for each cache with ``fifo_lock()`` that makes locks with
    ``replicas=0`` but not with ``FIFOLOCK['REPLICAS']`` (the core refuses
    replicas on a Redis Cluster). Nothing is sent to Redis."""
    try:
        fifolock_settings()
    except ImproperlyConfigured:
        return []  # reported as fifolock.E003
    errors: list[CheckMessage] = []
    for alias, cache in _lock_caches():
        try:
            cache.fifo_lock(CHECK_LOCK, replicas=0)
        except ImproperlyConfigured:
            continue  # reported as fifolock.E004
        try:
            cache.fifo_lock(CHECK_LOCK)
        except ImproperlyConfigured as exc:
            errors.append(
                Error(
                    f"Cache {alias!r} cannot make FIFO locks with {SETTING}['REPLICAS']: {exc}.",
                    hint=(
                        f"Set {SETTING}['REPLICAS'] to 0, or pass replicas=0 to every "
                        f"fifo_lock() on cache {alias!r}."
                    ),
                    id="fifolock.E007",
                )
            )
    return errors


def _celerys_fallback(app: Any) -> bool:
    """Whether the Celery ``app`` is the fallback Celery makes up, with
    ``set_as_current=False``, when the current app is asked for and no app was
    made in the process. The recipe's app becomes the current one, and under
    Django the default one too, so every thread sees it."""
    from celery.app import default_app

    fallback: Any = default_app  # a proxy of the app Celery falls back on
    return app is fallback._get_current_object() and not app.set_as_current


@register(Tags.caches)
def check_celery_shares_the_locks(
    app_configs: Sequence[AppConfig] | None, **kwargs: Any
) -> list[CheckMessage]:
    """``fifolock.E008`` when the current Celery app's FIFO locks are not the
    cache's locks of the same names (nothing is sent to Redis). Without a
    Celery app made in this process, the app Celery's Django recipe makes from
    the ``CELERY_*`` settings is checked. Silent without Celery, and when the
    app's lock settings are invalid (the worker's start warnings say why)."""
    try:
        from celery import Celery
        from celery.app import app_or_default

        from fifolock_celery import LockConfig
    except ImportError:
        return []
    app = app_or_default()  # the current app itself, not a proxy of it
    checked = f"The Celery app {app.main!r}"
    if _celerys_fallback(app):
        app = Celery("fifolock-check", set_as_current=False, fixups=[])
        app.config_from_object("django.conf:settings", namespace="CELERY")
        checked = (
            "The Celery app that Celery's Django recipe makes from the CELERY_* settings "
            "(checked as no Celery app was made in this process)"
        )
    try:
        different = LockConfig.from_app(app, CHECK_LOCK).django_mismatch()
    except (LockUsageError, ValueError, ImproperlyConfigured):
        return []
    if different is None:
        return []
    return [
        Error(
            f"{checked} does not share the FIFO locks of Django's cache: {different}.",
            hint=(
                "Let Celery take the locks' server and namespace from the cache: remove "
                "CELERY_FIFO_LOCK_REDIS_URL and CELERY_FIFO_LOCK_NAMESPACE."
            ),
            id="fifolock.E008",
        )
    ]


def eviction_policies(clients: LoopClients, timeout_s: float = SERVER_CHECK_TIMEOUT_S) -> set[str]:
    """The ``maxmemory-policy`` values (str) of the server(s) behind ``clients``.

    Asked over the lock's own connection settings, on the sync portal's loop:
    the one server, the master found through Sentinel, or every primary of a
    Redis Cluster (whose policies may differ, hence a set).

    Args:
        clients: the lock connections of a cache (``fifo_lock_clients``).
        timeout_s: seconds (float) to wait for the answers.

    Raises:
        ResponseError: a server refuses ``CONFIG GET`` (disabled, or an ACL).
        RedisError: a server cannot be reached, or refuses the credentials
            (Sentinel: no sentinel knows the master).
        RedisClusterException: no node of a cluster can be reached.
        TimeoutError: no answer within ``timeout_s``.
    """

    async def read() -> set[str]:
        return await asyncio.wait_for(eviction_policies_of(clients.client()), timeout_s)

    return portal().call(CHECK_LOCK, read)


@register(Tags.caches, deploy=True)
def check_lock_servers(
    app_configs: Sequence[AppConfig] | None, **kwargs: Any
) -> list[CheckMessage]:
    """``--deploy`` only: ``fifolock.E006`` when a lock cache's server cannot be
    reached or used (any error but a refusal of ``CONFIG GET``, see
    ``refuses_config_get``), ``E005`` when its eviction policy can evict lock
    keys, ``W001`` when the server refuses ``CONFIG GET``."""
    messages: list[CheckMessage] = []
    for alias, cache in _lock_caches():
        if not isinstance(cache, FifoLockMixin):
            continue
        try:
            connection = cache.fifo_lock_connection()
            clients = cache.fifo_lock_clients
        except ImproperlyConfigured:
            continue  # reported as fifolock.E004
        where = f"The Redis server of cache {alias!r} ({connection.describe()})"
        try:
            policies = eviction_policies(clients)
        except ResponseError as exc:
            if not refuses_config_get(exc):
                messages.append(
                    Error(
                        f"{where} cannot be used: it answers the error {str(exc).rstrip('.')!r}.",
                        hint=(
                            f"Check CACHES[{alias!r}]['LOCATION'] and ['OPTIONS'] (database "
                            "number, credentials, TLS) against the server's configuration; "
                            "until it can be used, every FIFO lock raises RedisUnavailable."
                        ),
                        id="fifolock.E006",
                    )
                )
                continue
            messages.append(
                Warning(
                    f"{where} refuses CONFIG GET maxmemory-policy ({exc}), so it is unknown "
                    "whether it can evict FIFO lock keys.",
                    hint=(
                        "Make sure the server's maxmemory-policy is 'noeviction' by other "
                        "means (managed services show it in their parameter settings)."
                    ),
                    id="fifolock.W001",
                )
            )
            continue
        except (
            RedisError,
            RedisClusterException,
            OSError,
            TimeoutError,
            asyncio.TimeoutError,
        ) as exc:
            reason = str(exc).rstrip(".") or f"no answer within {SERVER_CHECK_TIMEOUT_S:g} s"
            messages.append(
                Error(
                    f"{where} cannot be reached: {reason}.",
                    hint=(
                        f"Check CACHES[{alias!r}]['LOCATION'] and ['OPTIONS'] (address, "
                        "credentials, TLS) and that the server is running; until it can be "
                        "reached, every FIFO lock raises RedisUnavailable."
                    ),
                    id="fifolock.E006",
                )
            )
            continue
        evicting = sorted(policy for policy in policies if policy.startswith(EVICTING_POLICIES))
        if evicting:
            shown = " and ".join(repr(policy) for policy in evicting)
            messages.append(
                Error(
                    f"{where} has maxmemory-policy {shown}, which can evict FIFO lock "
                    "keys: a held lock would be freed silently and the fence counter could "
                    "go back.",
                    hint=(
                        "Set maxmemory-policy to 'noeviction' on that server (redis.conf or "
                        "CONFIG SET), or give the locks a Redis server of their own in a "
                        f"separate cache and point {SETTING}['CACHE'] at it."
                    ),
                    id="fifolock.E005",
                )
            )
    return messages
