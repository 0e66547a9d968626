"""Django integration of redis-fifo-lock.

- ``fifolock_django.cache.RedisCache``: django-redis's cache backend plus
  ``cache.fifo_lock(name, timeout=None)``, usable as ``with`` and ``async with``
  and yielding the ``Lease``; lock names are cache keys (``KEY_PREFIX`` and
  ``VERSION`` apply).
- ``fifolock_django.commands.fifo_locked_command``: serve the runs of a
  management command one after another, in arrival order.
- ``fifolock_django.conf``: the ``FIFOLOCK`` setting (``LEASE_MS``, ``POLL_MS``,
  ``MAX_HOLD_MS``, ``CACHE``), read at use time.
- ``"fifolock_django"`` in ``INSTALLED_APPS`` adds system checks
  (``fifolock.E001``...; see ``fifolock_django.checks``).

The modules are not imported here, so that importing the package needs neither
configured settings nor django-redis.
"""
