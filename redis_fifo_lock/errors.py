"""The exception family of redis-fifo-lock.

Every error carries the lock name, says what happened with the numbers in it, and
survives ``pickle`` with its attributes (Celery's prefork pool ships exceptions
between processes).
"""

from __future__ import annotations

from typing import Any


class LockError(Exception):
    """Base class of every error raised by redis-fifo-lock.

    Attributes:
        name: the lock name (str) the error is about.
    """

    def __init__(self, name: str, message: str) -> None:
        # args stay (name, message) so that ``cls(*args)`` rebuilds the error, as
        # pickle and Celery's result backends do; extra attributes are keyword
        # arguments with defaults and travel in __dict__ under pickle.
        super().__init__(name, message)
        self.name = name
        self.message = message

    def __str__(self) -> str:
        return f"FIFO lock {self.name!r}: {self.message}"


class LeaseLost(LockError):
    """The lease was held and is no longer held by this holder.

    Raised by ``release()`` when the lock had expired or been handed to someone
    else: the critical section may have overlapped with the next holder's. Pass
    ``lease.fence`` to the resource you protect so it can reject stale writers.

    Attributes:
        fence: the fencing token (int) of the lost lease.
        token: the request token (str) of the lost lease.
    """

    def __init__(self, name: str, message: str, *, fence: int = 0, token: str = "") -> None:
        super().__init__(name, message)
        self.fence = fence
        self.token = token


class LockTimeout(LockError, TimeoutError):
    """``acquire(timeout=...)`` ran out before the lock was granted.

    A subclass of the builtin ``TimeoutError``. The request has been withdrawn
    from the queue; nothing is left behind.

    Attributes:
        waited: seconds (float) spent waiting.
        holder_fence: fence (int) of the holder when the wait ended, or None if
            nobody held the lock at that moment.
    """

    def __init__(
        self, name: str, message: str, *, waited: float = 0.0, holder_fence: int | None = None
    ) -> None:
        super().__init__(name, message)
        self.waited = waited
        self.holder_fence = holder_fence


class RedisUnavailable(LockError):
    """Redis could not be reached or refused the command.

    The redis-py exception is kept as ``cause`` and as ``__cause__``. The lock
    never fails open: whatever was being done did not happen, or may have
    happened and can be retried with the same token.

    Attributes:
        cause: the redis-py exception (``redis.exceptions.RedisError``), or None
            once unpickled in another process.
    """

    def __init__(self, name: str, message: str, *, cause: BaseException | None = None) -> None:
        super().__init__(name, message)
        self.cause = cause

    @property
    def reason(self) -> str:
        """Why, in a few words (str): the redis-py error's text, or this error's
        message when it has no redis-py cause (a call the lock's own bound cut
        off). Text, not the error: a log record that keeps it (a handler that
        stores records) must not keep the connection its traceback reaches."""
        return str(self.cause or self.message)

    def __reduce__(self) -> tuple[Any, ...]:
        # The redis-py cause may hold a connection; it does not cross processes.
        return (type(self), self.args, dict(self.__dict__, cause=None))


class NotReplicated(RedisUnavailable):
    """Redis made a grant, but not enough replicas confirmed having it in time.

    Raised by ``acquire()`` on a lock set up with ``replicas=N`` when fewer than
    N replicas acknowledged the grant within ``replica_wait_ms`` (Redis
    ``WAIT``): a failover could lose it, and with it the fence. The grant has
    been given back (or, if that failed too, expires within ``lease_ms``);
    retry once the replicas are back. A renewal that is not acknowledged is
    retried instead, and the lease is lost (``lease.lost``) if none is
    acknowledged before it expires.

    Attributes:
        replicas: acknowledgements required (int, the lock's ``replicas``).
        acknowledged: acknowledgements received (int).
    """

    def __init__(
        self,
        name: str,
        message: str,
        *,
        replicas: int = 0,
        acknowledged: int = 0,
        cause: BaseException | None = None,
    ) -> None:
        super().__init__(name, message, cause=cause)
        self.replicas = replicas
        self.acknowledged = acknowledged


class LockUsageError(LockError, RuntimeError):
    """The lock was used in a way that cannot work (a programming error).

    For example releasing a lease that belongs to another lock, or calling the
    sync facade from its own event-loop thread. The message says what to do.
    """


class ClientDropped(RuntimeError):
    """Internal: the Redis client behind a hub or its doorbell was
    garbage-collected, so nothing can be sent through it any more (every lock
    and lease using it was dropped with it). The background work that meets it
    (withdrawals, polls) ends quietly; it never reaches a caller."""
