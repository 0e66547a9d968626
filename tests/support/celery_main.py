"""``celery`` for the test workers, with a stack dump on demand.

``python -m tests.support.celery_main <celery arguments>`` is ``celery
<arguments>``, except that every process of the worker (its prefork children
inherit it) writes the traceback of each of its threads to stderr on
``SIGUSR2`` (``faulthandler``). ``tests.support.celery_worker`` sends it to a
worker that does not stop in time, so the log says where it was stuck.
"""

from __future__ import annotations

import faulthandler
import signal

from celery.__main__ import main

DUMP_SIGNAL = signal.SIGUSR2
"""The signal on which a test worker's processes dump their threads' stacks."""

if __name__ == "__main__":
    faulthandler.register(DUMP_SIGNAL, all_threads=True, chain=False)
    main()
