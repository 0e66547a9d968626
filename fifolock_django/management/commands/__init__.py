"""``manage.py fifolock``: see ``fifolock_django.management.commands.fifolock``."""
