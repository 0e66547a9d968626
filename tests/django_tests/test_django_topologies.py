"""``cache.fifo_lock`` on Sentinel and Redis Cluster caches.

The translation of ``LOCATION`` and ``OPTIONS`` runs everywhere (no server).
The tests marked ``sentinel`` and ``cluster`` run the lock against a real
master, replica and three sentinels, or a real three-master cluster (started
by the fixtures of ``tests/sentinel_tests`` and ``tests/cluster_tests``): run them with
``-m sentinel`` / ``-m cluster``. Exclusion is judged from a record file kept
apart from the lock's keys (``tests.support.record``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from django.core.cache import caches
from django.core.checks import Error, Tags, run_checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from redis import Redis
from redis.cluster import RedisCluster

from fifolock_django import builtin, cache
from redis_fifo_lock import LockServer
from redis_fifo_lock.protocol import LockKeys
from tests.cluster_tests.conftest import LocalCluster, redis_cluster  # noqa: F401  (fixture)
from tests.sentinel_tests.conftest import sentinel_setup  # noqa: F401  (fixture)
from tests.support.record import Record, violations
from tests.support.sentinel import PrivateSentinelSetup

pytestmark = pytest.mark.filterwarnings("error")

SENTINELS = [("s1.example", 26379), ("s2.example", 26380)]
SENTINEL_OPTIONS: dict[str, Any] = {
    "CLIENT_CLASS": "django_redis.client.SentinelClient",
    "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
    "CONNECTION_POOL_CLASS": "redis.sentinel.SentinelConnectionPool",
    "SENTINELS": SENTINELS,
}
"""django-redis's documented Sentinel form (the factory may also be the
``DJANGO_REDIS_CONNECTION_FACTORY`` setting)."""
HOLDERS = 3
"""Sync threads, and async tasks, contending for one lock in each scenario."""
HOLD_S = 0.15
"""Seconds each holder stays inside (the project's POLL_MS is 100)."""


# --- LOCATION and OPTIONS -> LockServer (no server) --------------------------------------


def test_django_redis_s_sentinel_form_locks_on_the_master_of_its_service() -> None:
    options = {
        **SENTINEL_OPTIONS,
        "SENTINEL_KWARGS": {"password": "sentinel-pw"},
        "PASSWORD": "option-pw",
        "SOCKET_TIMEOUT": 5,
        "CONNECTION_POOL_KWARGS": {"max_connections": 20, "retry": object()},
    }

    connection = cache.connection_settings("redis://:url-pw@mymaster/2", options)

    assert connection == LockServer.sentinel(
        SENTINELS,
        "mymaster",
        sentinel_kwargs={"password": "sentinel-pw"},
        password="url-pw",  # the URL's own password wins, as in django-redis
        db=2,
        socket_timeout=5,
        max_connections=20,
    )
    assert connection.describe() == (
        "master 'mymaster' of the sentinels s1.example:26379, s2.example:26380"
    )


def test_the_sentinel_factory_may_be_the_global_django_redis_setting() -> None:
    options = {"SENTINELS": SENTINELS}
    location = ["rediss://mymaster/0?is_master=1", "rediss://mymaster/0?is_master=0"]

    with override_settings(DJANGO_REDIS_CONNECTION_FACTORY=SENTINEL_OPTIONS["CONNECTION_FACTORY"]):
        connection = cache.connection_settings(location, options)

    assert connection == LockServer.sentinel(SENTINELS, "mymaster", db=0, ssl=True)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"SENTINELS": SENTINELS}, "OPTIONS['SENTINELS'] asks for Sentinel"),
        ({"CLIENT_CLASS": SENTINEL_OPTIONS["CLIENT_CLASS"]}, "OPTIONS['CLIENT_CLASS']"),
        (
            {"CONNECTION_POOL_CLASS": SENTINEL_OPTIONS["CONNECTION_POOL_CLASS"]},
            "OPTIONS['CONNECTION_POOL_CLASS']",
        ),
        ({"CONNECTION_FACTORY": SENTINEL_OPTIONS["CONNECTION_FACTORY"]}, "OPTIONS['SENTINELS']"),
        ({**SENTINEL_OPTIONS, "SENTINELS": ["s1:26379"]}, "(host, port) pairs"),
        ({**SENTINEL_OPTIONS, "SENTINEL_KWARGS": "pw"}, "OPTIONS['SENTINEL_KWARGS']"),
        ({**SENTINEL_OPTIONS, "FIFOLOCK_CLUSTER": True}, "both Sentinel and Redis Cluster"),
    ],
)
def test_an_incomplete_sentinel_set_up_is_refused_naming_what_to_set(
    options: dict[str, Any], named: str
) -> None:
    with pytest.raises(ImproperlyConfigured) as info:
        cache.connection_settings("redis://mymaster/0", options)
    assert named in str(info.value)


def test_sentinel_kwargs_of_the_wrong_type_are_refused_showing_only_their_type() -> None:
    # A password given as a plain string instead of {"password": ...}.
    options = {**SENTINEL_OPTIONS, "SENTINEL_KWARGS": "sentinel-s3cret"}

    with pytest.raises(ImproperlyConfigured) as info:
        cache.connection_settings("redis://mymaster/0", options)

    assert "OPTIONS['SENTINEL_KWARGS'] must be a dict or None, got str" in str(info.value)
    assert "s3cret" not in str(info.value)


def test_a_replica_url_first_is_refused_for_the_lock() -> None:
    with pytest.raises(ImproperlyConfigured, match="is_master=0"):
        cache.connection_settings("redis://mymaster/0?is_master=0", SENTINEL_OPTIONS)


def test_fifolock_cluster_makes_every_location_url_a_node_to_discover_the_cluster() -> None:
    options = {"FIFOLOCK_CLUSTER": True, "PASSWORD": "pw", "SOCKET_TIMEOUT": 2}

    connection = cache.connection_settings("redis://n1:7000,redis://n2:7001", options)

    assert connection == LockServer.cluster(
        ["redis://n1:7000", "redis://n2:7001"], password="pw", socket_timeout=2
    )
    assert connection.describe() == "Redis Cluster redis://n1:7000, redis://n2:7001"


def test_a_redis_cluster_client_class_implies_a_cluster_unless_fifolock_cluster_says_no() -> None:
    options: dict[str, Any] = {"REDIS_CLIENT_CLASS": "redis.cluster.RedisCluster"}

    assert cache.connection_settings("redis://n1:7000", options).topology == "cluster"
    options["FIFOLOCK_CLUSTER"] = False
    assert cache.connection_settings("redis://n1:7000", options).topology == "server"


@pytest.mark.parametrize(
    ("location", "options", "named"),
    [
        ("redis://n1:7000/1", {"FIFOLOCK_CLUSTER": True}, "database 0 only"),
        ("unix:///tmp/redis.sock", {"FIFOLOCK_CLUSTER": True}, "redis:// or rediss://"),
        (
            "redis://n1:7000",
            {"FIFOLOCK_CLUSTER": True, "CONNECTION_POOL_KWARGS": {"db": 3}},
            "take no db",
        ),
        (
            "redis://n1:7000",
            {"FIFOLOCK_CLUSTER": True, "CONNECTION_POOL_KWARGS": {"bogus": 1}},
            "take no bogus",
        ),
        ("redis://n1:7000", {"FIFOLOCK_CLUSTER": "yes"}, "True or False"),
    ],
)
def test_a_cluster_set_up_the_cluster_client_cannot_use_is_refused(
    location: str, options: dict[str, Any], named: str
) -> None:
    with pytest.raises(ImproperlyConfigured) as info:
        cache.connection_settings(location, options)
    assert named in str(info.value)


def test_replicas_on_a_redis_cluster_cache_are_refused_when_the_lock_is_made() -> None:
    # Nothing connects here.
    location = {"LOCATION": "redis://n1.example:7000", "OPTIONS": {"FIFOLOCK_CLUSTER": True}}
    setting = {"default": {"BACKEND": "fifolock_django.cache.RedisCache", **location}}
    with override_settings(CACHES=setting):
        lock_cache = caches["default"]
        assert lock_cache.fifo_lock("jobs").settings.replicas == 0
        with pytest.raises(ValueError) as given:
            lock_cache.fifo_lock("jobs", replicas=1)
        with override_settings(FIFOLOCK={"REPLICAS": 2}):
            with pytest.raises(ImproperlyConfigured) as configured:
                lock_cache.fifo_lock("jobs")
            assert lock_cache.fifo_lock("jobs", replicas=0).settings.replicas == 0
    where = "the lock is on a Redis Cluster (Redis Cluster redis://n1.example:7000)"
    assert str(given.value).startswith(f"fifo_lock(replicas=...) is 1, but {where}")
    assert str(given.value).endswith("; set it to 0")
    assert str(configured.value).startswith(f"FIFOLOCK['REPLICAS'] is 2, but {where}")


@pytest.mark.parametrize(
    "options",
    [{"pool_class": "redis.sentinel.SentinelConnectionPool"}, {"FIFOLOCK_CLUSTER": True}],
)
def test_django_s_builtin_backend_refuses_sentinel_and_cluster_naming_django_redis(
    options: dict[str, Any],
) -> None:
    with pytest.raises(ImproperlyConfigured, match=r"fifolock_django\.cache\.RedisCache"):
        builtin.connection_settings("redis://mymaster/0", options)


def test_deploy_reports_sentinels_that_know_no_master_as_unreachable() -> None:
    setting = sentinel_caches("mymaster", [("127.0.0.1", 1)], 0)
    with override_settings(CACHES=setting):
        [message] = deploy_messages()
    assert message.id == "fifolock.E006"
    assert message.msg.startswith(
        "The Redis server of cache 'default' (master 'mymaster' of the sentinels "
        "127.0.0.1:1) cannot be reached: "
    )


# --- helpers for the real servers ----------------------------------------------------------


def sentinel_caches(service: str, sentinels: list[tuple[str, int]], db: int) -> dict[str, Any]:
    """A ``CACHES`` setting: the default cache in django-redis's Sentinel form."""
    return {
        "default": {
            "BACKEND": "fifolock_django.cache.RedisCache",
            "LOCATION": f"redis://{service}/{db}",
            "OPTIONS": {**SENTINEL_OPTIONS, "SENTINELS": sentinels},
            "KEY_PREFIX": "topo",
        }
    }


def cluster_caches(cluster: LocalCluster) -> dict[str, Any]:
    """A ``CACHES`` setting: the default cache's locks on every node of ``cluster``."""
    location = ",".join(f"redis://{node.host}:{node.port}" for node in cluster.nodes)
    return {
        "default": {
            "BACKEND": "fifolock_django.cache.RedisCache",
            "LOCATION": location,
            "OPTIONS": {"FIFOLOCK_CLUSTER": True},
            "KEY_PREFIX": "topo",
        }
    }


def deploy_messages() -> list[Any]:
    """The ``fifolock.*`` messages of the ``caches`` checks, with ``--deploy``'s."""
    messages = run_checks(tags=[Tags.caches], include_deployment_checks=True)
    return [m for m in messages if m.id and m.id.startswith("fifolock.")]


def contend(record: Record, name: str) -> None:
    """``HOLDERS`` threads (``with``) and ``HOLDERS`` tasks on one loop (``async with``)
    take ``cache.fifo_lock(name)`` at once; each records its hold in ``record``."""

    def sync_holder(who: str) -> None:
        with caches["default"].fifo_lock(name, timeout=30) as lease:
            record.enter(lease, who)
            time.sleep(HOLD_S)
            record.exit(lease)

    async def async_holder(who: str) -> None:
        async with caches["default"].fifo_lock(name, timeout=30) as lease:
            record.enter(lease, who)
            await asyncio.sleep(HOLD_S)
            record.exit(lease)

    async def async_holders() -> None:
        await asyncio.gather(*(async_holder(f"async{i}") for i in range(HOLDERS)))

    with ThreadPoolExecutor(HOLDERS + 1) as pool:
        done = [pool.submit(sync_holder, f"sync{i}") for i in range(HOLDERS)]
        done.append(pool.submit(asyncio.run, async_holders()))
        for future in done:
            future.result(timeout=60)


def assert_one_at_a_time(record: Record) -> None:
    """Every holder was inside once, never two at a time, fences 1, 2, ..."""
    holds = record.holds()
    assert violations(holds) == []
    assert sorted(hold.who for hold in holds) == sorted(
        [f"sync{i}" for i in range(HOLDERS)] + [f"async{i}" for i in range(HOLDERS)]
    )
    fences = [hold.fence for hold in holds]
    assert fences == sorted(set(fences)) and len(fences) == 2 * HOLDERS


# --- Sentinel -----------------------------------------------------------------------------


@pytest.fixture
def sentinel_cache(sentinel_setup: PrivateSentinelSetup) -> Iterator[PrivateSentinelSetup]:  # noqa: F811
    """The default cache in django-redis's Sentinel form on the running set-up
    (database 5 of the master, emptied first)."""
    with Redis(sentinel_setup.master.host, sentinel_setup.master.port, db=5) as master:
        master.flushdb()
    setting = sentinel_caches(sentinel_setup.service_name, sentinel_setup.sentinel_addresses, 5)
    with override_settings(CACHES=setting):
        yield sentinel_setup


@pytest.mark.sentinel
def test_a_sentinel_cache_s_lock_excludes_threads_and_tasks_on_the_master(
    sentinel_cache: PrivateSentinelSetup, tmp_path: Path
) -> None:
    default = caches["default"]
    default.set("greeting", "hello")  # django-redis itself accepts the set-up
    assert default.get("greeting") == "hello"
    record = Record(tmp_path / "record")

    contend(record, "job")

    assert_one_at_a_time(record)
    lock = default.fifo_lock("job")
    assert lock.status().last_fence == max(hold.fence for hold in record.holds())
    master = sentinel_cache.master
    with Redis(master.host, master.port, db=5) as direct:
        assert direct.exists(LockKeys(lock.name, lock.namespace).key("counters")) == 1


@pytest.mark.sentinel
def test_deploy_checks_read_the_policy_of_the_master_found_through_the_sentinels(
    sentinel_cache: PrivateSentinelSetup,
) -> None:
    master = sentinel_cache.master
    with Redis(master.host, master.port) as direct:
        direct.config_set("maxmemory-policy", "volatile-lru")
        try:
            [message] = deploy_messages()
        finally:
            direct.config_set("maxmemory-policy", "noeviction")
    assert message == Error(
        "The Redis server of cache 'default' (master 'mymaster' of the sentinels "
        + ", ".join(f"{host}:{port}" for host, port in sentinel_cache.sentinel_addresses)
        + ") has maxmemory-policy 'volatile-lru', which can evict FIFO lock keys: a held "
        "lock would be freed silently and the fence counter could go back.",
        hint=message.hint,
        id="fifolock.E005",
    )
    assert deploy_messages() == []


# --- Redis Cluster ------------------------------------------------------------------------


@pytest.fixture
def cluster_cache(redis_cluster: LocalCluster) -> Iterator[LocalCluster]:  # noqa: F811
    """The default cache's locks on the running cluster (every master emptied first)."""
    with RedisCluster.from_url(redis_cluster.url) as client:
        client.flushall(target_nodes=RedisCluster.PRIMARIES)
    with override_settings(CACHES=cluster_caches(redis_cluster)):
        yield redis_cluster


@pytest.mark.cluster
def test_a_cluster_cache_s_lock_excludes_threads_and_tasks(
    cluster_cache: LocalCluster, tmp_path: Path
) -> None:
    record = Record(tmp_path / "record")

    contend(record, "job")

    assert_one_at_a_time(record)
    lock = caches["default"].fifo_lock("job")
    assert lock.status().last_fence == max(hold.fence for hold in record.holds())
    with RedisCluster.from_url(cluster_cache.url) as client:
        assert client.exists(LockKeys(lock.name, lock.namespace).key("counters")) == 1


@pytest.mark.cluster
def test_deploy_checks_read_the_policy_of_every_cluster_primary(
    cluster_cache: LocalCluster,
) -> None:
    assert deploy_messages() == []
    last = cluster_cache.nodes[-1]
    with Redis(last.host, last.port) as node:
        node.config_set("maxmemory-policy", "allkeys-lru")
        try:
            [message] = deploy_messages()
        finally:
            node.config_set("maxmemory-policy", "noeviction")
    assert message.id == "fifolock.E005"
    assert message.msg.startswith(
        f"The Redis server of cache 'default' (Redis Cluster {cluster_cache.url}, "
    )
    assert "has maxmemory-policy 'allkeys-lru', which can evict" in message.msg
