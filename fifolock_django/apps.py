"""The ``fifolock_django`` app: add it to ``INSTALLED_APPS`` for its system checks."""

from __future__ import annotations

from django.apps import AppConfig


class FifoLockAppConfig(AppConfig):
    """Registers the ``fifolock.*`` system checks (see ``fifolock_django.checks``)."""

    name = "fifolock_django"
    label = "fifolock"
    verbose_name = "Redis FIFO lock"

    def ready(self) -> None:
        """Import the checks module, whose functions register themselves."""
        from . import checks  # noqa: F401
