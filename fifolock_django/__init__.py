"""Django integration of redis-fifo-lock.

- Cache backends with ``cache.fifo_lock(name, timeout=None, **lock_options)``,
  usable as ``with`` and ``async with`` and yielding the ``Lease``; lock names
  are cache keys (``KEY_PREFIX``, ``VERSION`` and ``KEY_FUNCTION`` apply):
  ``fifolock_django.cache.RedisCache`` (django-redis) and
  ``fifolock_django.builtin.RedisCache`` (Django's own Redis backend).
- ``fifolock_django.lock_name(name, cache=None)`` and ``lock_namespace(cache=None)``:
  the Redis name and namespace (the ``KEY_PREFIX``, in front of every lock key)
  of that lock, for code that takes it through the core (``fifolock_celery``
  tasks take it by the plain name).
- ``fifolock_django.commands.fifo_locked_command``: serve the runs of a
  management command one after another, in arrival order.
- ``manage.py fifolock status NAME`` and ``manage.py fifolock run NAME --
  COMMAND [ARGS]`` (with ``"fifolock_django"`` in ``INSTALLED_APPS``).
- ``fifolock_django.conf``: the ``FIFOLOCK`` setting (``LEASE_MS``, ``POLL_MS``,
  ``MAX_HOLD_MS``, ``REPLICAS``, ``REPLICA_WAIT_MS``, ``CACHE``), read at use time.
- ``"fifolock_django"`` in ``INSTALLED_APPS`` adds system checks
  (``fifolock.E001``...; see ``fifolock_django.checks``).

Importing the package needs neither configured settings nor django-redis.
"""

from .lock import lock_name, lock_namespace

__all__ = ["lock_name", "lock_namespace"]
