"""TLS in the core: every way ``LoopClients`` is told to use TLS makes the lock speak
TLS to a real TLS-only redis-server, and never sends AUTH (or the password) in clear."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from redis_fifo_lock import FifoLock, LoopClients
from tests.support.tls import (
    TlsRedis,
    assert_only_tls,
    first_bytes,
    private_tls_redis_server,
    recording_listener,
)


@pytest.fixture(scope="module")
def tls_server() -> Iterator[TlsRedis]:
    """One TLS-only server (password, certificates made for this run) per module."""
    with private_tls_redis_server() as server:
        yield server


def forms(server: TlsRedis, host: str, port: int) -> dict[str, tuple[str | None, dict[str, Any]]]:
    """Each way to ask ``LoopClients`` for TLS to ``host:port``: (url, kwargs)."""
    where = f":{server.password}@{host}:{port}/0"
    ca = {"ssl_ca_certs": server.ca_file}
    return {
        "rediss-url": (f"rediss://{where}", ca),
        "rediss-url-query": (
            f"rediss://{where}?ssl_cert_reqs=required&ssl_ca_certs={server.ca_file}",
            {},
        ),
        "redis-url-ssl-true": (f"redis://{where}", {"ssl": True, **ca}),
        "redis-url-ssl-keys": (f"redis://{where}", ca),
        "kwargs-ssl-true": (
            None,
            {"host": host, "port": port, "password": server.password, "ssl": True, **ca},
        ),
        "kwargs-ssl-keys": (None, {"host": host, "port": port, "password": server.password, **ca}),
    }


FORMS = [
    "rediss-url",
    "rediss-url-query",
    "redis-url-ssl-true",
    "redis-url-ssl-keys",
    "kwargs-ssl-true",
    "kwargs-ssl-keys",
]


@pytest.mark.parametrize("form", FORMS)
async def test_the_lock_works_over_tls(tls_server: TlsRedis, form: str) -> None:
    url, kwargs = forms(tls_server, tls_server.host, tls_server.port)[form]
    clients = LoopClients(url, **kwargs)
    lock = FifoLock(clients, f"tls-{form}", lease_ms=5000, poll_ms=1000)
    try:
        async with lock.hold(timeout=20) as lease:
            assert lease.fence >= 1
    finally:
        await clients.aclose()


@pytest.mark.parametrize("form", FORMS)
async def test_no_form_sends_auth_in_clear(tls_server: TlsRedis, form: str) -> None:
    with recording_listener() as listener:
        url, kwargs = forms(tls_server, "127.0.0.1", listener.port)[form]
        clients = LoopClients(url, **kwargs)
        await first_bytes(listener, FifoLock(clients, "tap").acquire(timeout=30))
        await clients.aclose()
        assert_only_tls(listener, tls_server.password)


def test_ssl_false_with_ssl_options_is_refused() -> None:
    with pytest.raises(ValueError, match="ssl=False") as caught:
        LoopClients("redis://127.0.0.1:1/0", ssl=False, ssl_ca_certs="/ca.pem")
    assert "ssl_ca_certs" in str(caught.value)


def test_an_ssl_option_redis_asyncio_lacks_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="ssl_validate_ocsp"):
        LoopClients("rediss://127.0.0.1:1/0", ssl_validate_ocsp=True)


def test_tls_on_a_unix_socket_is_refused() -> None:
    with pytest.raises(ValueError, match="unix"):
        LoopClients("unix:///tmp/redis.sock", ssl=True)
