"""The ``fifo_lock_*`` settings of a Celery app, read at run time.

Celery settings are read from ``app.conf``, so they can live wherever the app's
configuration lives. Under Django with ``namespace="CELERY"`` each is spelled in
capitals with the prefix, e.g. ``CELERY_FIFO_LOCK_REDIS_URL``.

================================  ==================================================
``fifo_lock_django_cache``        Under Django: the alias (str) of the cache whose
                                  locks the tasks share; False: ignore Django.
                                  Default ``FIFOLOCK['CACHE']`` when the project
                                  uses ``fifolock_django`` (see
                                  ``fifolock_celery.under_django``).
``fifo_lock_redis_url``           Redis URL of the locks (str). Default: under
                                  Django the cache's server, else the broker
                                  URL when that is ``redis://``, ``rediss://`` or
                                  ``sentinel://`` (one or several).
``fifo_lock_transport_options``   Dict: ``master_name`` and ``sentinel_kwargs``
                                  for a ``sentinel://`` URL, ``"cluster": True``
                                  for Redis Cluster nodes, ``ssl_*`` TLS options
                                  (any of them means TLS). Default: the
                                  ``broker_transport_options`` when the URL is the
                                  broker's, else none. With the broker's URL,
                                  ``broker_use_ssl`` applies too.
``fifo_lock_namespace``           Put in front of every lock key (str). Default:
                                  under Django the cache's ``KEY_PREFIX``, else
                                  "": none.
``fifo_lock_lease_ms``            Default ``lease_ms`` (int, ms). Default 60_000.
``fifo_lock_poll_ms``             Default ``poll_ms`` (int, ms). Default 30_000.
``fifo_lock_max_hold_ms``         Default ``max_hold_ms`` (int, ms). Default 1_800_000.
``fifo_lock_replicas``            Default ``replicas`` (int): replicas that must
                                  acknowledge each grant and renewal (Sentinel
                                  set-ups; not on Redis Cluster). Default 0.
``fifo_lock_replica_wait_ms``     Default ``replica_wait_ms`` (int, ms): how long
                                  each grant and renewal waits for them. Default
                                  None: a tenth of ``lease_ms``, at most 1000.
================================  ==================================================

``fifolock_celery.server`` shows the Sentinel and Redis Cluster forms. The
lock settings mean what they mean for ``redis_fifo_lock.FifoLock``; a
``@fifo_locked(...)`` option (or the ``fifo_lock_*`` attribute of the same name
on a ``FifoLockedTask``) overrides the app's value for that task.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery import Celery

from redis_fifo_lock import LockOptions, LockServer, LockSettings, LockUsageError, SyncFifoLock
from redis_fifo_lock.connection import masked_url
from redis_fifo_lock.settings import LOCK_OPTIONS, Spelling, check_namespace

if TYPE_CHECKING:
    from typing_extensions import Unpack

from .server import ServerError, lock_server
from .under_django import DjangoLocks, django_locks, mismatch

REDIS_URL_SETTING = "fifo_lock_redis_url"
"""App setting (str): Redis URL of the locks; default: under Django the server of the
cache ``FIFOLOCK`` names (see ``fifolock_celery.under_django``), else a Redis
``broker_url``."""
TRANSPORT_OPTIONS_SETTING = "fifo_lock_transport_options"
"""App setting (dict): ``master_name``, ``sentinel_kwargs``, ``cluster`` and ``ssl_*``
options of the lock server; default: ``broker_transport_options`` when the locks use
the broker's URL."""
NAMESPACE_SETTING = "fifo_lock_namespace"
"""App setting (str): namespace in front of every lock key (see
``redis_fifo_lock.FifoLock``); default: under Django the ``KEY_PREFIX`` of the cache
``FIFOLOCK`` names, else "": none."""
LEASE_MS_SETTING = "fifo_lock_lease_ms"
"""App setting (int, ms): default ``lease_ms`` of every task lock; default 60_000."""
POLL_MS_SETTING = "fifo_lock_poll_ms"
"""App setting (int, ms): default ``poll_ms`` of every task lock; default 30_000."""
MAX_HOLD_MS_SETTING = "fifo_lock_max_hold_ms"
"""App setting (int, ms): default ``max_hold_ms`` of every task lock; default 1_800_000."""
REPLICAS_SETTING = "fifo_lock_replicas"
"""App setting (int): default ``replicas`` of every task lock; default 0."""
REPLICA_WAIT_MS_SETTING = "fifo_lock_replica_wait_ms"
"""App setting (int, ms): default ``replica_wait_ms`` of every task lock; default None
(a tenth of ``lease_ms``, at most 1000)."""

REDIS_SCHEMES = ("redis://", "rediss://", "sentinel://")
"""URL schemes accepted from ``broker_url`` as the default lock server (several
``sentinel://`` URLs separated by ``;`` too)."""

SETTING_OF = {option: f"fifo_lock_{option}" for option in LOCK_OPTIONS}
"""The app setting of each lock option (``lease_ms`` -> ``fifo_lock_lease_ms``)."""


def _app_setting(option: str) -> str:
    return SETTING_OF[option]


@dataclass(frozen=True)
class LockConfig:
    """Where and how a Celery task locks: the app's settings plus overrides.

    Attributes:
        server: where the locks live (``redis_fifo_lock.LockServer``: one
            server, a Sentinel master or a Redis Cluster).
        settings: the lock settings (``redis_fifo_lock.LockSettings``: lease_ms,
            poll_ms, max_hold_ms, replica_wait_ms in int milliseconds, and
            replicas).
        namespace: the ``fifo_lock_namespace`` (str; "" for none), under
            Django by default the cache's ``KEY_PREFIX``.
        django: under Django, the cache whose locks the tasks share
            (``fifolock_celery.under_django.DjangoLocks``: lock names become its
            cache keys); None when Django is not used.

    Build it with ``LockConfig.from_app``.
    """

    server: LockServer
    settings: LockSettings
    namespace: str = ""
    django: DjangoLocks | None = None

    @classmethod
    def from_app(
        cls,
        app: Celery,
        lock_name: str,
        *,
        spell: Spelling = lambda option: f"@fifo_locked({option}=...)",
        **options: Unpack[LockOptions],
    ) -> LockConfig:
        """Read ``app.conf`` and apply a task's lock options.

        Args:
            app: the Celery app whose ``fifo_lock_*`` settings apply.
            lock_name: the lock about to be used (str), named in errors.
            spell: how the task spells an option, for messages (default
                ``@fifo_locked(lease_ms=...)``).
            **options: the task's lock options (``redis_fifo_lock.LockOptions``:
                ``lease_ms``, ``poll_ms``...), overriding the app's settings;
                None or absent: the app's value.

        Under Django (see ``fifolock_celery.under_django``) the server and the
        namespace are by default the cache's that ``FIFOLOCK`` names.

        Raises:
            LockUsageError: no Redis URL (``fifo_lock_redis_url`` is unset and
                the broker is not Redis), the URL and transport options do
                not make a lock server (see ``server_of``), or under Django the
                cache cannot make locks. The message names the setting.
            ValueError: naming the lock and each setting or option as the user
                spelled it, for a value or a combination ``LockSettings``
                refuses, ``replicas`` above 0 on a Redis Cluster lock server,
                or a ``fifo_lock_namespace`` the lock refuses.
            TypeError: an option that is not a lock option.
        """
        django = django_locks(app, lock_name)
        explicit_url = app.conf.get(REDIS_URL_SETTING) is not None
        server = server_of(app, lock_name) if django is None or explicit_url else django.server
        configured = {option: app.conf.get(setting) for option, setting in SETTING_OF.items()}
        cluster = server.describe() if server.topology == "cluster" else None
        try:
            settings = LockSettings().merged(
                (configured, _app_setting),
                (options, spell),
                base_spell=_app_setting,
                cluster=cluster,
            )
        except ValueError as exc:
            raise ValueError(f"FIFO lock {lock_name!r}: {exc}") from None
        given_namespace = app.conf.get(NAMESPACE_SETTING)
        if django is not None and given_namespace is None:
            namespace = django.namespace
        else:
            try:
                namespace = check_namespace(given_namespace or "")
            except ValueError as exc:
                raise ValueError(f"FIFO lock {lock_name!r}: {NAMESPACE_SETTING}: {exc}") from None
        return cls(server=server, settings=settings, namespace=namespace, django=django)

    def lock(self, name: str, name_template: str | None = None) -> SyncFifoLock:
        """The ``SyncFifoLock`` named ``name`` with these settings, on this
        process's clients of ``server``; under Django its Redis name is the
        cache key of ``name``, as for ``cache.fifo_lock(name)``.
        ``name_template`` (str, default None: ``"(untemplated)"``) is the
        template ``name`` was filled in from, recorded in place of the name with
        the lock's OpenTelemetry metrics and spans (integration ``celery``).

        Raises:
            ValueError: a bad lock name.
            django.core.exceptions.ImproperlyConfigured: under Django, the
                cache's key function makes an invalid lock name of ``name``.
        """
        redis_name = name if self.django is None else self.django.name(name)
        return SyncFifoLock(
            self.server.clients(),
            redis_name,
            settings=self.settings,
            namespace=self.namespace,
            name_template=name_template,
            integration="celery",
        )

    def django_mismatch(self) -> str | None:
        """Under Django, why these locks are not the cache's locks of the same
        names (naming the settings); None when they are, or without Django."""
        if self.django is None:
            return None
        return mismatch(self.server, self.namespace, self.django)


def lock_for(
    app: Celery, name: str, name_template: str | None = None, **options: Unpack[LockOptions]
) -> SyncFifoLock:
    """A ``SyncFifoLock`` named ``name`` configured by ``app``'s ``fifo_lock_*`` settings.

    For locking by hand inside a task; ``@fifo_locked`` builds its locks the
    same way (``LockConfig.from_app(...).lock(name)``).

    Args:
        app: the Celery app whose settings apply.
        name: the lock name (str), see ``redis_fifo_lock.FifoLock``.
        **options: overrides of the app's ``fifo_lock_*`` settings:
            ``lease_ms``, ``poll_ms``, ``max_hold_ms``, ``replica_wait_ms``
            (int milliseconds) and ``replicas`` (int); None (default) keeps the
            app's value.
        name_template: the template ``name`` was filled in from (str), recorded
            with the lock's OpenTelemetry metrics and spans
            (``redis_fifo_lock.metrics``, integration ``celery``) in place of
            the name; default None: ``"(untemplated)"``. ``@fifo_locked``
            passes its name template.

    Raises:
        LockUsageError: no Redis URL configured (see ``LockConfig.from_app``).
        ValueError: a bad lock name, setting or ``name_template``, naming it,
            or ``replicas`` above 0 on a Redis Cluster.
        TypeError: an option that is not a lock option.
    """
    config = LockConfig.from_app(app, name, spell=lambda option: f"{option}=...", **options)
    return config.lock(name, name_template)


def _redis_broker(broker: object) -> bool:
    """Whether ``broker`` is one ``redis://``/``rediss://`` URL or a list of
    ``sentinel://`` URLs: a broker the locks can share."""
    if not isinstance(broker, str) or not broker.startswith(REDIS_SCHEMES):
        return False
    chunks = broker.split(";")
    return len(chunks) == 1 or all(chunk.strip().startswith("sentinel://") for chunk in chunks)


def _shown_broker(broker: object) -> str:
    """``broker_url`` for a message, passwords masked: one URL, a failover list of
    URLs, or the type of anything else."""
    if isinstance(broker, str):
        return repr(masked_url(broker))
    if isinstance(broker, (list, tuple)):
        return repr([masked_url(url) if isinstance(url, str) else "?" for url in broker])
    return type(broker).__name__


def server_of(app: Celery, lock_name: str) -> LockServer:
    """The lock server: ``fifo_lock_redis_url`` with ``fifo_lock_transport_options``,
    else a Redis broker's URL with (by default) ``broker_transport_options``;
    ``fifo_lock_redis_url`` equal to ``broker_url`` also takes those by default.

    Raises:
        LockUsageError: when ``fifo_lock_redis_url`` is unset and ``broker_url``
            is not a Redis URL (AMQP, SQS, a failover list, ...), or when the
            URL and transport options do not make a lock server (a
            ``sentinel://`` URL without ``master_name``, ...). The message names
            the settings to change.
    """
    url: Any = app.conf.get(REDIS_URL_SETTING)
    options: Any = app.conf.get(TRANSPORT_OPTIONS_SETTING)
    source = f"{REDIS_URL_SETTING}, {TRANSPORT_OPTIONS_SETTING}"
    use_ssl: object = None
    if url is not None:
        if not isinstance(url, str) or not url:
            raise LockUsageError(
                lock_name,
                f"{REDIS_URL_SETTING} must be a Redis URL (str), got {type(url).__name__}",
            )
        if url == app.conf.broker_url:
            # The broker's server named again: its TLS (and by default its
            # transport options) go with it.
            use_ssl = app.conf.broker_use_ssl
            transport = TRANSPORT_OPTIONS_SETTING
            if options is None:
                options, transport = app.conf.broker_transport_options, "broker_transport_options"
            source = f"{REDIS_URL_SETTING} (the broker_url), broker_use_ssl, {transport}"
    else:
        url = app.conf.broker_url
        if not _redis_broker(url):
            shown = _shown_broker(url)
            raise LockUsageError(
                lock_name,
                f"no Redis server for FIFO locks: set {REDIS_URL_SETTING} in the Celery app's "
                f"configuration (CELERY_{REDIS_URL_SETTING.upper()} under Django's CELERY "
                f"namespace); broker_url {shown} is not a single redis:// or rediss:// URL "
                "nor a list of sentinel:// URLs, so it cannot be the default",
            )
        use_ssl = app.conf.broker_use_ssl
        source = f"broker_url, broker_use_ssl, {TRANSPORT_OPTIONS_SETTING}"
        if options is None:
            options = app.conf.broker_transport_options
            source = (
                f"broker_url, broker_use_ssl, broker_transport_options "
                f"(or {TRANSPORT_OPTIONS_SETTING})"
            )
    try:
        return lock_server(url, options, use_ssl)
    except ServerError as exc:
        raise LockUsageError(
            lock_name,
            f"the FIFO lock server settings ({source}; CELERY_... under Django's CELERY "
            f"namespace) are invalid: {exc}",
        ) from exc
