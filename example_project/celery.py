"""The example project's Celery app: ``celery -A example_project.celery:app worker``.

Configuration comes from the Django settings, every Celery setting spelled with
the ``CELERY_`` prefix (``CELERY_BROKER_URL``, ``CELERY_FIFO_LOCK_LEASE_MS``...).
Its ``@fifo_locked`` tasks lock on the cache that ``FIFOLOCK['CACHE']`` names.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

app = Celery("example_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
