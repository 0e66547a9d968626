"""Management commands of the ``fifolock_django`` app."""
