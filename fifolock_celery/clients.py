"""The locks of a worker process: one ``LoopClients`` per (app, lock server).

A task's lock runs on the process's ``SyncFifoLock`` portal loop, which builds
its async client from the ``LoopClients`` kept here; no client is ever used on
a loop other than the one it was built on. Prefork children start empty: the
registry is dropped in the child after ``fork()`` and on Celery's
``worker_process_init`` (and ``LoopClients`` and the portal would rebuild
themselves anyway, as they key by process id), so a child never shares its
parent's sockets.
"""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import asdict

from celery import Celery

from redis_fifo_lock import LoopClients, SyncFifoLock

from .server import LockServer
from .settings import LockConfig

_registry: weakref.WeakKeyDictionary[Celery, dict[str, LoopClients]] = weakref.WeakKeyDictionary()
_guard = threading.Lock()


def forget_all() -> None:
    """Drop every ``LoopClients`` of this process without closing them.

    Runs in a child process right after ``fork()`` (and again on Celery's
    ``worker_process_init``, see ``fifolock_celery.worker``): the parent's
    clients and sockets belong to the parent, and the child builds its own
    on first use. Not for use in a process whose clients are in use.
    """
    # The parent's guard may have been held by another thread at fork time;
    # a fresh one cannot be.
    global _registry, _guard
    _registry = weakref.WeakKeyDictionary()
    _guard = threading.Lock()


os.register_at_fork(after_in_child=forget_all)


def _real_app(app: Celery) -> Celery:
    # ``current_app`` and ``task.app`` can be ``celery.local.Proxy`` objects;
    # key the registry by the app itself, not by whichever proxy reached us.
    get = getattr(app, "_get_current_object", None)
    real: Celery = app if get is None else get()
    return real


def clients_for(app: Celery, server: LockServer) -> LoopClients:
    """This process's ``LoopClients`` for ``app``'s locks on ``server``.

    Args:
        app: the Celery app (a proxy to it is fine).
        server: the lock server (``LockServer``: one server, a Sentinel master
            or a Redis Cluster), e.g. ``LockConfig.from_app(app, name).server``.

    Returns:
        The same ``LoopClients`` for every call with that app and an equal
        server in this process; a forked child gets new ones. Thread-safe.
    """
    app = _real_app(app)
    key = server.key()
    with _guard:
        per_server = _registry.setdefault(app, {})
        clients = per_server.get(key)
        if clients is None:
            clients = per_server[key] = server.loop_clients()
        return clients


def lock_for(
    app: Celery,
    name: str,
    *,
    lease_ms: int | None = None,
    poll_ms: int | None = None,
    max_hold_ms: int | None = None,
    replicas: int | None = None,
    replica_wait_ms: int | None = None,
    name_template: str | None = None,
) -> SyncFifoLock:
    """A ``SyncFifoLock`` named ``name`` configured by ``app``'s ``fifo_lock_*`` settings.

    For locking by hand inside a task; ``@fifo_locked`` uses the same function.

    Args:
        app: the Celery app whose settings apply.
        name: the lock name (str), see ``redis_fifo_lock.FifoLock``.
        lease_ms, poll_ms, max_hold_ms, replica_wait_ms: overrides (int
            milliseconds) of the app's ``fifo_lock_lease_ms`` /
            ``fifo_lock_poll_ms`` / ``fifo_lock_max_hold_ms`` /
            ``fifo_lock_replica_wait_ms``; None (default) keeps the app's value.
        replicas: override (int) of the app's ``fifo_lock_replicas``; None
            (default) keeps the app's value.
        name_template: the template ``name`` was filled in from (str), recorded
            with the lock's OpenTelemetry metrics and spans
            (``redis_fifo_lock.metrics``, integration ``celery``) in place of
            the name; default None: ``"(untemplated)"``. ``@fifo_locked``
            passes its name template.

    Raises:
        LockUsageError: no Redis URL configured (see ``LockConfig.from_app``).
        ValueError: a bad lock name, setting or ``name_template``, naming it,
            or ``replicas`` above 0 on a Redis Cluster.
    """
    config = LockConfig.from_app(
        app,
        name,
        lease_ms=lease_ms,
        poll_ms=poll_ms,
        max_hold_ms=max_hold_ms,
        replicas=replicas,
        replica_wait_ms=replica_wait_ms,
    )
    # Every field of the settings, so that none can be dropped on the way.
    return SyncFifoLock(
        clients_for(app, config.server),
        name,
        namespace=config.namespace,
        name_template=name_template,
        integration="celery",
        **asdict(config.settings),
    )
