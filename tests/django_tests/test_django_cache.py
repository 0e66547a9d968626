"""``cache.fifo_lock`` on both Redis backends: views, keys, connections, settings.

Everything runs against the session's real Redis (``redis_url``) through the
small Django project in ``tests/django_app``: Django's test clients for the
views. Overlaps and lost updates are judged from a record kept apart from the
lock's keys (``django_app.record``). Tests taking ``any_backend`` run once on
django-redis's backend and once on Django's built-in one.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.test import AsyncClient, Client, override_settings
from django_app import settings as project
from django_app.testing import assert_served_one_at_a_time, get_json, url_with_db
from redis import Connection, Redis
from redis.asyncio.connection import SSLConnection

import fifolock_django
import fifolock_django.lock as lock_module
from fifolock_django import builtin, cache
from fifolock_django.lock import CacheFifoLock, SupportsFifoLock, lock_cache
from redis_fifo_lock import (
    Lease,
    LeaseLost,
    LockServer,
    LockSettings,
    LockTimeout,
    LockUsageError,
    NotReplicated,
    RedisUnavailable,
    SyncFifoLock,
)
from redis_fifo_lock.testing import PrivateRedisFactory
from tests.support.polling import until

pytestmark = pytest.mark.filterwarnings("error")

REQUESTS = 8
"""Concurrent requests per scenario; each holds the lock for HOLD_S."""
HOLD_S = 0.3
"""Seconds of work under the lock: three polls (POLL_MS is 100) and a renewal."""


def custom_key(key: str, key_prefix: str, version: int) -> str:
    """A ``KEY_FUNCTION`` that is not Django's ``prefix:version:key``."""
    return f"{key_prefix}/v{version}/{key}"


# --- views -----------------------------------------------------------------------------


def test_sync_view_requests_from_many_threads_lose_no_update_and_never_overlap(
    any_backend: str, redis: Redis
) -> None:
    start = threading.Barrier(REQUESTS)

    def request(_: int) -> dict[str, Any]:
        client = Client()
        start.wait()
        return get_json(client, f"/sync/?hold={HOLD_S}")

    with ThreadPoolExecutor(REQUESTS) as pool:
        responses = list(pool.map(request, range(REQUESTS)))

    holds = assert_served_one_at_a_time(redis, REQUESTS)
    assert sorted(r["value"] for r in responses) == list(range(1, REQUESTS + 1))
    assert {hold["who"] for hold in holds} == {"sync"}


async def test_async_view_requests_gathered_on_one_loop_lose_no_update_and_never_overlap(
    any_backend: str, redis: Redis
) -> None:
    client = AsyncClient()
    responses = await asyncio.gather(
        *(client.get(f"/async/?hold={HOLD_S}") for _ in range(REQUESTS))
    )

    assert [r.status_code for r in responses] == [200] * REQUESTS
    holds = assert_served_one_at_a_time(redis, REQUESTS)
    assert sorted(r.json()["value"] for r in responses) == list(range(1, REQUESTS + 1))
    assert {hold["who"] for hold in holds} == {"async"}


async def test_sync_views_in_threads_and_async_views_on_the_loop_are_served_one_at_a_time(
    counter_cache: Any, redis: Redis
) -> None:
    async_client = AsyncClient()
    half = REQUESTS // 2
    sync_requests = [
        asyncio.to_thread(get_json, Client(), f"/sync/?hold={HOLD_S}") for _ in range(half)
    ]
    async_requests = [async_client.get(f"/async/?hold={HOLD_S}") for _ in range(half)]

    await asyncio.gather(*sync_requests, *async_requests)

    holds = assert_served_one_at_a_time(redis, REQUESTS)
    assert sorted(hold["who"] for hold in holds) == ["async"] * half + ["sync"] * half


# --- lock names are cache keys ------------------------------------------------------------


def test_lock_keys_carry_the_cache_key_prefix_and_version(any_backend: str, redis: Redis) -> None:
    with caches["default"].fifo_lock("reports") as lease:
        held_keys = {key.decode() for key in redis.keys("tests:fifolock:*")}
    with caches["default"].fifo_lock("reports", version=7) as other_version:
        pass

    assert lease.name == "tests:3:reports"
    assert "tests:fifolock:{tests:3:reports}:lease" in held_keys
    assert all(key.startswith("tests:fifolock:{tests:3:reports}:") for key in held_keys)
    assert other_version.name == "tests:7:reports"
    assert redis.exists("tests:fifolock:{tests:7:reports}:counters")


def test_lock_names_go_through_the_cache_s_key_function(any_backend: str, redis_url: str) -> None:
    caches_setting = project.caches_for(redis_url, any_backend)
    caches_setting["default"]["KEY_FUNCTION"] = custom_key
    with override_settings(CACHES=caches_setting):
        lock = caches["default"].fifo_lock("reports")
        assert lock.name == "tests/v3/reports" == fifolock_django.lock_name("reports")


def test_same_name_under_another_key_prefix_is_another_lock(
    redis_url: str, counter_cache: Any
) -> None:
    caches_setting = project.caches_for(redis_url)
    caches_setting["other"] = {**caches_setting["default"], "KEY_PREFIX": "other"}
    with (
        override_settings(CACHES=caches_setting),
        caches["default"].fifo_lock("reports") as mine,
        caches["other"].fifo_lock("reports", timeout=0) as theirs,
    ):
        assert (mine.name, theirs.name) == ("tests:3:reports", "other:3:reports")


def test_both_backends_on_one_server_with_the_same_prefix_share_the_lock(
    redis_url: str, redis: Redis
) -> None:
    caches_setting = project.caches_for(redis_url, "django-redis")
    caches_setting["builtin"] = project.caches_for(redis_url, "builtin")["default"]
    with (
        override_settings(CACHES=caches_setting),
        caches["default"].fifo_lock("reports") as held,
        pytest.raises(LockTimeout) as info,
        caches["builtin"].fifo_lock("reports", timeout=0),
    ):
        pass
    assert info.value.holder_fence == held.fence


def test_a_key_prefix_with_braces_is_refused_naming_key_prefix(redis_url: str) -> None:
    caches_setting = project.caches_for(redis_url)
    caches_setting["default"]["KEY_PREFIX"] = "shop{eu}"
    with override_settings(CACHES=caches_setting), pytest.raises(ImproperlyConfigured) as info:
        caches["default"].fifo_lock("reports")

    message = str(info.value)
    assert "KEY_PREFIX" in message and "'shop{eu}:3:reports'" in message


def test_a_bad_name_timeout_or_lock_option_is_refused_before_any_io(counter_cache: Any) -> None:
    with pytest.raises(ValueError, match="contains"):
        counter_cache.fifo_lock("a{b}")
    with pytest.raises(ValueError, match="timeout"):
        counter_cache.fifo_lock("reports", timeout=-1)
    with pytest.raises(ValueError, match="poll_ms"):
        counter_cache.fifo_lock("reports", poll_ms=400)
    with pytest.raises(ValueError, match=r"fifo_lock\(replicas=\.\.\.\) must be 0 or more, got -1"):
        counter_cache.fifo_lock("reports", replicas=-1)
    with pytest.raises(
        ValueError,
        match=r"fifo_lock\(replica_wait_ms=\.\.\.\) \(300\) must be at most a third of "
        r"FIFOLOCK\['LEASE_MS'\] \(600\)",
    ):
        counter_cache.fifo_lock("reports", replicas=1, replica_wait_ms=300)


# --- lock_name: the same lock from the core or Celery -------------------------------------


def test_lock_name_is_the_redis_name_of_the_cache_s_lock(redis_url: str, redis: Redis) -> None:
    caches_setting = project.caches_for(redis_url)
    caches_setting["other"] = {**caches_setting["default"], "KEY_PREFIX": "other"}
    with override_settings(CACHES=caches_setting):
        assert fifolock_django.lock_name("invoices") == "tests:3:invoices"
        assert fifolock_django.lock_name("invoices", "other", version=9) == "other:9:invoices"
        assert fifolock_django.lock_namespace() == "tests"
        assert fifolock_django.lock_namespace("other") == "other"
        core = SyncFifoLock(
            redis_url,
            fifolock_django.lock_name("invoices"),
            namespace=fifolock_django.lock_namespace(),
        )
        with core.hold() as held, pytest.raises(LockTimeout) as info:
            caches["default"].fifo_lock("invoices", timeout=0).acquire()
    assert info.value.holder_fence == held.fence


def test_lock_name_refuses_a_cache_without_fifo_lock(redis_url: str) -> None:
    caches_setting = project.caches_for(redis_url)
    caches_setting["plain"] = {"BACKEND": "django.core.cache.backends.redis.RedisCache"}
    with (
        override_settings(CACHES=caches_setting),
        pytest.raises(ImproperlyConfigured, match=r"'fifolock_django\.builtin\.RedisCache'"),
    ):
        fifolock_django.lock_name("invoices", "plain")


# --- with, async with, acquire/release ----------------------------------------------------


def test_a_busy_lock_times_out_in_sync_code_naming_the_holder_fence(any_backend: str) -> None:
    cache = caches["default"]
    with (
        cache.fifo_lock("busy") as held,
        pytest.raises(LockTimeout) as info,
        cache.fifo_lock("busy", timeout=0.3),
    ):
        pass
    assert info.value.holder_fence == held.fence
    assert info.value.waited >= 0.3


async def test_a_busy_lock_times_out_in_async_code_naming_the_holder_fence(
    any_backend: str,
) -> None:
    cache = caches["default"]
    async with cache.fifo_lock("busy") as held:
        with pytest.raises(LockTimeout) as info:
            async with cache.fifo_lock("busy", timeout=0.3):
                pass
    assert info.value.holder_fence == held.fence


def test_a_lease_from_acquire_is_released_by_either_twin(counter_cache: Any) -> None:
    lock = counter_cache.fifo_lock("handover", timeout=5)
    first = lock.acquire()
    assert lock.status().holder_fence == first.fence
    asyncio.run(lock.arelease(first))

    second = asyncio.run(lock.aacquire())
    lock.release(second)
    lock.release(second)  # a second release is a no-op

    after = lock.status()
    assert 0 < first.fence < second.fence
    assert (after.held, after.last_fence, after.waiting) == (False, second.fence, 0)


def test_a_lease_lost_before_release_raises_lease_lost(counter_cache: Any, redis: Redis) -> None:
    lock = counter_cache.fifo_lock("lost")
    lease = lock.acquire()
    redis.delete("tests:fifolock:{tests:3:lost}:lease")  # as an eviction would

    with pytest.raises(LeaseLost) as info:
        lock.release(lease)
    assert info.value.fence == lease.fence


async def test_sync_forms_on_a_thread_running_an_event_loop_are_refused(
    counter_cache: Any,
) -> None:
    lock = counter_cache.fifo_lock("x")
    with pytest.raises(LockUsageError, match="async with"), lock:
        pass
    with pytest.raises(LockUsageError, match="aacquire"):
        lock.acquire()
    with pytest.raises(LockUsageError, match="astatus"):
        lock.status()
    assert not (await lock.astatus()).held


def test_one_lock_object_entered_again_by_the_same_thread_is_refused(counter_cache: Any) -> None:
    lock = counter_cache.fifo_lock("x")
    with lock, pytest.raises(LockUsageError, match="already entered"), lock:
        pass
    with lock as lease:  # reusable once left
        assert not lease.lost


def _two_threads_through_one_object(cache: Any) -> list[str]:
    """Threads a and b enter one ``cache.fifo_lock()`` object behind a third
    holder; a is granted, an operator force-releases a's lease, b is granted,
    then a leaves, then b: what went wrong (each exit must release its own)."""
    shared = cache.fifo_lock("shared", timeout=20)
    entered = {who: threading.Event() for who in "ab"}
    may_leave = {who: threading.Event() for who in "ab"}
    fences: dict[str, int] = {}
    ended: dict[str, BaseException | None] = {}

    def inside(who: str) -> None:
        try:
            with shared as lease:
                fences[who] = lease.fence
                entered[who].set()
                may_leave[who].wait(20)
        except BaseException as exc:
            ended[who] = exc
        else:
            ended[who] = None

    async def queued(count: int) -> bool:
        return bool((await cache.fifo_lock("shared").astatus()).waiting >= count)

    threads = {who: threading.Thread(target=inside, args=(who,)) for who in "ab"}
    with cache.fifo_lock("shared", timeout=5):  # both wait behind this holder
        for count, who in enumerate("ab", start=1):
            threads[who].start()
            async_to_sync(until)(partial(queued, count), f"{who} queued")
    assert entered["a"].wait(10)
    shared.sync_lock().force_release()  # an operator frees a's lease: b is granted
    assert entered["b"].wait(10)
    problems = []
    may_leave["a"].set()
    threads["a"].join(10)
    if not isinstance(ended["a"], LeaseLost):
        problems.append(f"a's exit ended with {ended['a']!r}, not LeaseLost for its own lease")
    status = shared.status()
    if (status.held, status.holder_fence) != (True, fences["b"]):
        problems.append(f"b's lease did not survive a's exit: {status}")
    may_leave["b"].set()
    threads["b"].join(10)
    if ended["b"] is not None:
        problems.append(f"b's exit raised {ended['b']!r}")
    if shared.status().held:
        shared.sync_lock().force_release()
        problems.append("the lock is still held after both left")
    return problems


def test_one_lock_object_shared_by_threads_gives_each_its_own_hold(counter_cache: Any) -> None:
    """A module-level ``cache.fifo_lock()`` object used by many threads, as one
    would use a ``threading.Lock``: each thread's exit releases its own lease,
    also when the leases were forcibly released and granted again meanwhile."""
    assert _two_threads_through_one_object(counter_cache) == []


class _OneSlotLock(CacheFifoLock):
    """MUTANT one-slot-per-object: the object keeps one hold, whoever entered
    it last, so a thread's exit can release another thread's lease (the bug
    before this test)."""

    def __enter__(self) -> Lease:
        hold = self.sync_lock().hold(self.timeout)
        lease = hold.__enter__()
        self._holds[None] = hold
        return lease

    def __exit__(self, *exc: Any) -> bool | None:
        return self._holds.pop(None).__exit__(*exc)  # type: ignore[union-attr]


def test_threads_sharing_one_object_kill_one_slot_per_object(
    counter_cache: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lock_module, "CacheFifoLock", _OneSlotLock)
    assert _two_threads_through_one_object(counter_cache), "one-slot-per-object passed"


async def test_one_lock_object_shared_by_tasks_gives_each_its_own_hold(counter_cache: Any) -> None:
    shared = counter_cache.fifo_lock("shared-tasks", timeout=20)
    fences: list[int] = []

    async def inside() -> None:
        async with shared as lease:
            fences.append(lease.fence)
            await asyncio.sleep(0.05)

    await asyncio.gather(inside(), inside(), inside())
    assert len(fences) == 3 and fences == sorted(fences)
    assert not (await shared.astatus()).held


async def _left_in_another_task(cache: Any) -> list[str]:
    """An ``async with`` inside an async generator is left by whichever task
    closes the generator, and ``wait_for`` enters in a task of its own on
    Python 3.10 and 3.11: what went wrong (with one user of the object, the
    exit must release)."""
    lock = cache.fifo_lock("across-tasks", timeout=5)
    problems = []

    async def holding() -> AsyncIterator[int]:
        async with lock as lease:
            yield lease.fence

    held = holding()
    await asyncio.create_task(held.__anext__())  # entered in one task...
    with contextlib.suppress(LockUsageError):
        await asyncio.create_task(held.aclose())  # ...left in another
    if (await lock.astatus()).held:
        problems.append("the generator's block left the lock held")
        await lock.async_lock().force_release()

    await asyncio.wait_for(lock.__aenter__(), 5)
    with contextlib.suppress(LockUsageError):
        await lock.__aexit__(None, None, None)
    if (await lock.astatus()).held:
        problems.append("the block entered through wait_for left the lock held")
        await lock.async_lock().force_release()
    if lock._holds:
        problems.append(f"{len(lock._holds)} holds kept after every block was left")
        lock._holds.clear()
    return problems


async def test_an_async_with_entered_and_left_in_different_tasks_releases(
    counter_cache: Any,
) -> None:
    assert await _left_in_another_task(counter_cache) == []


def _own_hold_only(self: CacheFifoLock, inside: object, kind: type) -> Any:
    """MUTANT own-hold-only: a block's exit finds only a hold its own thread or
    task entered, so one left in another task releases nothing (the bug in
    7cd9802)."""
    return self._holds.pop(inside, None)


async def test_blocks_left_in_another_task_kill_own_hold_only(
    counter_cache: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(CacheFifoLock, "_leaving", _own_hold_only)
    assert await _left_in_another_task(counter_cache), "own-hold-only passed"


# --- connections ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "options"),
    [
        ("django-redis", {"IGNORE_EXCEPTIONS": True, "SOCKET_CONNECT_TIMEOUT": 1}),
        ("builtin", {"socket_connect_timeout": 1}),
    ],
)
def test_an_unreachable_redis_raises_even_where_the_cache_fails_open(
    backend: str, options: dict[str, Any]
) -> None:
    dead = {
        "default": {
            "BACKEND": project.BACKENDS[backend],
            "LOCATION": "redis://127.0.0.1:1/0",
            "OPTIONS": options,
        }
    }
    with override_settings(CACHES=dead):
        cache = caches["default"]
        if backend == "django-redis":
            assert cache.get("anything", "fallback") == "fallback"  # the cache fails open...
        with pytest.raises(RedisUnavailable), cache.fifo_lock("x", timeout=1):  # ...never the lock
            pass
        with pytest.raises(RedisUnavailable):
            async_to_sync(cache.fifo_lock("x", timeout=1).aacquire)()


def test_django_redis_connection_settings_come_from_location_and_options() -> None:
    options = {
        "USERNAME": "app",
        "PASSWORD": "s3cret",
        "SOCKET_TIMEOUT": 5,
        "SOCKET_CONNECT_TIMEOUT": 2,
        "IGNORE_EXCEPTIONS": True,
        "CONNECTION_POOL_KWARGS": {"max_connections": 20, "connection_class": Connection},
    }
    connection = cache.connection_settings("redis://primary:6379/4,redis://replica:6379/4", options)

    assert connection == LockServer.server(
        "redis://primary:6379/4",
        username="app",
        password="s3cret",
        socket_timeout=5,
        socket_connect_timeout=2,
        max_connections=20,
    )
    assert cache.connection_settings(["redis://a/1", "redis://b/1"], {}).urls == ("redis://a/1",)


def test_builtin_connection_settings_are_its_pool_options_less_the_sync_only_ones() -> None:
    options = {
        "db": 4,
        "password": "s3cret",
        "socket_timeout": 5,
        "max_connections": 20,
        "serializer": "django.core.cache.backends.redis.RedisSerializer",
        "parser_class": "redis.connection.DefaultParser",
        "pool_class": "redis.BlockingConnectionPool",
    }
    connection = builtin.connection_settings("redis://primary:6379;redis://replica:6379", options)

    assert connection == LockServer.server(
        "redis://primary:6379", db=4, password="s3cret", socket_timeout=5, max_connections=20
    )
    assert builtin.connection_settings(["redis://a", "redis://b"], {}) == LockServer.server(
        "redis://a"
    )


@pytest.mark.parametrize(
    ("backend", "options"),
    [
        ("django-redis", {"CONNECTION_POOL_KWARGS": {"ssl_cert_reqs": "none"}}),
        ("builtin", {"ssl_cert_reqs": "none"}),
    ],
)
def test_a_rediss_location_gives_the_lock_tls_connections_with_the_cache_s_ssl_options(
    backend: str, options: dict[str, Any]
) -> None:
    tls = {
        "default": {
            "BACKEND": project.BACKENDS[backend],
            "LOCATION": "rediss://cache.example:6380/2",
            "OPTIONS": options,
        }
    }

    async def pool_of_the_lock() -> tuple[type, dict[str, Any]]:
        pool = caches["default"].fifo_lock_clients.client().connection_pool
        return pool.connection_class, pool.connection_kwargs

    with override_settings(CACHES=tls):
        connection_class, kwargs = asyncio.run(pool_of_the_lock())  # builds, never connects
    assert issubclass(connection_class, SSLConnection)
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("cache.example", 6380, 2)
    assert kwargs["ssl_cert_reqs"] == "none"


def test_backend_instances_with_the_same_settings_share_one_connection_source(
    counter_cache: Any,
) -> None:
    in_thread: list[Any] = []
    worker = threading.Thread(target=lambda: in_thread.append(caches["default"]))
    worker.start()
    worker.join()

    assert in_thread[0] is not counter_cache  # Django made a backend per thread...
    assert in_thread[0].fifo_lock_clients is counter_cache.fifo_lock_clients  # ...not clients
    assert "fifo_lock_clients" not in vars(counter_cache)


def test_the_lock_uses_the_database_in_location(
    any_backend: str, redis_url: str, redis: Redis
) -> None:
    with (
        override_settings(CACHES=project.caches_for(url_with_db(redis_url, 5), any_backend)),
        caches["default"].fifo_lock("reports"),
    ):
        pass
    db5 = Redis.from_url(url_with_db(redis_url, 5))
    try:
        assert db5.exists("tests:fifolock:{tests:3:reports}:counters")
        assert not redis.exists("tests:fifolock:{tests:3:reports}:counters")
    finally:
        db5.close()


@pytest.mark.parametrize(
    ("backend", "options"),
    [("django-redis", {"PASSWORD": "s3cret"}), ("builtin", {"password": "s3cret", "db": 2})],
)
async def test_the_lock_uses_the_credentials_in_options(
    fresh_redis_server: PrivateRedisFactory, backend: str, options: dict[str, Any]
) -> None:
    server = fresh_redis_server(["--requirepass", "s3cret"])
    location = server.url.rsplit("/", 1)[0] if "db" in options else server.url
    caches_setting = project.caches_for(location, backend)
    caches_setting["default"]["OPTIONS"] = options

    def hold_in_sync_code() -> Lease:
        with caches["default"].fifo_lock("reports") as lease:
            return lease

    with override_settings(CACHES=caches_setting):
        async with caches["default"].fifo_lock("reports") as async_lease:
            pass
        sync_lease = await asyncio.to_thread(hold_in_sync_code)
    assert 0 < async_lease.fence < sync_lease.fence
    check = Redis(host=server.host, port=server.port, password="s3cret", db=options.get("db", 0))
    try:
        last = check.hget("tests:fifolock:{tests:3:reports}:counters", "fence")
        assert int(last or 0) == sync_lease.fence
    finally:
        check.close()


@pytest.mark.parametrize(
    ("options_password", "pool_password"), [("wrong", "s3cret"), ("s3cret", "wrong")]
)
def test_the_lock_logs_in_with_the_password_the_django_redis_cache_uses(
    fresh_redis_server: PrivateRedisFactory, options_password: str, pool_password: str
) -> None:
    """django-redis lets ``CONNECTION_POOL_KWARGS`` win over ``PASSWORD``: the
    lock must reach the server exactly when the cache does."""
    server = fresh_redis_server(["--requirepass", "s3cret"])
    caches_setting = project.caches_for(server.url, "django-redis")
    caches_setting["default"]["OPTIONS"] = {
        "PASSWORD": options_password,
        "CONNECTION_POOL_KWARGS": {"password": pool_password},
    }
    with override_settings(CACHES=caches_setting):
        cache_works = True
        try:
            caches["default"].get("anything")
        except Exception:
            cache_works = False
        lock_works = True
        try:
            with caches["default"].fifo_lock("reports", timeout=5):
                pass
        except RedisUnavailable:
            lock_works = False
    assert (cache_works, lock_works) == (pool_password == "s3cret",) * 2


def test_lock_cache_names_the_setting_to_fix_for_a_cache_without_fifo_lock() -> None:
    locmem = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    assert isinstance(lock_cache(), SupportsFifoLock)
    with pytest.raises(ImproperlyConfigured, match=r"FIFOLOCK\['CACHE'\]"):
        lock_cache("missing")
    with (
        override_settings(CACHES=locmem),
        pytest.raises(ImproperlyConfigured, match=r"set CACHES\['default'\]\['BACKEND'\]"),
    ):
        lock_cache()


def test_shared_clients_are_one_per_configuration() -> None:
    first = LockServer.server("redis://127.0.0.1:1/0", socket_timeout=1).clients()
    again = LockServer.server("redis://127.0.0.1:1/0", socket_timeout=1)
    other = LockServer.server("redis://127.0.0.1:1/0", socket_timeout=2)
    assert again.clients() is first
    assert other.clients() is not first


# --- FIFOLOCK setting ------------------------------------------------------------------


def test_fifolock_setting_is_read_each_time_a_lock_is_made(counter_cache: Any) -> None:
    assert counter_cache.fifo_lock("x").settings == LockSettings(600, 100, 1_800_000)
    with override_settings(FIFOLOCK={"LEASE_MS": 2000, "POLL_MS": 500, "MAX_HOLD_MS": 4000}):
        assert counter_cache.fifo_lock("x").settings == LockSettings(2000, 500, 4000)
    with override_settings(FIFOLOCK={}):
        assert counter_cache.fifo_lock("x").settings == LockSettings()
    assert counter_cache.fifo_lock("x", lease_ms=1000).settings == LockSettings(1000, 100)
    with override_settings(FIFOLOCK={"REPLICAS": 2, "REPLICA_WAIT_MS": 300}):
        replicated = LockSettings(replicas=2, replica_wait_ms=300)
        assert counter_cache.fifo_lock("x").settings == replicated
        assert counter_cache.fifo_lock("x", replicas=0).settings.replicas == 0


def test_replicas_from_fifolock_reach_the_core_in_sync_code(any_backend: str) -> None:
    # The session's server has no replica to acknowledge a grant: the setting
    # must reach the core (NotReplicated), not be dropped on the way (a grant).
    with override_settings(FIFOLOCK={**project.FIFOLOCK, "REPLICAS": 1}):
        lock = caches["default"].fifo_lock("replicated", timeout=5)
    with pytest.raises(NotReplicated) as info:
        lock.acquire()
    assert (info.value.replicas, info.value.acknowledged) == (1, 0)
    assert not lock.status().held


async def test_replicas_given_to_fifo_lock_reach_the_core_in_async_code(any_backend: str) -> None:
    lock = caches["default"].fifo_lock("replicated", timeout=5, replicas=1, replica_wait_ms=50)
    entered = False
    with pytest.raises(NotReplicated):
        async with lock:
            entered = True
    assert not entered
    assert not (await lock.astatus()).held


def test_pytest_django_s_settings_fixture_changes_the_lock_settings(
    counter_cache: Any, settings: Any
) -> None:
    settings.FIFOLOCK = {"LEASE_MS": 3000, "POLL_MS": 1000}
    assert counter_cache.fifo_lock("x").settings == LockSettings(3000, 1000)
    settings.FIFOLOCK = {**settings.FIFOLOCK, "CACHE": "missing"}
    with pytest.raises(ImproperlyConfigured, match="'missing'"):
        lock_cache()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            {"LEASE_MS": 600, "POLL_MS": 400},
            "FIFOLOCK['POLL_MS'] (400) must be at most half of FIFOLOCK['LEASE_MS'] (600)",
        ),
        (
            {"LEASE_MS": 1.5},
            "FIFOLOCK['LEASE_MS'] must be a whole number of milliseconds (int), got float: 1.5",
        ),
        ({"MAX_HOLD_MS": True}, "FIFOLOCK['MAX_HOLD_MS'] must be a whole number"),
        ({"REPLICAS": -1}, "FIFOLOCK['REPLICAS'] must be 0 or more, got -1"),
        ({"REPLICAS": 2**63}, "FIFOLOCK['REPLICAS'] must be at most 1000, got 922337"),
        ({"REPLICAS": 1.0}, "FIFOLOCK['REPLICAS'] must be a whole number (int), got float"),
        (
            {"LEASE_MS": 600, "POLL_MS": 100, "REPLICA_WAIT_MS": 300},
            "FIFOLOCK['REPLICA_WAIT_MS'] (300) must be at most a third of "
            "FIFOLOCK['LEASE_MS'] (600)",
        ),
        ({"REPLICA_WAIT_MS": "50"}, "FIFOLOCK['REPLICA_WAIT_MS'] must be a whole number"),
        ({"LEASE": 600}, "FIFOLOCK has unknown key(s) ['LEASE']"),
        ({"CACHE": ""}, "FIFOLOCK['CACHE'] must be the alias (str) of a cache"),
        ([("LEASE_MS", 600)], "FIFOLOCK must be a dict"),
    ],
)
def test_an_invalid_fifolock_setting_is_refused_naming_the_setting(
    counter_cache: Any, value: object, message: str
) -> None:
    with override_settings(FIFOLOCK=value), pytest.raises(ImproperlyConfigured) as info:
        counter_cache.fifo_lock("x")
    assert str(info.value).startswith(message)
