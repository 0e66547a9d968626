"""Errors carry the lock name and survive pickle and ``cls(*args)`` rebuilding."""

from __future__ import annotations

import pickle

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from redis_fifo_lock import (
    LeaseLost,
    LockError,
    LockTimeout,
    LockUsageError,
    NotReplicated,
    RedisUnavailable,
)

ERRORS = [
    LockError("jobs", "something"),
    LeaseLost("jobs", "lost it", fence=7, token="t"),
    LockTimeout("jobs", "too slow", waited=1.5, holder_fence=3),
    RedisUnavailable("jobs", "down", cause=RedisConnectionError("refused")),
    NotReplicated("jobs", "not on the replicas", replicas=2, acknowledged=1),
    LockUsageError("jobs", "misuse"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda error: type(error).__name__)
def test_errors_survive_pickle_with_their_attributes(error: LockError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error)
    expected = {key: value for key, value in vars(error).items() if key != "cause"}
    assert {key: value for key, value in vars(copy).items() if key != "cause"} == expected


@pytest.mark.parametrize("error", ERRORS, ids=lambda error: type(error).__name__)
def test_errors_rebuild_from_their_args_as_result_backends_do(error: LockError) -> None:
    copy = type(error)(*error.args)
    assert str(copy) == str(error) == f"FIFO lock 'jobs': {error.message}"


def test_a_timeout_is_also_the_builtin_timeout_error() -> None:
    assert isinstance(LockTimeout("jobs", "x"), TimeoutError)
    assert isinstance(LockUsageError("jobs", "x"), RuntimeError)
