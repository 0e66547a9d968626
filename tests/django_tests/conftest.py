"""Fixtures of the Django integration tests: a configured project on the session's Redis.

Django is configured by the session fixture ``django_project`` (with
``settings.configure`` if nobody did it before, else ``override_settings``), not
through ``DJANGO_SETTINGS_MODULE``, so collecting or running the other test
modules never involves Django. pytest-django's fixtures (``settings``...) work
on top of it. The project lives in ``tests/django_app``; plain helpers in
``django_app.testing``.

Redefine ``lock_backends`` in a test module to run its ``any_backend`` tests
on fewer backends.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("django_redis")

import django
from django.conf import settings
from django.core.cache import caches
from django.test import override_settings
from redis import Redis

TESTS_DIR = Path(__file__).resolve().parent.parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

from django_app import settings as project  # noqa: E402
from django_app.testing import project_settings  # noqa: E402

BOTH_BACKENDS = tuple(project.BACKENDS)
"""Short names of the two FIFO lock backends: django-redis's and Django's own."""


@pytest.fixture(scope="session", autouse=True)
def django_project(redis_url: str) -> Iterator[None]:
    """Django set up with ``tests/django_app``'s settings (django-redis backend),
    once for all the Django test modules."""
    values = project_settings(redis_url)
    if not settings.configured:
        settings.configure(**values)
        django.setup()
        yield
        return
    # Configured by someone else: override what the project needs. Not
    # DATABASES (the project has none), which Django warns about overriding.
    values.pop("DATABASES")
    django.setup()
    with override_settings(**values):
        yield


@pytest.fixture
def counter_cache(redis: Redis) -> Any:
    """The default cache (django-redis backend), on an empty Redis (``redis`` flushes it)."""
    return caches["default"]


@pytest.fixture(params=BOTH_BACKENDS)
def any_backend(request: pytest.FixtureRequest, redis_url: str, redis: Redis) -> Iterator[str]:
    """Each FIFO lock backend in turn as the ``default`` cache, on an empty Redis;
    the value is the backend's short name (a key of ``django_app.settings.BACKENDS``)."""
    backend: str = request.param
    with override_settings(CACHES=project.caches_for(redis_url, backend)):
        yield backend
