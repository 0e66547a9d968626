"""WSGI entry point (e.g. ``gunicorn example_project.wsgi``).

Under WSGI Django runs the async invoice view through ``async_to_sync``, one
event loop per request; the lock still works there (it keeps a Redis client
per event loop).
"""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

application = get_wsgi_application()
