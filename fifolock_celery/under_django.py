"""Under Django, a task's lock is the cache's lock of the same name.

In a Django project with ``fifolock_django`` (a process whose
``DJANGO_SETTINGS_MODULE`` names settings with ``fifolock_django`` in
``INSTALLED_APPS`` or a ``FIFOLOCK`` setting), ``@fifo_locked("invoices")`` takes the lock that
``cache.fifo_lock("invoices")`` takes on the cache ``FIFOLOCK['CACHE']`` names:
the same server, credentials and TLS options (the cache's ``LOCATION`` and
``OPTIONS``), the same namespace (its ``KEY_PREFIX``) and the same Redis name
(its cache key, ``KEY_PREFIX``, ``VERSION`` and ``KEY_FUNCTION`` applied).

The Celery configuration can say otherwise, explicitly:

- ``fifo_lock_django_cache``: the alias (str) of another cache, or ``False``
  to ignore Django (the locks are then the plain Celery ones: the broker's
  server, names as written);
- ``fifo_lock_redis_url`` (with ``fifo_lock_transport_options``): another server;
- ``fifo_lock_namespace``: another namespace.

The last two make the tasks' locks differ from the views' for the same name
unless they say what the cache says; ``mismatch`` tells, and both
``manage.py check`` (``fifolock.E008``) and the worker's start warnings report it.
Django is imported only when it is installed and its settings are configured.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from celery import Celery

from redis_fifo_lock import LockServer, LockUsageError

DJANGO_CACHE_SETTING = "fifo_lock_django_cache"
"""App setting: the alias (str) of the Django cache whose locks the tasks share
(Django's settings must be configured); ``False`` for none. Default:
``FIFOLOCK['CACHE']`` in a Django project with ``fifolock_django``, else none."""


@dataclass(frozen=True)
class DjangoLocks:
    """The locks of a Django cache, as Celery tasks share them.

    Attributes:
        alias: the cache's alias (str) in ``CACHES``.
        server: where the cache keeps its locks (``LockServer``).
        namespace: the cache's ``KEY_PREFIX`` (str), in front of every lock key.
        cache: the cache backend itself (it makes the Redis names).
    """

    alias: str
    server: LockServer
    namespace: str
    cache: Any

    def name(self, name: str) -> str:
        """The Redis name of the cache's lock ``name`` (its cache key).

        Raises:
            ValueError: ``name`` is not a valid lock name on this cache.
            django.core.exceptions.ImproperlyConfigured: the cache's key
                function makes invalid lock names.
        """
        from fifolock_django.lock import lock_key

        return lock_key(self.cache, name)


def _django_configured() -> bool:
    """Whether Django is installed and its settings are configured."""
    try:
        from django.conf import settings
    except ImportError:
        return False
    return settings.configured


def _django_project() -> bool:
    """Whether this process runs a Django project (``DJANGO_SETTINGS_MODULE``, as
    ``manage.py`` and Celery's Django recipe set it) that uses ``fifolock_django``."""
    if not os.environ.get("DJANGO_SETTINGS_MODULE") or not _django_configured():
        return False
    from django.conf import settings

    return "fifolock_django" in settings.INSTALLED_APPS or hasattr(settings, "FIFOLOCK")


def django_locks(app: Celery, lock_name: str) -> DjangoLocks | None:
    """The Django cache whose locks ``app``'s tasks share, or None (see the module).

    Args:
        app: the Celery app.
        lock_name: the lock about to be used (str), named in errors.

    Raises:
        LockUsageError: naming ``fifo_lock_django_cache`` or ``FIFOLOCK['CACHE']``,
            when that cache cannot make locks (no such alias, no ``fifo_lock()``,
            settings the lock refuses), or ``fifo_lock_django_cache`` is
            neither an alias nor ``False``.
    """
    choice: object = app.conf.get(DJANGO_CACHE_SETTING)
    if choice is False:
        return None
    if choice is not None and (not isinstance(choice, str) or not choice):
        raise LockUsageError(
            lock_name,
            f"{DJANGO_CACHE_SETTING} must be the alias (str) of a Django cache, or False to "
            f"ignore Django, got {choice!r}",
        )
    if choice is None and not _django_project():
        return None
    if not _django_configured():
        raise LockUsageError(
            lock_name,
            f"{DJANGO_CACHE_SETTING} is {choice!r}, but Django's settings are not configured in "
            "this process; set DJANGO_SETTINGS_MODULE, or remove the setting",
        )
    from django.core.exceptions import ImproperlyConfigured

    from fifolock_django.conf import fifolock_settings
    from fifolock_django.lock import lock_cache, namespace_of

    source = DJANGO_CACHE_SETTING if choice is not None else "FIFOLOCK['CACHE']"
    try:
        cache: Any = lock_cache(choice)
        alias = choice or fifolock_settings().cache
        return DjangoLocks(alias, cache.fifo_lock_connection(), namespace_of(cache), cache)
    except ImproperlyConfigured as exc:
        raise LockUsageError(
            lock_name,
            f"the Django cache of the FIFO locks ({source}) cannot make locks: {exc}; fix it, "
            f"or set {DJANGO_CACHE_SETTING} to another cache (False: ignore Django)",
        ) from exc


def mismatch(server: LockServer, namespace: str, locks: DjangoLocks) -> str | None:
    """Why a Celery app's locks (on ``server``, under ``namespace``) are not the Django
    cache's locks of the same name, naming the settings; None when they are.

    The Redis names always match (tasks name their locks through the cache);
    the server and database (``LockServer.place``) and the namespace may not,
    when ``fifo_lock_redis_url`` or ``fifo_lock_namespace`` says otherwise.
    """
    from .settings import NAMESPACE_SETTING, REDIS_URL_SETTING  # (it imports this module)

    where = f"cache {locks.alias!r}"
    differences = []
    if server.place() != locks.server.place():
        differences.append(
            f"{REDIS_URL_SETTING} ({server.describe()}) is not where {where} keeps its locks "
            f"({locks.server.describe()})"
        )
    if namespace != locks.namespace:
        differences.append(
            f"{NAMESPACE_SETTING} ({namespace!r}) is not the KEY_PREFIX of {where} "
            f"({locks.namespace!r})"
        )
    if not differences:
        return None
    return (
        f"{'; '.join(differences)}: @fifo_locked(NAME) and caches[{locks.alias!r}]"
        ".fifo_lock(NAME) are two different locks that never exclude each other. Remove "
        f"CELERY_{REDIS_URL_SETTING.upper()} / CELERY_{NAMESPACE_SETTING.upper()} (the tasks "
        f"then lock where the cache does), make them the cache's, or set "
        f"CELERY_{DJANGO_CACHE_SETTING.upper()} = False if the tasks' locks are meant to be apart"
    )
