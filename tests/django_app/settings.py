"""Settings of the Django test project used by ``tests/test_django.py``.

In-process, the tests apply these through ``override_settings`` with
``CACHES`` pointed at the session's Redis. Subprocesses (``python -m django``)
import this module as ``DJANGO_SETTINGS_MODULE=django_app.settings`` and find
the server in ``$FIFOLOCK_TEST_REDIS_URL``.
"""

from __future__ import annotations

import os

SECRET_KEY = "fifolock-django-tests"
DEBUG = False
ALLOWED_HOSTS = ["testserver"]
USE_TZ = True
INSTALLED_APPS = ["fifolock_django", "django_app"]
MIDDLEWARE = ["fifolock_django.middleware.LockHolderMiddleware"]
ROOT_URLCONF = "django_app.urls"
DATABASES: dict[str, dict[str, str]] = {}

REDIS_URL = os.environ.get("FIFOLOCK_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

BACKENDS = {
    "django-redis": "fifolock_django.cache.RedisCache",
    "builtin": "fifolock_django.builtin.RedisCache",
}
"""The two FIFO lock backends, by the short name the tests use."""

BACKEND = os.environ.get("FIFOLOCK_TEST_BACKEND", "django-redis")
"""Which of ``BACKENDS`` the ``default`` cache of a subprocess uses."""


def caches_for(url: str, backend: str = "django-redis") -> dict[str, dict[str, object]]:
    """The ``CACHES`` setting of the test project for the Redis server at ``url``.

    Args:
        url: the server (``redis://host:port/db``).
        backend: a key of ``BACKENDS``.
    """
    return {
        "default": {
            "BACKEND": BACKENDS[backend],
            "LOCATION": url,
            "KEY_PREFIX": "tests",
            "VERSION": 3,
        }
    }


CACHES = caches_for(REDIS_URL, BACKEND)

# Small timings so that a hold of a few tenths of a second spans several polls
# and renewals (renewal every lease_ms / 3 = 200 ms).
FIFOLOCK = {"LEASE_MS": 600, "POLL_MS": 100}

# The project's Celery app (``django_app.tasks``) reads the CELERY_* settings.
# No CELERY_FIFO_LOCK_REDIS_URL: the tasks lock where the default cache does.
CELERY_BROKER_URL = os.environ.get("FIFOLOCK_TEST_BROKER_URL", "memory://")
CELERY_RESULT_BACKEND = os.environ.get("FIFOLOCK_TEST_BROKER_URL", "cache+memory://")
CELERY_FIFO_LOCK_LEASE_MS = 3000
CELERY_FIFO_LOCK_POLL_MS = 500
