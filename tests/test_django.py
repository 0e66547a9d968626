"""The Django integration: ``cache.fifo_lock``, ``fifo_locked_command``, settings, checks.

Everything runs against the session's real Redis (``redis_url``) through a small
Django project in ``tests/django_app``: Django's test clients for the views,
``python -m django`` subprocesses for the management command. Overlaps and lost
updates are judged from a record kept apart from the lock's keys
(``django_app.record``).

Django is configured by the module fixture ``django_project`` (with
``settings.configure`` if nobody did it before, else ``override_settings``), not
through ``DJANGO_SETTINGS_MODULE``, so collecting or running the other test
modules never involves Django.
"""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

pytest.importorskip("django_redis")

import django
from asgiref.sync import async_to_sync
from django.conf import settings
from django.core.cache import caches
from django.core.checks import Error, Tags, run_checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.test import AsyncClient, Client, override_settings
from redis import Redis

from fifolock_django.cache import connection_settings
from fifolock_django.commands import fifo_locked_command
from fifolock_django.lock import SupportsFifoLock, lock_cache
from redis_fifo_lock import (
    Lease,
    LockSettings,
    LockTimeout,
    LockUsageError,
    RedisUnavailable,
)
from redis_fifo_lock.testing import PrivateRedisFactory

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

from django_app import record  # noqa: E402
from django_app import settings as project  # noqa: E402
from django_app.management.commands.locked_job import ENTERED, JOB_LOCK  # noqa: E402

REQUESTS = 8
"""Concurrent requests per scenario; each holds the lock for HOLD_S."""
HOLD_S = 0.3
"""Seconds of work under the lock: three polls (POLL_MS is 100) and a renewal."""
WAIT_S = 20.0
"""Upper bound on any wait for another process, in seconds."""


def project_settings(redis_url: str) -> dict[str, Any]:
    """The test project's settings, with its caches on ``redis_url``."""
    values = {name: getattr(project, name) for name in dir(project) if name.isupper()}
    values["CACHES"] = project.caches_for(redis_url)
    return values


@pytest.fixture(scope="module", autouse=True)
def django_project(redis_url: str) -> Iterator[None]:
    """Django set up with ``tests/django_app``'s settings for this module."""
    values = project_settings(redis_url)
    if not settings.configured:
        settings.configure(**values)
        django.setup()
        yield
        return
    django.setup()
    with override_settings(**values):
        yield


@pytest.fixture
def counter_cache(redis: Redis) -> Any:
    """The default cache, on an empty Redis (``redis`` flushes it)."""
    return caches["default"]


def url_with_db(url: str, db: int) -> str:
    """``url`` pointing at database ``db``."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{db}"))


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Poll ``condition`` (for states that announce themselves by no event)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


def assert_served_one_at_a_time(redis: Redis, requests: int) -> list[dict[str, Any]]:
    """No overlap, no lost update, grants in arrival (ticket) order."""
    holds = record.holds(redis)
    assert len(holds) == requests
    fences = [hold["fence"] for hold in holds]
    tickets = [hold["ticket"] for hold in holds]
    assert fences == sorted(set(fences))
    assert tickets == sorted(set(tickets))
    assert caches["default"].get("counter") == requests
    return holds


def get_json(client: Client, path: str) -> dict[str, Any]:
    response = client.get(path)
    assert response.status_code == 200, response.content
    data: dict[str, Any] = response.json()
    return data


# --- views -----------------------------------------------------------------------------


def test_sync_view_requests_from_many_threads_lose_no_update_and_never_overlap(
    counter_cache: Any, redis: Redis
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
    counter_cache: Any, redis: Redis
) -> None:
    client = AsyncClient()
    responses = await asyncio.gather(
        *(client.get(f"/async/?hold={HOLD_S}") for _ in range(REQUESTS))
    )

    assert [r.status_code for r in responses] == [200] * REQUESTS
    holds = assert_served_one_at_a_time(redis, REQUESTS)
    assert sorted(r.json()["value"] for r in responses) == list(range(1, REQUESTS + 1))
    assert {hold["who"] for hold in holds} == {"async"}


async def test_sync_and_async_views_mixed_are_served_one_at_a_time(
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


# --- cache.fifo_lock -------------------------------------------------------------------


def test_lock_keys_carry_the_cache_key_prefix_and_version(counter_cache: Any, redis: Redis) -> None:
    with counter_cache.fifo_lock("reports") as lease:
        held_keys = {key.decode() for key in redis.keys("fifolock:*")}
    with counter_cache.fifo_lock("reports", version=7) as other_version:
        pass

    assert lease.name == "tests:3:reports"
    assert "fifolock:{tests:3:reports}:lease" in held_keys
    assert all(key.startswith("fifolock:{tests:3:reports}:") for key in held_keys)
    assert other_version.name == "tests:7:reports"
    assert redis.exists("fifolock:{tests:7:reports}:fences")


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


def test_a_key_prefix_with_braces_is_refused_naming_key_prefix(redis_url: str) -> None:
    caches_setting = project.caches_for(redis_url)
    caches_setting["default"]["KEY_PREFIX"] = "shop{eu}"
    with override_settings(CACHES=caches_setting), pytest.raises(ImproperlyConfigured) as info:
        caches["default"].fifo_lock("reports")

    message = str(info.value)
    assert "KEY_PREFIX" in message and "'shop{eu}:3:reports'" in message


def test_a_bad_name_or_timeout_is_refused_before_any_io(counter_cache: Any) -> None:
    with pytest.raises(ValueError, match="contains"):
        counter_cache.fifo_lock("a{b}")
    with pytest.raises(ValueError, match="timeout"):
        counter_cache.fifo_lock("reports", timeout=-1)
    with pytest.raises(ValueError, match="poll_ms"):
        counter_cache.fifo_lock("reports", poll_ms=400)


def test_a_busy_lock_times_out_in_sync_code_naming_the_holder_fence(counter_cache: Any) -> None:
    with (
        counter_cache.fifo_lock("busy") as held,
        pytest.raises(LockTimeout) as info,
        counter_cache.fifo_lock("busy", timeout=0.3),
    ):
        pass
    assert info.value.holder_fence == held.fence
    assert info.value.waited >= 0.3


async def test_a_busy_lock_times_out_in_async_code_naming_the_holder_fence(
    counter_cache: Any,
) -> None:
    async with counter_cache.fifo_lock("busy") as held:
        with pytest.raises(LockTimeout) as info:
            async with counter_cache.fifo_lock("busy", timeout=0.3):
                pass
    assert info.value.holder_fence == held.fence


async def test_sync_with_on_a_thread_running_an_event_loop_is_refused(counter_cache: Any) -> None:
    with pytest.raises(LockUsageError, match="async with"), counter_cache.fifo_lock("x"):
        pass


def test_one_lock_object_serves_one_with_at_a_time(counter_cache: Any) -> None:
    lock = counter_cache.fifo_lock("x")
    with lock, pytest.raises(LockUsageError, match="already entered"), lock:
        pass
    with lock as lease:  # reusable once left
        assert not lease.lost


def test_redis_errors_reach_the_caller_even_with_ignore_exceptions(counter_cache: Any) -> None:
    dead = {
        "default": {
            "BACKEND": "fifolock_django.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
            "OPTIONS": {"IGNORE_EXCEPTIONS": True, "SOCKET_CONNECT_TIMEOUT": 1},
        }
    }
    with override_settings(CACHES=dead):
        cache = caches["default"]
        assert cache.get("anything", "fallback") == "fallback"  # the cache fails open...
        with pytest.raises(RedisUnavailable), cache.fifo_lock("x", timeout=1):  # ...the lock not
            pass


def test_connection_settings_come_from_location_and_options() -> None:
    options = {
        "USERNAME": "app",
        "PASSWORD": "s3cret",
        "SOCKET_TIMEOUT": 5,
        "SOCKET_CONNECT_TIMEOUT": 2,
        "IGNORE_EXCEPTIONS": True,
        "CONNECTION_POOL_KWARGS": {"max_connections": 20, "connection_class": object},
    }
    url, kwargs = connection_settings("redis://primary:6379/4,redis://replica:6379/4", options)

    assert url == "redis://primary:6379/4"
    assert kwargs == {
        "username": "app",
        "password": "s3cret",
        "socket_timeout": 5,
        "socket_connect_timeout": 2,
        "max_connections": 20,
    }
    with pytest.raises(ImproperlyConfigured, match="Sentinel"):
        connection_settings("redis://mymaster/0", {"SENTINELS": [("localhost", 26379)]})


def test_the_lock_uses_the_database_in_location(redis_url: str, redis: Redis) -> None:
    with (
        override_settings(CACHES=project.caches_for(url_with_db(redis_url, 5))),
        caches["default"].fifo_lock("reports"),
    ):
        pass
    db5 = Redis.from_url(url_with_db(redis_url, 5))
    try:
        assert db5.exists("fifolock:{tests:3:reports}:fences")
        assert not redis.exists("fifolock:{tests:3:reports}:fences")
    finally:
        db5.close()


async def test_the_lock_uses_the_password_in_options(
    fresh_redis_server: PrivateRedisFactory,
) -> None:
    server = fresh_redis_server(["--requirepass", "s3cret"])
    caches_setting = project.caches_for(server.url)
    caches_setting["default"]["OPTIONS"] = {"PASSWORD": "s3cret"}

    def hold_in_sync_code() -> Lease:
        with caches["default"].fifo_lock("reports") as lease:
            return lease

    with override_settings(CACHES=caches_setting):
        async with caches["default"].fifo_lock("reports") as async_lease:
            pass
        sync_lease = await asyncio.to_thread(hold_in_sync_code)
    assert (async_lease.fence, sync_lease.fence) == (1, 2)


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


# --- FIFOLOCK setting ------------------------------------------------------------------


def test_fifolock_setting_is_read_each_time_a_lock_is_made(counter_cache: Any) -> None:
    assert counter_cache.fifo_lock("x").settings == LockSettings(600, 100, 1_800_000)
    with override_settings(FIFOLOCK={"LEASE_MS": 2000, "POLL_MS": 500, "MAX_HOLD_MS": 4000}):
        assert counter_cache.fifo_lock("x").settings == LockSettings(2000, 500, 4000)
    with override_settings(FIFOLOCK={}):
        assert counter_cache.fifo_lock("x").settings == LockSettings()
    assert counter_cache.fifo_lock("x", lease_ms=1000).settings == LockSettings(1000, 100)


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


# --- connections and event loops -------------------------------------------------------


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("error::ResourceWarning")
def test_many_async_to_sync_calls_leak_no_connection_and_no_closed_loop(
    counter_cache: Any, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    fences: list[int] = []

    async def contended() -> None:
        # Three tasks on this call's fresh loop: two of them queue, which opens
        # the doorbell subscription and starts the poller.
        async def one() -> None:
            async with caches["default"].fifo_lock("loops") as lease:
                fences.append(lease.fence)
                await asyncio.sleep(0)

        await asyncio.gather(one(), one(), one())

    def connections() -> int:
        return len(redis.client_list())

    run = async_to_sync(contended)
    run()  # the first call may create what later calls reuse (the Hub's scripts...)
    clients = counter_cache.fifo_lock_clients
    loops_before, baseline = len(clients), connections()
    for _ in range(30):
        run()
    gc.collect()

    wait_until(lambda: connections() <= baseline, "the server to drop closed connections", 5)
    assert connections() == baseline
    assert len(clients) == loops_before
    assert fences == list(range(1, 3 * 31 + 1))
    assert not [r for r in caplog.records if "Event loop is closed" in r.getMessage()]


# --- fifo_locked_command ---------------------------------------------------------------


def manage(redis_url: str, *args: str) -> subprocess.Popen[str]:
    """Start ``python -m django locked_job ARGS`` on the test project."""
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="django_app.settings",
        FIFOLOCK_TEST_REDIS_URL=redis_url,
        PYTHONPATH=os.pathsep.join(
            [str(TESTS_DIR), str(TESTS_DIR.parent), env.get("PYTHONPATH", "")]
        ),
    )
    return subprocess.Popen(
        [sys.executable, "-m", "django", "locked_job", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=WAIT_S)
    return process.returncode, out, err


def wait_entered(redis: Redis, who: str) -> None:
    """Block until run ``who`` announces that it holds the lock."""
    reply = redis.blpop([ENTERED], timeout=WAIT_S)
    assert reply == (ENTERED.encode(), who.encode()), reply


def test_two_command_processes_are_served_one_after_another_in_arrival_order(
    redis_url: str, counter_cache: Any, redis: Redis
) -> None:
    job_lock = counter_cache.fifo_lock(JOB_LOCK).sync_lock()
    first = manage(redis_url, "first", "--hold-until", "go:first")
    wait_entered(redis, "first")
    second = manage(redis_url, "second")
    wait_until(lambda: job_lock.status().waiting == 1, "the second run to queue")
    redis.rpush("go:first", "go")

    assert finish(first)[:2] == (0, "first held fence 1\n")
    assert finish(second)[:2] == (0, "second held fence 2\n")
    holds = record.holds(redis)
    assert [(hold["who"], hold["fence"]) for hold in holds] == [("first", 1), ("second", 2)]
    assert holds[0]["ticket"] < holds[1]["ticket"]


def test_a_command_lock_timeout_exits_non_zero_naming_lock_wait_and_fence(
    redis_url: str, redis: Redis
) -> None:
    holder = manage(redis_url, "holder", "--hold-until", "go:holder")
    wait_entered(redis, "holder")
    late = manage(redis_url, "late", "--lock-timeout", "0.3")
    code, out, err = finish(late)
    redis.rpush("go:holder", "go")

    assert (code, out) == (1, "")
    assert "CommandError: FIFO lock 'nightly-job' (Redis lock 'tests:3:nightly-job') is busy" in err
    assert "not acquired within 0.3 s (waited 0.3" in err
    assert "held by fence 1." in err
    assert finish(holder)[:2] == (0, "holder held fence 1\n")
    assert [hold["who"] for hold in record.holds(redis)] == ["holder"]


def test_no_wait_fails_at_once_with_the_holder_fence(counter_cache: Any, redis: Redis) -> None:
    with counter_cache.fifo_lock(JOB_LOCK) as held, pytest.raises(CommandError) as info:
        call_command("locked_job", "late", no_wait=True)
    assert f"held by fence {held.fence}." in str(info.value)
    assert "within 0 s" in str(info.value)
    assert record.entries(redis) == []


def test_a_locked_command_runs_holding_the_lock_with_its_lease(
    counter_cache: Any, redis: Redis
) -> None:
    call_command("locked_job", "alone", lock_timeout=5)
    call_command("locked_job", "again")

    holds = record.holds(redis)
    assert [(hold["who"], hold["fence"]) for hold in holds] == [("alone", 1), ("again", 2)]
    assert not counter_cache.fifo_lock(JOB_LOCK).sync_lock().status().held


def test_fifo_locked_command_only_decorates_a_command_handle() -> None:
    with pytest.raises(Exception) as info:

        class NotACommand:
            @fifo_locked_command("x")
            def handle(self) -> None:
                pass

    # Python < 3.12 wraps errors of __set_name__ in a RuntimeError.
    error = info.value.__cause__ or info.value
    assert isinstance(error, TypeError)
    assert "NotACommand is not a django BaseCommand" in str(error)


def test_the_decorator_adds_lock_options_next_to_the_command_s_own() -> None:
    class Command(BaseCommand):
        def add_arguments(self, parser: Any) -> None:
            parser.add_argument("--mine")

        @fifo_locked_command("x", timeout=2.5)
        def handle(self, *args: Any, **options: Any) -> None:
            pass

    parser = Command().create_parser("manage.py", "job")
    options = vars(parser.parse_args(["--mine", "1", "--lock-timeout", "4"]))
    assert (options["mine"], options["lock_timeout"], options["no_wait"]) == ("1", 4.0, False)
    assert "default: 2.5 s" in " ".join(parser.format_help().split())
    with pytest.raises(CommandError, match="not allowed with argument"):
        parser.parse_args(["--no-wait", "--lock-timeout", "1"])


# --- system checks ---------------------------------------------------------------------


def fifolock_messages() -> list[Any]:
    return [m for m in run_checks(tags=[Tags.caches]) if m.id.startswith("fifolock.")]


def test_checks_accept_the_test_project() -> None:
    assert fifolock_messages() == []


def test_checks_report_each_misconfiguration(redis_url: str) -> None:
    locmem = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    with override_settings(CACHES=locmem):
        assert fifolock_messages() == [
            Error(
                "The FIFO lock cache 'default' uses BACKEND "
                "'django.core.cache.backends.locmem.LocMemCache', which is not a Redis FIFO "
                "lock backend (it has no fifo_lock()).",
                hint="Set CACHES['default']['BACKEND'] to 'fifolock_django.cache.RedisCache', "
                "or point FIFOLOCK['CACHE'] at a cache that uses it.",
                id="fifolock.E001",
            )
        ]
    with override_settings(FIFOLOCK={"CACHE": "locks"}):
        assert fifolock_messages() == [
            Error(
                "FIFOLOCK['CACHE'] is 'locks', which is not an alias in CACHES.",
                hint="Set FIFOLOCK['CACHE'] to one of ['default'].",
                id="fifolock.E002",
            )
        ]
    with override_settings(FIFOLOCK={"LEASE_MS": 0}):
        assert fifolock_messages() == [
            Error(
                "FIFOLOCK['LEASE_MS'] must be positive, got 0",
                hint="Fix settings.FIFOLOCK.",
                id="fifolock.E003",
            )
        ]
    braces = project.caches_for(redis_url)
    braces["default"]["KEY_PREFIX"] = "{x}"
    with override_settings(CACHES=braces):
        [message] = fifolock_messages()
    assert (message.id, message.hint) == ("fifolock.E004", "Fix CACHES['default'].")
    assert message.msg.startswith("Cache 'default' cannot make FIFO locks: cache.fifo_lock(")
