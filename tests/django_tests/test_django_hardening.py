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
