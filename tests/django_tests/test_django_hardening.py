"""Django lock caches: no password in reprs, names refused with the real limit,
connection settings checked when the backend is built."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from django_app import settings as project
from redis import Redis

from redis_fifo_lock.settings import MAX_NAME_BYTES

SECRET = "dj4ngo-s3cret"


def caches_with(location: object, backend: str, **options: Any) -> dict[str, Any]:
    setting = project.caches_for("redis://unused", backend)
    setting["default"]["LOCATION"] = location
    setting["default"]["OPTIONS"] = options
    return setting


@pytest.mark.parametrize("backend", project.BACKENDS)
def test_the_lock_connection_and_clients_never_show_a_password(backend: str) -> None:
    options = (
        {"PASSWORD": SECRET, "CONNECTION_POOL_KWARGS": {"ssl_password": SECRET}}
        if backend == "django-redis"
        else {"password": SECRET, "ssl_password": SECRET}
    )
    setting = caches_with(f"redis://user:{SECRET}@cache.example:6379/1", backend, **options)
    with override_settings(CACHES=setting):
        cache: Any = caches["default"]
        shown = [
            repr(cache.fifo_lock_connection()),
            cache.fifo_lock_connection().describe(),
            repr(cache.fifo_lock_clients),
            repr(cache.fifo_lock("invoices")),
        ]
    assert all(SECRET not in text for text in shown), shown
    assert all("cache.example" in text for text in shown[:3]), shown


def test_a_sentinel_cache_never_shows_the_sentinels_password() -> None:
    setting = caches_with(
        f"redis://:{SECRET}@mymaster/0",
        "django-redis",
        CONNECTION_FACTORY="django_redis.pool.SentinelConnectionFactory",
        CLIENT_CLASS="django_redis.client.SentinelClient",
        SENTINELS=[("s1.example", 26379)],
        SENTINEL_KWARGS={"password": SECRET},
    )
    with override_settings(CACHES=setting):
        cache: Any = caches["default"]
        shown = repr(cache.fifo_lock_connection()) + repr(cache.fifo_lock_clients)
    assert SECRET not in shown
    assert "mymaster" in shown


def test_the_name_length_error_names_the_real_limit(any_backend: str) -> None:
    cache: Any = caches["default"]
    added = len(cache.make_key("").encode())  # "tests:3:" in the test project
    limit = MAX_NAME_BYTES - added

    with cache.fifo_lock("n" * limit, timeout=5) as lease:
        assert lease.fence > 0
    with pytest.raises(ValueError, match=rf"at most {limit} bytes") as caught:
        cache.fifo_lock("n" * 1022)
    assert "KEY_PREFIX" in str(caught.value)  # says where the other bytes come from
    assert len(str(caught.value)) < 400


def test_an_invisible_character_in_a_name_is_refused_by_code_point(any_backend: str) -> None:
    with pytest.raises(ValueError, match=r"U\+202E"):
        caches["default"].fifo_lock("invoice\u202e42")  # type: ignore[attr-defined]


@pytest.mark.parametrize("backend", project.BACKENDS)
@pytest.mark.parametrize(
    ("location", "error"),
    [
        (f"http://:{SECRET}@cache.example:6379/0", ValueError),
        ("cache.example:6379", ValueError),
        (6379, TypeError),
        (f"redis://:{SECRET}@primary:6379/0,redis://replica:notaport/0", ValueError),
    ],
)
def test_a_location_the_lock_cannot_use_is_refused_when_the_backend_is_built(
    backend: str, location: object, error: type[Exception]
) -> None:
    with (
        override_settings(CACHES=caches_with(location, backend)),
        pytest.raises(ImproperlyConfigured, match="LOCATION") as caught,
    ):
        caches["default"]
    assert isinstance(caught.value.__cause__, error)
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize("backend", project.BACKENDS)
def test_supported_locations_still_build(backend: str, redis_url: str, redis: Redis) -> None:
    for location in (
        redis_url,
        [redis_url],
        "rediss://tls.example:6380/0",
        "unix:///r.sock",
        # A primary and its replicas (or cluster nodes), as the backends take them.
        "redis://primary:6379,redis://replica:6380",
        "redis://primary:6379;redis://replica:6380/0",
    ):
        with override_settings(CACHES=caches_with(location, backend)):
            assert caches["default"] is not None


BAD_TIMEOUTS = [
    # (backend, OPTIONS, the option as the message spells it)
    ("django-redis", {"SOCKET_TIMEOUT": "5"}, "['OPTIONS']['SOCKET_TIMEOUT']"),
    ("django-redis", {"SOCKET_CONNECT_TIMEOUT": -1}, "['OPTIONS']['SOCKET_CONNECT_TIMEOUT']"),
    (
        "django-redis",
        {"CONNECTION_POOL_KWARGS": {"socket_timeout": "abc"}},
        "['OPTIONS']['CONNECTION_POOL_KWARGS']['socket_timeout']",
    ),
    (
        "django-redis",
        {
            "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
            "CLIENT_CLASS": "django_redis.client.SentinelClient",
            "SENTINELS": [("s1.example", 26379)],
            "SENTINEL_KWARGS": {"socket_connect_timeout": "2"},
        },
        "['OPTIONS']['SENTINEL_KWARGS']['socket_connect_timeout']",
    ),
    ("builtin", {"socket_timeout": "5"}, "['OPTIONS']['socket_timeout']"),
    ("builtin", {"socket_timeout": float("nan")}, "['OPTIONS']['socket_timeout']"),
    ("builtin", {"socket_timeout": 1e400}, "['OPTIONS']['socket_timeout']"),
    ("builtin", {"socket_timeout": -1}, "['OPTIONS']['socket_timeout']"),
    ("builtin", {"socket_timeout": 0}, "['OPTIONS']['socket_timeout']"),
    ("builtin", {"socket_timeout": True}, "['OPTIONS']['socket_timeout']"),
    ("builtin", {"socket_connect_timeout": "1"}, "['OPTIONS']['socket_connect_timeout']"),
]


@pytest.mark.parametrize(("backend", "options", "option"), BAD_TIMEOUTS)
def test_a_socket_timeout_that_is_no_positive_number_is_refused_naming_alias_and_option(
    backend: str, options: dict[str, Any], option: str
) -> None:
    # Nothing listens on redis://unused: the refusal comes before anything is sent.
    if backend == "django-redis":
        options = {**options, "PASSWORD": SECRET}
    else:
        options = {**options, "password": SECRET}
    setting = caches_with(f"redis://:{SECRET}@unused:6379/0", backend, **options)
    with override_settings(CACHES=setting):
        cache: Any = caches["default"]
        with pytest.raises(ImproperlyConfigured) as caught:
            cache.fifo_lock("x", timeout=2)
    message = str(caught.value)
    assert f"CACHES['default']{option}" in message, message
    assert "seconds" in message, message
    assert SECRET not in message


@pytest.mark.parametrize(
    ("backend", "options"),
    [
        ("django-redis", {"SOCKET_TIMEOUT": 5, "SOCKET_CONNECT_TIMEOUT": 0.5}),
        ("django-redis", {"CONNECTION_POOL_KWARGS": {"socket_timeout": None}}),
        ("builtin", {"socket_timeout": 2, "socket_connect_timeout": 1.5}),
        ("builtin", {"socket_timeout": None}),
    ],
)
def test_socket_timeouts_in_seconds_still_make_locks(backend: str, options: dict[str, Any]) -> None:
    with override_settings(CACHES=caches_with("redis://unused:6379/0", backend, **options)):
        assert caches["default"].fifo_lock("x", timeout=2) is not None  # type: ignore[attr-defined]
