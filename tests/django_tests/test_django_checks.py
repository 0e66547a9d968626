"""System checks ``fifolock.*``: settings always, the lock servers with ``--deploy``.

Each test compares the complete list of ``fifolock.*`` messages. The deploy
checks talk to real servers: the session's, private ones started with an
evicting policy or with ``CONFIG`` disabled, and an address nobody listens on.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import CheckMessage, Error, Tags, Warning, run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings
from django_app import settings as project
from redis import Redis

from redis_fifo_lock.testing import PrivateRedisFactory

pytestmark = pytest.mark.filterwarnings("error")

LOCMEM = "django.core.cache.backends.locmem.LocMemCache"


def fifolock_messages(deploy: bool = False) -> list[CheckMessage]:
    """The ``fifolock.*`` messages of the ``caches`` checks (with ``--deploy``'s)."""
    messages = run_checks(tags=[Tags.caches], include_deployment_checks=deploy)
    return [m for m in messages if m.id and m.id.startswith("fifolock.")]


def lock_caches(location: str, backend: str = "django-redis", **options: Any) -> dict[str, Any]:
    """A ``CACHES`` setting whose default cache is a lock cache on ``location``."""
    setting = project.caches_for(location, backend)
    setting["default"]["OPTIONS"] = options
    return setting


def test_checks_accept_the_test_project_on_either_backend(any_backend: str) -> None:
    assert fifolock_messages() == []
    assert fifolock_messages(deploy=True) == []


def test_a_cache_that_is_not_redis_is_reported_as_giving_no_lock_across_processes() -> None:
    with override_settings(CACHES={"default": {"BACKEND": LOCMEM}}):
        assert fifolock_messages() == [
            Error(
                f"The FIFO lock cache 'default' uses BACKEND '{LOCMEM}', which is not a Redis "
                "backend: it cannot make locks that exclude other processes (locmem, dummy, "
                "file and database caches give no lock across processes).",
                hint="Use a Redis cache with BACKEND 'fifolock_django.cache.RedisCache' (for "
                "django_redis.cache.RedisCache) or 'fifolock_django.builtin.RedisCache' (for "
                "django.core.cache.backends.redis.RedisCache) for CACHES['default'], or point "
                "FIFOLOCK['CACHE'] at one.",
                id="fifolock.E001",
            )
        ]


@pytest.mark.parametrize(
    ("backend", "ours"),
    [
        ("django_redis.cache.RedisCache", "fifolock_django.cache.RedisCache"),
        ("django.core.cache.backends.redis.RedisCache", "fifolock_django.builtin.RedisCache"),
    ],
)
def test_a_redis_cache_without_fifo_lock_is_pointed_at_its_lock_backend(
    redis_url: str, backend: str, ours: str
) -> None:
    with override_settings(CACHES={"default": {"BACKEND": backend, "LOCATION": redis_url}}):
        assert fifolock_messages() == [
            Error(
                f"The FIFO lock cache 'default' uses BACKEND '{backend}', which has no "
                "fifo_lock().",
                hint=f"Set CACHES['default']['BACKEND'] to '{ours}': the same backend plus "
                "fifo_lock().",
                id="fifolock.E001",
            )
        ]


def test_checks_report_each_misconfigured_setting(redis_url: str) -> None:
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


def test_replicas_on_a_redis_cluster_cache_are_reported_naming_the_setting() -> None:
    cluster = lock_caches("redis://n1.example:7000", FIFOLOCK_CLUSTER=True)
    with override_settings(CACHES=cluster, FIFOLOCK={"REPLICAS": 1}):
        assert fifolock_messages() == [
            Error(
                "Cache 'default' cannot make FIFO locks with FIFOLOCK['REPLICAS']: "
                "FIFOLOCK['REPLICAS'] is 1, but the lock is on a Redis Cluster (Redis Cluster "
                "redis://n1.example:7000), where a lock cannot wait for replicas (WAIT cannot "
                "follow the lock's script on its connection there); set it to 0, or pass "
                "replicas=0 to this cache's fifo_lock() calls.",
                hint="Set FIFOLOCK['REPLICAS'] to 0, or pass replicas=0 to every fifo_lock() "
                "on cache 'default'.",
                id="fifolock.E007",
            )
        ]
    with override_settings(CACHES=cluster):
        assert fifolock_messages() == []


def test_sentinels_without_the_sentinel_connection_factory_are_reported(redis_url: str) -> None:
    sentinel = lock_caches(redis_url, SENTINELS=[("127.0.0.1", 26379)])
    with override_settings(CACHES=sentinel):
        [message] = fifolock_messages(deploy=True)
    assert message.id == "fifolock.E004"
    assert "OPTIONS['SENTINELS']" in message.msg


# --- --deploy: the servers ----------------------------------------------------------------


def test_deploy_reports_an_eviction_policy_that_can_evict_lock_keys(
    fresh_redis_server: PrivateRedisFactory,
) -> None:
    server = fresh_redis_server(["--maxmemory-policy", "volatile-lru"])
    with override_settings(CACHES=lock_caches(server.url, "builtin")):
        assert fifolock_messages() == []  # only with --deploy
        assert fifolock_messages(deploy=True) == [
            Error(
                f"The Redis server of cache 'default' ({server.url}) has maxmemory-policy "
                "'volatile-lru', which can evict FIFO lock keys: a held lock would be freed "
                "silently and the fence counter could go back.",
                hint="Set maxmemory-policy to 'noeviction' on that server (redis.conf or CONFIG "
                "SET), or give the locks a Redis server of their own in a separate cache and "
                "point FIFOLOCK['CACHE'] at it.",
                id="fifolock.E005",
            )
        ]


def test_deploy_reports_an_unreachable_server() -> None:
    dead = lock_caches("redis://:s3cret@127.0.0.1:1/0", SOCKET_CONNECT_TIMEOUT=1)
    with override_settings(CACHES=dead):
        [message] = fifolock_messages(deploy=True)
    assert message.id == "fifolock.E006"
    assert message.msg.startswith(
        "The Redis server of cache 'default' (redis://:***@127.0.0.1:1/0) cannot be reached: "
    )
    assert message.msg.endswith(".") and not message.msg.endswith("..")
    assert message.hint == (
        "Check CACHES['default']['LOCATION'] and ['OPTIONS'] (address, credentials, TLS) and "
        "that the server is running; until it can be reached, every FIFO lock raises "
        "RedisUnavailable."
    )


def test_deploy_reports_wrong_credentials_as_unreachable(
    fresh_redis_server: PrivateRedisFactory,
) -> None:
    server = fresh_redis_server(["--requirepass", "s3cret"])
    with override_settings(CACHES=lock_caches(server.url, PASSWORD="wrong")):
        [message] = fifolock_messages(deploy=True)
    assert message.id == "fifolock.E006"


def test_deploy_warns_when_the_server_hides_its_eviction_policy(
    fresh_redis_server: PrivateRedisFactory,
) -> None:
    server = fresh_redis_server(["--rename-command", "CONFIG", ""])
    with override_settings(CACHES=lock_caches(server.url)):
        [message] = fifolock_messages(deploy=True)
    assert isinstance(message, Warning)
    assert message.id == "fifolock.W001"
    assert message.msg.startswith(
        f"The Redis server of cache 'default' ({server.url}) refuses CONFIG GET maxmemory-policy"
    )
    assert message.msg.endswith("so it is unknown whether it can evict FIFO lock keys.")


def test_manage_py_check_deploy_fails_on_an_evicting_server(
    fresh_redis_server: PrivateRedisFactory,
) -> None:
    server = fresh_redis_server(["--maxmemory-policy", "allkeys-lru"])
    with override_settings(CACHES=lock_caches(server.url)):
        call_command("check", tags=["caches"])
        with pytest.raises(SystemCheckError, match=r"fifolock\.E005"):
            call_command("check", "--deploy", tags=["caches"])


@pytest.mark.parametrize(
    ("backend", "options", "option"),
    [
        ("django-redis", {"SOCKET_TIMEOUT": "5"}, "['OPTIONS']['SOCKET_TIMEOUT']"),
        # django-redis takes a false value for no timeout; the lock refuses it.
        ("django-redis", {"SOCKET_TIMEOUT": 0}, "['OPTIONS']['SOCKET_TIMEOUT']"),
        ("django-redis", {"SOCKET_TIMEOUT": False}, "['OPTIONS']['SOCKET_TIMEOUT']"),
        ("django-redis", {"SOCKET_CONNECT_TIMEOUT": 0}, "['OPTIONS']['SOCKET_CONNECT_TIMEOUT']"),
        (
            "django-redis",
            {"CONNECTION_POOL_KWARGS": {"socket_timeout": "abc"}},
            "['OPTIONS']['CONNECTION_POOL_KWARGS']['socket_timeout']",
        ),
        ("builtin", {"socket_timeout": "5"}, "['OPTIONS']['socket_timeout']"),
        ("builtin", {"socket_connect_timeout": -1}, "['OPTIONS']['socket_connect_timeout']"),
        ("builtin", {"socket_timeout": 0}, "['OPTIONS']['socket_timeout']"),
    ],
)
def test_a_socket_timeout_that_is_no_number_of_seconds_fails_the_checks(
    redis_url: str, backend: str, options: dict[str, Any], option: str
) -> None:
    with override_settings(CACHES=lock_caches(redis_url, backend, **options)):
        [message] = fifolock_messages()
        with pytest.raises(SystemCheckError, match=r"fifolock\.E004"):
            call_command("check", tags=["caches"])
    assert message.id == "fifolock.E004"
    assert isinstance(message, Error)
    assert f"CACHES['default']{option}" in message.msg


@pytest.mark.parametrize("backend", project.BACKENDS)
def test_deploy_reports_a_database_the_server_does_not_have_as_unusable(
    fresh_redis_server: PrivateRedisFactory, backend: str
) -> None:
    server = fresh_redis_server([])  # 16 databases: 0 to 15
    location = f"redis://{server.host}:{server.port}/99"
    with override_settings(CACHES=lock_caches(location, backend)):
        [message] = fifolock_messages(deploy=True)
        with pytest.raises(SystemCheckError, match=r"fifolock\.E006"):
            call_command("check", "--deploy", tags=["caches"])
    assert isinstance(message, Error)
    assert message.id == "fifolock.E006"
    assert message.msg.startswith(f"The Redis server of cache 'default' ({location}) ")
    assert "DB index is out of range" in message.msg
    assert "CONFIG GET" not in message.msg


def test_deploy_still_warns_when_an_acl_refuses_config_get(
    fresh_redis_server: PrivateRedisFactory,
) -> None:
    server = fresh_redis_server([])
    with Redis.from_url(server.url) as admin:
        admin.acl_setuser(
            "locker",
            enabled=True,
            passwords=["+pw"],
            keys=["*"],
            channels=["*"],
            commands=["+@all", "-config"],
        )
    location = f"redis://locker:pw@{server.host}:{server.port}/0"
    with override_settings(CACHES=lock_caches(location)):
        [message] = fifolock_messages(deploy=True)
    assert isinstance(message, Warning)
    assert message.id == "fifolock.W001"
    assert "pw@" not in message.msg


@pytest.mark.parametrize(
    ("backend", "options"),
    [
        ("django-redis", {"CONNECTION_POOL_KWARGS": {"max_connections": 2}}),
        ("builtin", {"max_connections": 4}),
    ],
)
def test_a_pool_too_small_for_a_lock_fails_the_checks(
    redis_url: str, backend: str, options: dict[str, Any]
) -> None:
    """With ``max_connections`` 1, a lock's release never went through (the
    doorbell held the one connection), yet the checks passed."""
    with override_settings(CACHES=lock_caches(redis_url, backend, **options)):
        [message] = fifolock_messages()
    assert message.id == "fifolock.E004"
    assert "max_connections" in message.msg and "needs 5 connections" in message.msg
