"""``fifolock_celery`` with the locks on a Sentinel master or a Redis Cluster.

The reading of the settings (``LockServer``) runs everywhere, without servers.
The tests marked ``sentinel`` and ``cluster`` run ``@fifo_locked`` tasks in a
real prefork worker (``tests.celery_tests.topology_app``) against a real master,
replica and three sentinels, or a real three-master cluster (the fixtures of
``tests/sentinel_tests`` and ``tests/cluster_tests``): run them with ``-m sentinel`` /
``-m cluster``. Exclusion is judged from a record file kept apart from the
lock's keys.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
from celery import Celery, Task
from redis import Redis
from redis.cluster import RedisCluster

from fifolock_celery import LockConfig, LockServer, fifo_locked, start_warnings
from redis_fifo_lock import LockUsageError
from redis_fifo_lock.protocol import LockKeys
from tests.celery_tests import topology_app as topology
from tests.celery_tests.celery_app import db_url
from tests.cluster_tests.conftest import LocalCluster, redis_cluster  # noqa: F401  (fixture)
from tests.sentinel_tests.conftest import sentinel_setup  # noqa: F401  (fixture)
from tests.support.celery_worker import RESULT_TIMEOUT_S, running_worker, unique
from tests.support.record import Record, violations
from tests.support.sentinel import PrivateSentinelSetup

SENTINELS = "sentinel://:pw@s1.example:26379/4;sentinel://s2.example"
HOLDS = 4
"""Tasks sent at once for one lock; the worker runs them all concurrently."""
HOLD_MS = 200
BROKER_DB, RESULT_DB, LOCK_DB = 6, 7, 4
"""Databases of the plain broker and results (of the session's server) and of
the Sentinel master's locks, apart from those of ``tests.celery_tests.celery_app``."""


# --- settings -> LockServer (no server) --------------------------------------------------


def test_a_sentinel_broker_and_its_transport_options_are_the_default_lock_server() -> None:
    app = Celery("t", broker=SENTINELS)
    app.conf.broker_transport_options = {
        "master_name": "mymaster",
        "sentinel_kwargs": {"password": "sentinel-pw"},
        "visibility_timeout": 3600,
    }

    server = LockConfig.from_app(app, "jobs").server

    assert server == LockServer.sentinel(
        [("s1.example", 26379), ("s2.example", 26379)],
        "mymaster",
        sentinel_kwargs={"password": "sentinel-pw"},
        db=4,
        password="pw",
    )
    assert server.describe() == (
        "master 'mymaster' of the sentinels s1.example:26379, s2.example:26379"
    )
    clients = server.clients()
    assert clients.url == "sentinel://mymaster"
    assert clients.connection_kwargs == {"db": 4, "password": "pw"}


def test_fifo_lock_transport_options_win_over_the_broker_s() -> None:
    app = Celery("t", broker=SENTINELS)
    app.conf.broker_transport_options = {"master_name": "broker-master"}
    app.conf.fifo_lock_transport_options = {"master_name": "lock-master"}

    assert LockConfig.from_app(app, "jobs").server.service_name == "lock-master"


def test_a_sentinel_lock_url_of_its_own_takes_no_options_from_the_broker() -> None:
    app = Celery("t", broker=SENTINELS)
    app.conf.broker_transport_options = {"master_name": "mymaster"}
    app.conf.fifo_lock_redis_url = "sentinel://locks.example:26379"

    with pytest.raises(LockUsageError, match=r"fifo_lock_transport_options.*'master_name'"):
        LockConfig.from_app(app, "jobs")


def test_the_broker_url_named_again_for_the_locks_keeps_the_broker_s_options() -> None:
    app = Celery("t", broker=SENTINELS)
    app.conf.broker_transport_options = {"master_name": "mymaster"}
    app.conf.fifo_lock_redis_url = SENTINELS

    assert LockConfig.from_app(app, "jobs").server.service_name == "mymaster"


def test_the_cluster_transport_option_makes_each_url_a_cluster_node() -> None:
    class DjangoSettings:
        CELERY_BROKER_URL = "redis://broker.example/1"
        CELERY_FIFO_LOCK_REDIS_URL = "redis://n1:7000;redis://n2:7001"
        CELERY_FIFO_LOCK_TRANSPORT_OPTIONS: ClassVar[dict[str, bool]] = {"cluster": True}

    app = Celery("t")
    app.config_from_object(DjangoSettings, namespace="CELERY")

    server = LockConfig.from_app(app, "jobs").server

    assert server == LockServer.cluster(["redis://n1:7000", "redis://n2:7001"])
    assert server.topology == "cluster"
    assert server.clients().url == "redis://n1:7000"


@pytest.mark.parametrize(
    ("url", "options", "message"),
    [
        ("sentinel://:secret@s1:26379", {}, "must name the service with 'master_name'"),
        ("sentinel://:secret@s1;redis://s2", {"master_name": "m"}, "must be sentinel://host"),
        ("sentinel://:secret@s1", {"master_name": "m", "sentinel_kwargs": "pw"}, "a dict"),
        ("sentinel://:secret@s1", {"master_name": "m", "cluster": True}, "cannot name a Redis"),
        ("redis://:secret@n1:7000/2", {"cluster": True}, "database 0 only"),
        ("redis://:secret@n1:7000", {"cluster": "yes"}, "True or False"),
        ("redis://:secret@a;redis://b", {}, "lists several servers"),
        ("redis://:secret@a", ["cluster"], "must be a dict"),
    ],
)
def test_lock_server_settings_that_cannot_work_are_refused_naming_the_settings(
    url: str, options: Any, message: str
) -> None:
    app = Celery("t", broker="redis://broker.example/1")
    app.conf.fifo_lock_redis_url = url
    app.conf.fifo_lock_transport_options = options

    with pytest.raises(LockUsageError) as caught:
        LockConfig.from_app(app, "jobs")

    assert message in str(caught.value)
    assert "fifo_lock_redis_url, fifo_lock_transport_options" in str(caught.value)
    assert "secret" not in str(caught.value)


def test_replicas_on_a_redis_cluster_are_refused_naming_where_they_came_from() -> None:
    # Nothing connects here.
    app = Celery("t", broker="redis://broker.example/1")
    app.conf.fifo_lock_redis_url = "redis://n1:7000"
    app.conf.fifo_lock_transport_options = {"cluster": True}

    @app.task(shared=False)
    @fifo_locked("jobs", replicas=1)
    def job() -> None: ...

    assert LockConfig.from_app(app, "jobs").settings.replicas == 0
    app.conf.fifo_lock_replicas = 2
    with pytest.raises(ValueError) as setting:
        LockConfig.from_app(app, "jobs")
    assert LockConfig.from_app(app, "jobs", replicas=0).settings.replicas == 0
    [message] = [text for text in start_warnings(app) if text.startswith(f"task {job.name}:")]

    assert str(setting.value).startswith(
        "FIFO lock 'jobs': fifo_lock_replicas is 2, but the lock is on a Redis Cluster "
        "(Redis Cluster redis://n1:7000), where a lock cannot wait for replicas"
    )
    assert message.startswith(
        f"task {job.name}: every execution will fail: FIFO lock 'jobs': "
        "@fifo_locked(replicas=...) is 1, but the lock is on a Redis Cluster"
    )


def test_a_sentinel_broker_without_master_name_is_reported_at_worker_start() -> None:
    app = Celery("t", broker=SENTINELS)

    @app.task
    @fifo_locked("jobs")
    def job() -> None: ...

    [message] = [text for text in start_warnings(app) if text.startswith(f"task {job.name}:")]
    assert message.startswith(f"task {job.name}: every execution will fail: ")
    assert "broker_transport_options (or fifo_lock_transport_options)" in message


# --- real workers -------------------------------------------------------------------------


def run_holds(hold: Task[Any, Any], record: Path) -> str:
    """Send ``HOLDS`` ``hold`` tasks for one fresh lock at once; check that they
    ran one at a time with strictly rising fences; return the lock's name."""
    key = unique("topo")
    results = [hold.delay(str(record), key, f"t{i}", HOLD_MS) for i in range(HOLDS)]
    fences = sorted(result.get(timeout=RESULT_TIMEOUT_S) for result in results)
    holds = Record(record).holds()
    assert violations(holds) == []
    assert fences == [hold.fence for hold in holds] == sorted(set(fences))
    assert len(fences) == HOLDS
    return f"topology-{key}"


@pytest.mark.sentinel
def test_a_sentinel_broker_s_tasks_lock_on_its_master(
    sentinel_setup: PrivateSentinelSetup,  # noqa: F811
    redis_url: str,
    logdir: Path,
    tmp_path: Path,
) -> None:
    broker = ";".join(
        f"sentinel://{host}:{port}/{LOCK_DB}" for host, port in sentinel_setup.sentinel_addresses
    )
    conf = {
        "broker_url": broker,
        "broker_transport_options": {"master_name": sentinel_setup.service_name},
        "result_backend": db_url(redis_url, RESULT_DB),
    }
    topology.configure(topology.sentinel_app, conf)

    with running_worker(
        redis_url,
        "prefork",
        logdir,
        concurrency=HOLDS,
        app="tests.celery_tests.topology_app:sentinel_app",
        ping=topology.sentinel_ping,
        env={topology.CONF_ENV: json.dumps(conf)},
    ):
        name = run_holds(topology.sentinel_hold, tmp_path / "record")

    master = sentinel_setup.master
    with Redis(master.host, master.port, db=LOCK_DB) as direct:
        assert direct.exists(LockKeys(name).key("counters")) == 1


@pytest.mark.cluster
def test_tasks_lock_on_a_redis_cluster_named_by_the_cluster_transport_option(
    redis_cluster: LocalCluster,  # noqa: F811
    redis_url: str,
    logdir: Path,
    tmp_path: Path,
) -> None:
    conf = {
        "broker_url": db_url(redis_url, BROKER_DB),
        "result_backend": db_url(redis_url, RESULT_DB),
        "fifo_lock_redis_url": ";".join(
            f"redis://{node.host}:{node.port}" for node in redis_cluster.nodes
        ),
        "fifo_lock_transport_options": {"cluster": True},
    }
    topology.configure(topology.cluster_app, conf)

    with running_worker(
        redis_url,
        "prefork",
        logdir,
        concurrency=HOLDS,
        app="tests.celery_tests.topology_app:cluster_app",
        ping=topology.cluster_ping,
        env={topology.CONF_ENV: json.dumps(conf)},
    ):
        name = run_holds(topology.cluster_hold, tmp_path / "record")

    with RedisCluster.from_url(redis_cluster.url) as client:
        assert client.exists(LockKeys(name).key("counters")) == 1
