"""TLS for the locks of both Django backends: every way a cache is configured for TLS
takes the lock over TLS to a real TLS-only redis-server, and none sends AUTH in clear."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from redis.connection import Connection, SSLConnection

from fifolock_django.lock import SupportsFifoLock
from tests.support.tls import (
    TlsRedis,
    assert_only_tls,
    first_bytes,
    private_tls_redis_server,
    recording_listener,
)

BUILTIN = "fifolock_django.builtin.RedisCache"
DJANGO_REDIS = "fifolock_django.cache.RedisCache"


@pytest.fixture(scope="module")
def tls_server() -> Iterator[TlsRedis]:
    """One TLS-only server (password, certificates made for this run) per module."""
    with private_tls_redis_server() as server:
        yield server


def cache_entry(server: TlsRedis, port: int, form: str) -> dict[str, Any]:
    """The ``CACHES['default']`` entry of ``form`` for the TLS server, at ``port``."""
    where = f":{server.password}@127.0.0.1:{port}/0"
    ca = {"ssl_ca_certs": server.ca_file}
    by_class = {"connection_class": SSLConnection, **ca}
    entries: dict[str, dict[str, Any]] = {
        # Django's built-in backend: OPTIONS are redis-py pool kwargs.
        "builtin-rediss": {"BACKEND": BUILTIN, "LOCATION": f"rediss://{where}", "OPTIONS": ca},
        "builtin-rediss-cert-reqs": {
            "BACKEND": BUILTIN,
            "LOCATION": f"rediss://{where}",
            "OPTIONS": {"ssl_cert_reqs": "required", **ca},
        },
        "builtin-connection-class": {
            "BACKEND": BUILTIN,
            "LOCATION": f"redis://{where}",
            "OPTIONS": by_class,
        },
        # django-redis: pool kwargs go in CONNECTION_POOL_KWARGS.
        "django-redis-rediss": {
            "BACKEND": DJANGO_REDIS,
            "LOCATION": f"rediss://{where}",
            "OPTIONS": {"CONNECTION_POOL_KWARGS": ca},
        },
        "django-redis-connection-class": {
            "BACKEND": DJANGO_REDIS,
            "LOCATION": f"redis://{where}",
            "OPTIONS": {"CONNECTION_POOL_KWARGS": by_class},
        },
        # connection_class alone (no ssl_* option): TLS with the system's CAs.
        "builtin-connection-class-only": {
            "BACKEND": BUILTIN,
            "LOCATION": f"redis://{where}",
            "OPTIONS": {"connection_class": SSLConnection},
        },
        "django-redis-connection-class-only": {
            "BACKEND": DJANGO_REDIS,
            "LOCATION": f"redis://{where}",
            "OPTIONS": {"CONNECTION_POOL_KWARGS": {"connection_class": SSLConnection}},
        },
    }
    return {**entries[form], "KEY_PREFIX": "tls"}


FORMS = [
    "builtin-rediss",
    "builtin-rediss-cert-reqs",
    "builtin-connection-class",
    "django-redis-rediss",
    "django-redis-connection-class",
]


def lock_cache() -> SupportsFifoLock:
    cache = caches["default"]
    assert isinstance(cache, SupportsFifoLock)
    return cache


@pytest.mark.parametrize("form", FORMS)
def test_the_cache_and_its_lock_work_over_tls(tls_server: TlsRedis, form: str) -> None:
    with override_settings(CACHES={"default": cache_entry(tls_server, tls_server.port, form)}):
        cache = caches["default"]
        cache.set("greeting", "hello")  # the cache itself speaks TLS
        assert cache.get("greeting") == "hello"
        with lock_cache().fifo_lock("tls", timeout=20) as lease:
            assert lease.fence >= 1


@pytest.mark.parametrize(
    "form", [*FORMS, "builtin-connection-class-only", "django-redis-connection-class-only"]
)
async def test_no_form_sends_auth_in_clear(tls_server: TlsRedis, form: str) -> None:
    with recording_listener() as listener:
        entry = cache_entry(tls_server, listener.port, form)
        with override_settings(CACHES={"default": entry}):
            await first_bytes(listener, lock_cache().fifo_lock("tap", timeout=30).aacquire())
        assert_only_tls(listener, tls_server.password)


@pytest.mark.parametrize(
    ("backend", "options", "setting"),
    [
        (BUILTIN, {"connection_class": "redis.connection.SSLConnection"}, "OPTIONS"),
        (
            DJANGO_REDIS,
            {"CONNECTION_POOL_KWARGS": {"connection_class": object}},
            "CONNECTION_POOL_KWARGS",
        ),
    ],
)
def test_a_connection_class_the_lock_cannot_read_is_refused(
    backend: str, options: dict[str, Any], setting: str
) -> None:
    entry = {"BACKEND": backend, "LOCATION": "redis://127.0.0.1:1/0", "OPTIONS": options}
    with (
        override_settings(CACHES={"default": entry}),
        pytest.raises(ImproperlyConfigured) as caught,
    ):
        lock_cache().fifo_lock("x")
    assert setting in str(caught.value) and "connection_class" in str(caught.value)


@pytest.mark.parametrize("backend", [BUILTIN, DJANGO_REDIS])
def test_a_plain_connection_class_keeps_the_lock_in_clear(backend: str) -> None:
    options: dict[str, Any] = {"connection_class": Connection}
    if backend == DJANGO_REDIS:
        options = {"CONNECTION_POOL_KWARGS": options}
    entry = {"BACKEND": backend, "LOCATION": "redis://127.0.0.1:1/0", "OPTIONS": options}
    with override_settings(CACHES={"default": entry}):
        cache = caches["default"]
        connection = cache.fifo_lock_connection()  # type: ignore[attr-defined]
    assert "ssl" not in connection.kwargs and "connection_class" not in connection.kwargs
