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
        super().__init__(f"FIFO lock {name!r}: {message}")
        self.name = name
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.__dict__))


def _rebuild(cls: type[LockError], state: dict[str, Any]) -> LockError:
    error = cls.__new__(cls)
    error.__dict__.update(state)
    Exception.__init__(error, f"FIFO lock {state['name']!r}: {state['message']}")
    return error


class LeaseLost(LockError):
    """The lease was held and is no longer held by this holder.

    Raised by ``release()`` when the lock had expired or been handed to someone
    else: the critical section may have overlapped with the next holder's. Pass
    ``lease.fence`` to the resource you protect so it can reject stale writers.

    Attributes:
        fence: the fencing token (int) of the lost lease.
        token: the request token (str) of the lost lease.
    """

    def __init__(self, name: str, message: str, *, fence: int, token: str) -> None:
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

    def __init__(self, name: str, message: str, *, waited: float, holder_fence: int | None) -> None:
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

    def __init__(self, name: str, message: str, *, cause: BaseException | None) -> None:
        super().__init__(name, message)
        self.cause = cause

    def __reduce__(self) -> tuple[Any, ...]:
        state = dict(self.__dict__, cause=None)
        return (_rebuild, (type(self), state))


class LockUsageError(LockError, RuntimeError):
    """The lock was used in a way that cannot work (a programming error).

    For example releasing a lease that belongs to another lock, or calling the
    sync facade from its own event-loop thread. The message says what to do.
    """
