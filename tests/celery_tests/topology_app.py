"""The Celery apps that ``test_celery_topologies.py`` runs in real workers.

Two apps, so that each test process can talk to two different brokers (an
app's broker connection pool is fixed at first use): ``sentinel_app`` and
``cluster_app``, each with a ``ping`` probe and a locked ``hold`` task. A
worker runs one of them (``-A tests.celery_tests.topology_app:sentinel_app``)
and takes its settings from ``$FIFOLOCK_TOPOLOGY_CONF``, a JSON object given to
``app.conf.update``; the test process calls ``configure`` with the same
object. Neither app becomes Celery's current app on import, so importing this
module leaves ``tests.celery_tests.celery_app`` current for the other test modules. Locked
bodies write their holds to a record file (``tests.support.record``),
independent of the lock's keys.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery import Celery, Task, current_task

from fifolock_celery import current_lease, fifo_locked
from tests.support.record import Record

CONF_ENV = "FIFOLOCK_TOPOLOGY_CONF"
LEASE_MS, POLL_MS = 600, 100


def configure(app: Celery, conf: dict[str, Any]) -> None:
    """Apply ``conf`` (app settings) to ``app`` on top of the fixed ones."""
    app.conf.update(
        fifo_lock_lease_ms=LEASE_MS,
        fifo_lock_poll_ms=POLL_MS,
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        **conf,
    )


def ping() -> dict[str, Any]:
    """Readiness probe (answers like ``tests.celery_tests.celery_app.ping``)."""
    return {"hostname": current_task.request.hostname, "warmed_up_in": None}


def hold(record: str, key: str, who: str, hold_ms: int) -> int:
    """Hold ``topology-<key>`` for ``hold_ms`` ms, recorded in the file ``record``
    (``who`` is one word); return the fence."""
    lease = current_lease()
    log = Record(record)
    log.enter(lease, who)
    time.sleep(hold_ms / 1000)  # the work done under the lock
    log.exit(lease)
    return lease.fence


def tasks_of(app: Celery) -> tuple[Task[Any, Any], Task[Any, Any]]:
    """Register ``ping`` and the locked ``hold`` on ``app``; return them."""
    probe: Task[Any, Any] = app.task(name="topology.ping", shared=False)(ping)
    locked_hold = fifo_locked("topology-{key}")(hold)
    locked: Task[Any, Any] = app.task(name="topology.hold", shared=False)(locked_hold)
    return probe, locked


sentinel_app = Celery("topology-sentinel", set_as_current=False)
sentinel_ping, sentinel_hold = tasks_of(sentinel_app)
cluster_app = Celery("topology-cluster", set_as_current=False)
cluster_ping, cluster_hold = tasks_of(cluster_app)

if os.environ.get(CONF_ENV):
    for _app in (sentinel_app, cluster_app):
        configure(_app, json.loads(os.environ[CONF_ENV]))
