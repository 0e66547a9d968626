"""Celery integration of redis-fifo-lock.

``@fifo_locked(name)`` (under ``@app.task``) runs a task body holding a FIFO
lock; ``current_lease()`` gives the body its lease and fence; ``lock_for(app,
name)`` builds a ``SyncFifoLock`` from the app's ``fifo_lock_*`` settings (see
``fifolock_celery.settings``) for locking by hand.
"""

from .clients import clients_for, lock_for
from .decorator import LockSpec, fifo_locked
from .lease import current_lease
from .settings import (
    LEASE_MS_SETTING,
    MAX_HOLD_MS_SETTING,
    POLL_MS_SETTING,
    REDIS_URL_SETTING,
    LockConfig,
)

__all__ = [
    "LEASE_MS_SETTING",
    "MAX_HOLD_MS_SETTING",
    "POLL_MS_SETTING",
    "REDIS_URL_SETTING",
    "LockConfig",
    "LockSpec",
    "clients_for",
    "current_lease",
    "fifo_locked",
    "lock_for",
]
