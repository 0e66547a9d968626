"""Django settings of the example project.

Everything that differs between runs comes from the environment:

- ``REDIS_URL``: the Redis server for the lock, the Celery broker and the
  Celery results (default ``redis://127.0.0.1:6379/0``).
- ``EXAMPLE_DB_PATH``: the SQLite file (default ``example.sqlite3`` in the
  current directory).
- ``EXAMPLE_CELERY_QUEUE``: the Celery queue the invoice tasks go to (default
  ``invoices``), so runs sharing one Redis server don't pick up each other's
  tasks.
- ``EXAMPLE_LEASE_MS`` / ``EXAMPLE_POLL_MS``: the lock's timing.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit


def celery_redis_url(url: str) -> str:
    """``url`` as Celery's broker and result backend want it.

    They take ``redis://`` and ``rediss://`` URLs as they are, but spell a unix
    socket ``redis+socket:///path?virtual_host=<db>`` where redis-py (and so the
    lock) says ``unix:///path?db=<db>``.
    """
    parts = urlsplit(url)
    if parts.scheme != "unix":
        return url
    query = urlencode(
        [("virtual_host", v) if k == "db" else (k, v) for k, v in parse_qsl(parts.query)]
    )
    return f"redis+socket://{parts.netloc}{parts.path}" + (f"?{query}" if query else "")


REDIS_URL = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
DB_PATH = Path(os.environ.get("EXAMPLE_DB_PATH") or "example.sqlite3").resolve()
CELERY_QUEUE = os.environ.get("EXAMPLE_CELERY_QUEUE") or "invoices"

SECRET_KEY = "example-project-not-secret"  # a local demo only; never deploy this
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "fifolock_django",  # system checks of the FIFOLOCK setting and the lock cache
    "example_project.invoices",
]
MIDDLEWARE: list[str] = []

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(DB_PATH),
        # Seconds a connection waits for another process's write to finish.
        # Writers are serialised by the FIFO lock; the wait is for the demo's
        # progress reader and for WAL checkpoints.
        "OPTIONS": {"timeout": 60},
    }
}

# The lock lives in the cache backend's Redis server. KEY_PREFIX and VERSION
# are the defaults; fifolock_django derives the lock name from them, see
# invoices/services.py for how the Celery task ends up on the same name.
CACHES = {
    "default": {
        "BACKEND": "fifolock_django.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
    }
}

# Timing of the lock for every surface. Nothing crashes in the demo, so these
# only bound how long a lost doorbell or a dead holder could stall it.
LEASE_MS = int(os.environ.get("EXAMPLE_LEASE_MS") or 10_000)
POLL_MS = int(os.environ.get("EXAMPLE_POLL_MS") or 2_000)
MAX_HOLD_MS = 600_000
FIFOLOCK = {
    "LEASE_MS": LEASE_MS,
    "POLL_MS": POLL_MS,
    "MAX_HOLD_MS": MAX_HOLD_MS,
    "CACHE": "default",
}

# Celery, read by example_project/celery.py with the CELERY_ namespace.
CELERY_BROKER_URL = celery_redis_url(REDIS_URL)
CELERY_RESULT_BACKEND = celery_redis_url(REDIS_URL)
CELERY_RESULT_EXPIRES = 3600
CELERY_TASK_DEFAULT_QUEUE = CELERY_QUEUE
CELERY_TASK_ACKS_LATE = False
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# The lock for @fifo_locked tasks is the cache's (FIFOLOCK['CACHE']): same
# server, database and names, with nothing to set here. The same timing:
CELERY_FIFO_LOCK_LEASE_MS = LEASE_MS
CELERY_FIFO_LOCK_POLL_MS = POLL_MS
CELERY_FIFO_LOCK_MAX_HOLD_MS = MAX_HOLD_MS

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
