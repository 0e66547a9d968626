"""Helpers shared by the Django test modules (``tests/django_tests``).

Fixtures live in ``tests/django_tests/conftest.py``; this module holds the
plain functions: the project's settings for a server, ``manage.py``
subprocesses, waiting for state in another process, and the record checks.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.core.cache import caches
from django.test import Client
from redis import Redis

from tests.support.polling import until_sync

from . import record
from . import settings as project
from .management.commands.locked_job import ENTERED

TESTS_DIR = Path(__file__).resolve().parent.parent
"""The ``tests`` directory, which holds ``django_app``."""

WAIT_S = 20.0
"""Upper bound on any wait for another process, in seconds."""


def project_settings(redis_url: str, backend: str = "django-redis") -> dict[str, Any]:
    """The test project's settings, with its caches on ``redis_url`` through
    ``backend`` (a key of ``django_app.settings.BACKENDS``)."""
    values = {name: getattr(project, name) for name in dir(project) if name.isupper()}
    values["CACHES"] = project.caches_for(redis_url, backend)
    return values


def url_with_db(url: str, db: int) -> str:
    """``url`` pointing at database ``db``."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{db}"))


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Poll ``condition`` (for states that announce themselves by no event).

    Raises:
        AssertionError: after ``timeout_s`` seconds (default 20), naming ``what``.
    """
    until_sync(condition, what, timeout_s, pause_s=0.02)


def assert_served_one_at_a_time(redis: Redis, requests: int) -> list[dict[str, Any]]:
    """No overlap, no lost update, grants in arrival (ticket) order."""
    holds = record.holds(redis)
    assert len(holds) == requests
    fences = [hold["fence"] for hold in holds]
    tickets = [hold["ticket"] for hold in holds]
    assert fences == sorted(set(fences))
    assert tickets == sorted(set(tickets))
    assert caches["default"].get("counter") == requests
    return holds


def get_json(client: Client, path: str) -> dict[str, Any]:
    """GET ``path`` with Django's test ``client``; the JSON body of a 200 answer."""
    response = client.get(path)
    assert response.status_code == 200, response.content
    data: dict[str, Any] = response.json()
    return data


def manage(redis_url: str, *args: str, backend: str = "django-redis") -> subprocess.Popen[str]:
    """Start ``python -m django ARGS`` on the test project (a real ``manage.py``
    process), its ``default`` cache on ``redis_url`` through ``backend``."""
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="django_app.settings",
        FIFOLOCK_TEST_REDIS_URL=redis_url,
        FIFOLOCK_TEST_BACKEND=backend,
        PYTHONPATH=os.pathsep.join(
            [str(TESTS_DIR), str(TESTS_DIR.parent), env.get("PYTHONPATH", "")]
        ),
    )
    return subprocess.Popen(
        [sys.executable, "-m", "django", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    """Wait for ``process``; its (exit status, stdout, stderr)."""
    out, err = process.communicate(timeout=WAIT_S)
    return process.returncode, out, err


def wait_entered(redis: Redis, who: str) -> None:
    """Block until run ``who`` announces that it is inside its critical section."""
    reply = redis.blpop([ENTERED], timeout=WAIT_S)
    assert reply == (ENTERED.encode(), who.encode()), reply
