"""Celery integration of redis-fifo-lock.

``@fifo_locked(name)`` (under ``@app.task``) or ``base=FifoLockedTask`` runs a
task body holding a FIFO lock; ``policy=`` chooses what a task does when the
lock is busy (``wait``, ``retry``, ``skip``: see ``fifolock_celery.policies``);
``current_lease()`` gives the body its lease and fence; ``lock_for(app, name)``
builds a ``SyncFifoLock`` from the app's ``fifo_lock_*`` settings (see
``fifolock_celery.settings``; Sentinel and Redis Cluster servers in
``fifolock_celery.server``) for locking by hand.

Importing this package also connects a worker signal receiver (start-up
warnings): see ``fifolock_celery.worker``.
"""

from redis_fifo_lock import LockServer

from . import worker as _worker  # noqa: F401  (connects the signal receiver)
from .decorator import UNSET, LockSpec, fifo_locked
from .lease import current_lease
from .policies import CONTENTION_HEADER, SKIPPED, Policy
from .settings import (
    LEASE_MS_SETTING,
    MAX_HOLD_MS_SETTING,
    POLL_MS_SETTING,
    REDIS_URL_SETTING,
    REPLICA_WAIT_MS_SETTING,
    REPLICAS_SETTING,
    TRANSPORT_OPTIONS_SETTING,
    LockConfig,
    lock_for,
)
from .task import FifoLockedTask
from .worker import start_warnings

__all__ = [
    "CONTENTION_HEADER",
    "LEASE_MS_SETTING",
    "MAX_HOLD_MS_SETTING",
    "POLL_MS_SETTING",
    "REDIS_URL_SETTING",
    "REPLICAS_SETTING",
    "REPLICA_WAIT_MS_SETTING",
    "SKIPPED",
    "TRANSPORT_OPTIONS_SETTING",
    "UNSET",
    "FifoLockedTask",
    "LockConfig",
    "LockServer",
    "LockSpec",
    "Policy",
    "current_lease",
    "fifo_locked",
    "lock_for",
    "start_warnings",
]
