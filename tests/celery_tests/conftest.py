"""Fixtures of the Celery tests: the test app on the session's Redis, and a record.

Workers are real ``celery worker`` subprocesses (``tests.support.celery_worker``);
each test module starts the ones it needs with a module-scoped fixture, so a
worker serves all the tests of its module. Nothing is flushed between tests:
the broker shares the server, so each test uses lock names and record keys of
its own (``unique``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("celery")

from celery import Celery
from redis import Redis

from tests.celery_tests import celery_app as tasks
from tests.support.celery_worker import Log, unique


@pytest.fixture(scope="module")
def celery_redis_url(redis_url: str) -> str:
    """Base URL of the server the Celery tests use (databases 1-3, never flushed).

    Redefine this fixture to run them against another server.
    """
    return redis_url


@pytest.fixture(scope="module")
def app(celery_redis_url: str) -> Celery:
    """``tests.celery_tests.celery_app.app``, configured for ``celery_redis_url``,
    in this process."""
    tasks.configure(celery_redis_url)
    return tasks.app


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory for the module's worker logs (kept by pytest for a few runs)."""
    return tmp_path_factory.mktemp("celery-workers")


@pytest.fixture
def key() -> str:
    """A fresh lock key for this test (lock names embed it)."""
    return unique("k")


@pytest.fixture
def log(app: Celery, key: str) -> Iterator[Log]:
    """A fresh record key for this test; its keys and the log records about the
    test's ``gate-<key>`` lock are deleted afterwards."""
    client = Redis.from_url(app.conf.record_url)
    record = Log(client, unique("log"))
    try:
        yield record
    finally:
        record.cleanup(f"gate-{key}")
        client.close()
