"""One name, one lock: Celery tasks and Django views of one project share ``"invoices"``.

The tasks run in a real prefork worker of ``django_app.tasks`` (configured from
the Django settings, as Celery's Django recipe does); the views run through
Django's test client in this process. Both take the plain name ``"invoices"``
with no Celery lock setting at all, and report to a shared record of who is
inside (``django_app.record``). With the tasks' locks deliberately put on
another database, ``manage.py check`` and the worker's start checks say so.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("celery")

from celery import Celery, _state, current_app
from celery.app import app_or_default, default_app
from django.core.cache import caches
from django.core.checks import CheckMessage, run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import Client, override_settings
from django_app import record, tasks
from django_app.testing import TESTS_DIR, get_json, url_with_db
from django_app.views import INVOICES, ISSUED
from redis import Redis

from fifolock_celery import LockConfig, start_warnings
from fifolock_django import checks
from redis_fifo_lock import LockServer
from tests.support.celery_worker import running_worker

BROKER_DB = 5
"""Database of the broker and result backend: not the cache's (database 0)."""

ROUNDS = 6
"""Invoices issued by views, and as many by tasks."""


@pytest.fixture
def app(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Celery]:
    """``django_app.tasks.app`` on this session's server, in a process that runs the
    Django project as ``manage.py`` and the worker do (``DJANGO_SETTINGS_MODULE``)."""
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "django_app.settings")
    broker = url_with_db(redis_url, BROKER_DB)
    tasks.app.conf.update(broker_url=broker, result_backend=broker)
    previous = tasks.app.conf.get("fifo_lock_redis_url")
    yield tasks.app
    tasks.app.conf.fifo_lock_redis_url = previous


def worker_env(redis_url: str) -> dict[str, str]:
    """What the worker needs to load the Django project on this session's server."""
    return {
        "DJANGO_SETTINGS_MODULE": "django_app.settings",
        "FIFOLOCK_TEST_REDIS_URL": redis_url,
        "FIFOLOCK_TEST_BROKER_URL": url_with_db(redis_url, BROKER_DB),
        "PYTHONPATH": os.pathsep.join(
            [str(TESTS_DIR), str(TESTS_DIR.parent), os.environ.get("PYTHONPATH", "")]
        ),
    }


def test_views_and_prefork_tasks_on_the_plain_name_invoices_never_overlap(
    app: Celery, redis: Redis, redis_url: str, tmp_path: Path
) -> None:
    env = worker_env(redis_url)
    with running_worker(
        redis_url, "prefork", tmp_path, app="django_app.tasks", ping=tasks.ping, env=env
    ):
        sent = [tasks.issue_invoice.delay(0.2) for _ in range(ROUNDS)]
        with ThreadPoolExecutor(max_workers=3) as pool:
            views = list(
                pool.map(lambda _: get_json(Client(), "/invoice/?hold=0.2"), range(ROUNDS))
            )
        task_fences = [result.get(timeout=60) for result in sent]

    holds = record.holds(redis)  # raises if two holders were ever inside together
    assert sorted(hold["who"] for hold in holds) == ["task"] * ROUNDS + ["view"] * ROUNDS
    fences = [hold["fence"] for hold in holds]
    assert fences == sorted(set(fences))
    assert sorted(task_fences + [view["fence"] for view in views]) == fences
    assert caches["default"].get(ISSUED) == 2 * ROUNDS
    assert LockConfig.from_app(app, INVOICES).django_mismatch() is None


def test_locks_split_onto_another_database_fail_the_check_and_the_worker_start_checks(
    app: Celery, redis_url: str
) -> None:
    assert [m for m in run_checks(tags=["caches"]) if m.id == "fifolock.E008"] == []
    app.conf.fifo_lock_redis_url = url_with_db(redis_url, 7)
    previous = current_app._get_current_object()
    app.set_current()
    try:
        [error] = [m for m in run_checks(tags=["caches"]) if m.id == "fifolock.E008"]
        with pytest.raises(SystemCheckError, match=r"fifolock\.E008"):
            call_command("check")
    finally:
        previous.set_current()
    warnings = start_warnings(app)

    expected = (
        f"fifo_lock_redis_url ({url_with_db(redis_url, 7)}) is not where cache 'default' keeps "
        f"its locks ({redis_url}): @fifo_locked(NAME) and caches['default'].fifo_lock(NAME) "
        "are two different locks"
    )
    assert expected in error.msg
    assert error.msg.startswith("The Celery app 'django_app' does not share the FIFO locks")
    assert any(expected in message for message in warnings), warnings


def fifolock_messages() -> list[CheckMessage]:
    """The ``fifolock.*`` messages of the ``caches`` checks."""
    return [m for m in run_checks(tags=["caches"]) if m.id and m.id.startswith("fifolock.")]


def _without_a_project_app(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make this thread's Celery state what a process that never imported the
    project's Celery app has: no current app, no default app, so that
    ``current_app`` is the fallback Celery makes up."""
    monkeypatch.setattr(_state, "default_app", None)
    monkeypatch.setattr(_state._tls, "current_app", None)


def test_without_a_celery_app_the_check_reads_the_celery_settings_as_the_recipe_does(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the recipe's import in the project package, ``current_app`` was
    Celery's fallback app, which takes the cache's locks: ``manage.py check``
    passed though CELERY_FIFO_LOCK_NAMESPACE split the tasks' locks off."""
    _without_a_project_app(monkeypatch)
    assert fifolock_messages() == []

    with override_settings(CELERY_FIFO_LOCK_NAMESPACE="other"):
        [error] = fifolock_messages()

    assert error.id == "fifolock.E008"
    assert error.msg.startswith(
        "The Celery app that Celery's Django recipe makes from the CELERY_* settings"
    )
    assert "fifo_lock_namespace ('other') is not the KEY_PREFIX of cache 'default'" in error.msg
    assert app_or_default() is default_app._get_current_object()  # nothing made current


def _never_the_fallback(app: Any) -> bool:
    """MUTANT fallback-checked: the check takes Celery's fallback app for the
    project's and finds nothing wrong with it (the bug before
    test_without_a_celery_app_the_check_reads_the_celery_settings_as_the_recipe_does)."""
    return False


def test_the_celery_settings_without_a_celery_app_kill_fallback_checked(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checks, "_celerys_fallback", _never_the_fallback)
    _without_a_project_app(monkeypatch)

    with override_settings(CELERY_FIFO_LOCK_NAMESPACE="other"):
        messages = fifolock_messages()

    assert messages == [], "fallback-checked passed"


def test_celery_says_otherwise_explicitly_with_fifo_lock_django_cache_false(
    app: Celery, redis_url: str
) -> None:
    assert LockConfig.from_app(app, INVOICES).django is not None
    app.conf.fifo_lock_django_cache = False
    try:
        config = LockConfig.from_app(app, INVOICES)
    finally:
        app.conf.fifo_lock_django_cache = None
    assert config.django is None
    assert config.server.place() == LockServer.server(url_with_db(redis_url, BROKER_DB)).place()
    assert config.lock(INVOICES).name == INVOICES
