"""redis-fifo-lock: a distributed FIFO mutex on Redis.

``FifoLock`` is the asyncio lock; ``SyncFifoLock`` runs it for threads and sync
code; ``LoopClients`` gives each event loop its own client, ``LockServer`` says where
the locks live (one server, a Sentinel master, a Redis Cluster) and shares
those clients; ``acl_rules`` lists
the Redis ACL rules a user of the lock needs.
"""

from .acl import acl_rules
from .clients import LoopClients
from .errors import (
    LeaseLost,
    LockError,
    LockTimeout,
    LockUsageError,
    NotReplicated,
    RedisUnavailable,
)
from .holder import describing
from .lease import Lease, LockStatus
from .lock import FifoLock
from .server import LockServer
from .settings import LockOptions, LockSettings
from .sync import SyncFifoLock

__all__ = [
    "FifoLock",
    "Lease",
    "LeaseLost",
    "LockError",
    "LockOptions",
    "LockServer",
    "LockSettings",
    "LockStatus",
    "LockTimeout",
    "LockUsageError",
    "LoopClients",
    "NotReplicated",
    "RedisUnavailable",
    "SyncFifoLock",
    "acl_rules",
    "describing",
]
