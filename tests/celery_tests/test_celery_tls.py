"""TLS for the locks of a Celery app: every way Celery and kombu configure TLS for a
Redis broker takes the lock over TLS to a real TLS-only redis-server (or through a
sentinel to a TLS master), none sends AUTH in clear, and what the lock cannot follow
is reported by the start checks, naming the setting.

A worker adds nothing here: the lock is built exactly as ``@fifo_locked`` builds it
(``lock_for`` / ``LockServer.clients`` from the app's settings) and taken over TLS.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from redis import Redis

from fifolock_celery import LockConfig, fifo_locked, lock_for, start_warnings
from redis_fifo_lock import FifoLock, LockUsageError
from redis_fifo_lock.testing import PrivateRedis
from tests.support.tls import (
    TlsRedis,
    assert_only_tls,
    first_bytes,
    private_tls_redis_server,
    private_tls_sentinel,
    recording_listener,
)

SERVICE = "tlsmaster"


@pytest.fixture(scope="module")
def tls_server() -> Iterator[TlsRedis]:
    """One TLS-only server (password, certificates made for this run) per module."""
    with private_tls_redis_server() as server:
        yield server


@pytest.fixture(scope="module")
def tls_sentinel(tls_server: TlsRedis) -> Iterator[PrivateRedis]:
    """A sentinel watching ``tls_server`` (over TLS) as ``SERVICE``."""
    with private_tls_sentinel(tls_server, SERVICE) as sentinel:
        yield sentinel


def app_for(server: TlsRedis, port: int, form: str, sentinel_port: int = 0) -> Celery:
    """A Celery app whose lock server is the TLS server (at ``port``) in ``form``."""
    pw, ca = server.password, server.ca_file
    where = f":{pw}@127.0.0.1:{port}/0"
    settings: dict[str, dict[str, Any]] = {
        # kombu's rediss:// query spellings of ssl_cert_reqs
        "rediss-CERT_REQUIRED": {
            "broker_url": f"rediss://{where}?ssl_cert_reqs=CERT_REQUIRED&ssl_ca_certs={ca}"
        },
        "rediss-required": {
            "broker_url": f"rediss://{where}?ssl_cert_reqs=required&ssl_ca_certs={ca}"
        },
        "rediss-optional": {
            "broker_url": f"rediss://{where}?ssl_cert_reqs=optional&ssl_ca_certs={ca}"
        },
        "rediss-none": {"broker_url": f"rediss://{where}?ssl_cert_reqs=none"},
        "rediss-CERT_NONE": {"broker_url": f"rediss://{where}?ssl_cert_reqs=CERT_NONE"},
        # broker_use_ssl on a redis:// broker
        "broker_use_ssl": {
            "broker_url": f"redis://{where}",
            "broker_use_ssl": {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": ca},
        },
        # a lock server of its own, TLS in its transport options
        "transport-options": {
            "broker_url": "memory://",
            "fifo_lock_redis_url": f"redis://{where}",
            "fifo_lock_transport_options": {"ssl_cert_reqs": "required", "ssl_ca_certs": ca},
        },
        # Sentinel broker, TLS master (kombu: broker_use_ssl is the master's)
        "sentinel-broker_use_ssl": {
            "broker_url": f"sentinel://:{pw}@127.0.0.1:{sentinel_port}/0",
            "broker_transport_options": {"master_name": SERVICE},
            "broker_use_ssl": {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": ca},
        },
        "sentinel-transport-options": {
            "broker_url": "memory://",
            "fifo_lock_redis_url": f"sentinel://:{pw}@127.0.0.1:{sentinel_port}/0",
            "fifo_lock_transport_options": {"master_name": SERVICE, "ssl_ca_certs": ca},
        },
    }
    app = Celery(f"tls-{form}", set_as_current=False)
    app.conf.update(settings[form])
    return app


SERVER_FORMS = [
    "rediss-CERT_REQUIRED",
    "rediss-required",
    "rediss-optional",
    "rediss-none",
    "rediss-CERT_NONE",
    "broker_use_ssl",
    "transport-options",
]
SENTINEL_FORMS = ["sentinel-broker_use_ssl", "sentinel-transport-options"]


@pytest.mark.parametrize("form", SERVER_FORMS)
def test_the_lock_works_over_tls(tls_server: TlsRedis, form: str) -> None:
    app = app_for(tls_server, tls_server.port, form)
    lock = lock_for(app, f"tls-{form}", lease_ms=5000, poll_ms=1000)
    with lock.hold(20) as lease:
        assert lease.fence >= 1


@pytest.mark.parametrize("form", SENTINEL_FORMS)
def test_the_lock_works_on_a_tls_master_found_through_sentinel(
    tls_server: TlsRedis, tls_sentinel: PrivateRedis, form: str
) -> None:
    app = app_for(tls_server, tls_server.port, form, tls_sentinel.port)
    lock = lock_for(app, f"tls-{form}", lease_ms=5000, poll_ms=1000)
    with lock.hold(20) as lease:
        assert lease.fence >= 1


@pytest.mark.parametrize("form", SERVER_FORMS)
async def test_no_form_sends_auth_in_clear(tls_server: TlsRedis, form: str) -> None:
    with recording_listener() as listener:
        app = app_for(tls_server, listener.port, form)
        clients = LockConfig.from_app(app, "tap").server.clients()
        await first_bytes(listener, FifoLock(clients, "tap").acquire(timeout=30))
        await clients.aclose()
        assert_only_tls(listener, tls_server.password)


def test_broker_use_ssl_true_is_refused_at_start() -> None:
    # kombu's Redis transport ignores broker_use_ssl=True (it needs a dict), so
    # the broker would talk in clear: the lock refuses to guess.
    app = Celery("tls-true", set_as_current=False)
    app.conf.update(broker_url="redis://127.0.0.1:1/0", broker_use_ssl=True)

    @app.task(name="tls.locked", shared=False)
    @fifo_locked("jobs")
    def locked() -> None: ...

    with pytest.raises(LockUsageError, match="broker_use_ssl"):
        LockConfig.from_app(app, "jobs")
    assert any("broker_use_ssl" in message for message in start_warnings(app))


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"broker_url": "rediss://127.0.0.1:1/0?ssl_cert_reqs=sometimes"}, "ssl_cert_reqs"),
        (
            {
                "broker_url": "memory://",
                "fifo_lock_redis_url": "redis://127.0.0.1:1/0",
                "fifo_lock_transport_options": {"ssl_validate_ocsp": True},
            },
            "ssl_validate_ocsp",
        ),
        (
            {"broker_url": "redis://127.0.0.1:1/0", "broker_use_ssl": {"cert_reqs": "required"}},
            "cert_reqs",
        ),
    ],
)
def test_tls_settings_the_lock_cannot_follow_are_refused_by_name(
    settings: dict[str, Any], named: str
) -> None:
    app = Celery("tls-bad", set_as_current=False)
    app.conf.update(settings)
    with pytest.raises(LockUsageError, match=named):
        LockConfig.from_app(app, "jobs")


def test_fifo_lock_namespace_puts_the_locks_under_a_prefix(redis_url: str) -> None:
    app = Celery("ns", set_as_current=False)
    app.conf.update(broker_url=redis_url, fifo_lock_namespace="tenantA")
    lock = lock_for(app, "jobs", lease_ms=5000, poll_ms=1000)
    with lock.hold(20):
        probe = Redis.from_url(redis_url)
        try:
            assert probe.exists("tenantA:fifolock:{jobs}:lease")
        finally:
            probe.close()
    app.conf.fifo_lock_namespace = "a{b"
    with pytest.raises(ValueError, match="fifo_lock_namespace"):
        LockConfig.from_app(app, "jobs")
