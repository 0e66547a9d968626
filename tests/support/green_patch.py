"""Monkey-patch a process as ``celery worker --pool gevent|eventlet`` does.

Imported first by the green-pool scripts (``green_guard``, ``green_spin``), so
that everything they import after it is patched, as in a green worker.
"""

from __future__ import annotations


def patch_as(pool: str) -> None:
    """Patch the process as Celery's ``pool`` ("gevent" or "eventlet") does; any
    other value (as when a test imports the script for its mutants) patches
    nothing."""
    if pool == "gevent":
        from gevent import monkey

        monkey.patch_all()
    elif pool == "eventlet":
        import eventlet

        eventlet.monkey_patch()
