"""ASGI entry point: ``uvicorn example_project.asgi:application``.

Served this way the invoice view runs on uvicorn's event loop and takes the
lock with ``async with cache.fifo_lock(...)``, the async path of the lock.
"""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

application = get_asgi_application()
