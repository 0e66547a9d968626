"""The example project's Celery app: ``celery -A example_project.celery:app worker``.

Configuration comes from the Django settings, every Celery setting spelled with
the ``CELERY_`` prefix (``CELERY_BROKER_URL``, ``CELERY_FIFO_LOCK_LEASE_MS``...).
Its ``@fifo_locked`` tasks lock on the cache that ``FIFOLOCK['CACHE']`` names.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import worker_process_shutdown

from example_project import telemetry

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

app = Celery("example_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_process_shutdown.connect
def write_telemetry(**kwargs: Any) -> None:
    """A pool process ends without running ``atexit``: write its metrics now."""
    telemetry.dump()
