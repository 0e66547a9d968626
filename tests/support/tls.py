"""A private TLS-only Redis server with a password, and a plain-TCP listener that records.

``private_tls_redis_server()`` makes a certificate authority and a server
certificate for ``127.0.0.1`` with trustme (new for every server), starts a
private ``redis-server`` (``redis_fifo_lock.testing.private_redis_server``)
with a TLS port, then sets its password and closes its plain port, so that
only TLS clients that authenticate get in. ``recording_listener()`` accepts
TCP connections on a free port and keeps every byte it receives, answering
nothing: point a client configured for TLS at it to see what it sends first.
"""

from __future__ import annotations

import asyncio
import socket
import tempfile
import threading
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import trustme
from redis import Redis

from redis_fifo_lock.testing import PrivateRedis, free_port, private_redis_server
from tests.support.polling import until_sync

PASSWORD = "s3cret-tls-password"
"""The ``requirepass`` of every TLS server started here."""


@dataclass(frozen=True)
class TlsRedis:
    """A running TLS-only server from ``private_tls_redis_server``.

    Attributes:
        host: "127.0.0.1" (the server certificate's address).
        port: the TLS port (int).
        password: the server's ``requirepass`` (str).
        ca_file: PEM file (str) of the authority that signed the server's certificate.
        cert_file: PEM file (str) of the server's certificate and key (also usable
            as a client certificate, with ``key_file``).
        key_file: PEM file (str) of the server's private key.
        server: the underlying ``PrivateRedis`` (its ``port`` is closed).
    """

    host: str
    port: int
    password: str
    ca_file: str
    cert_file: str
    key_file: str
    server: PrivateRedis

    def url(self, scheme: str = "rediss", db: int = 0, query: str = "") -> str:
        """A URL of the server with the password: ``<scheme>://:<pw>@host:port/<db>[?query]``."""
        tail = f"?{query}" if query else ""
        return f"{scheme}://:{self.password}@{self.host}:{self.port}/{db}{tail}"

    def client(self) -> Redis:
        """A synchronous client over TLS, verifying the certificate (close it)."""
        return Redis(
            host=self.host,
            port=self.port,
            password=self.password,
            ssl=True,
            ssl_ca_certs=self.ca_file,
        )


@contextmanager
def private_tls_redis_server(extra_args: list[str] | None = None) -> Iterator[TlsRedis]:
    """Run a TLS-only Redis server with ``PASSWORD`` for a ``with`` block.

    Args:
        extra_args: more ``redis-server`` options (e.g. Sentinel's
            ``--tls-replication yes``); default none.

    Yields:
        the ``TlsRedis`` to connect to.
    """
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    with tempfile.TemporaryDirectory(prefix="fifolock-tls-") as folder:
        ca_file = Path(folder, "ca.pem")
        cert_file = Path(folder, "server.crt")
        key_file = Path(folder, "server.key")
        ca.cert_pem.write_to_path(str(ca_file))
        cert.cert_chain_pems[0].write_to_path(str(cert_file))
        cert.private_key_pem.write_to_path(str(key_file))
        tls_port = free_port()
        args = [
            *("--tls-port", str(tls_port)),
            *("--tls-cert-file", str(cert_file)),
            *("--tls-key-file", str(key_file)),
            *("--tls-ca-cert-file", str(ca_file)),
            *("--tls-auth-clients", "no"),
            *(extra_args or []),
        ]
        with private_redis_server(extra_args=args) as server:
            # The plain port served the start-up check; from now on TLS only,
            # and only with the password.
            with Redis.from_url(server.url) as plain:
                plain.config_set("requirepass", PASSWORD)
                plain.execute_command("AUTH", PASSWORD)
                plain.config_set("port", 0)
            yield TlsRedis(
                "127.0.0.1",
                tls_port,
                PASSWORD,
                str(ca_file),
                str(cert_file),
                str(key_file),
                server,
            )


@contextmanager
def private_tls_sentinel(server: TlsRedis, service_name: str) -> Iterator[PrivateRedis]:
    """Run one sentinel (plain port, quorum 1) watching ``server`` over TLS.

    Yields:
        the sentinel, once it reaches the master over TLS.
    """
    config = (
        f"sentinel monitor {service_name} {server.host} {server.port} 1\n"
        f"sentinel auth-pass {service_name} {server.password}\n"
        f"sentinel down-after-milliseconds {service_name} 60000\n"
        "tls-replication yes\n"
        f"tls-cert-file {server.cert_file}\n"
        f"tls-key-file {server.key_file}\n"
        f"tls-ca-cert-file {server.ca_file}\n"
    )
    with tempfile.TemporaryDirectory(prefix="fifolock-snt-") as folder:
        config_file = Path(folder, "sentinel.conf")
        config_file.write_text(config)
        with private_redis_server(extra_args=["--sentinel"], config_file=config_file) as sentinel:
            with Redis.from_url(sentinel.url, decode_responses=True) as probe:

                def reached() -> bool:
                    flags = str(probe.sentinel_master(service_name).get("flags", ""))
                    return flags.split(",") == ["master"]

                until_sync(reached, f"the sentinel reaches {service_name} over TLS")
            yield sentinel


class RecordingListener:
    """A TCP listener on 127.0.0.1 that records what each connection sends.

    Attributes:
        port: the port it listens on (int).
    """

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._socket.getsockname()[1]
        self._received: list[bytearray] = []
        self._guard = threading.Lock()
        self._first_bytes = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:
                return
            buffer = bytearray()
            with self._guard:
                self._received.append(buffer)
            threading.Thread(target=self._read, args=(connection, buffer), daemon=True).start()

    def _read(self, connection: socket.socket, buffer: bytearray) -> None:
        with connection:
            while True:
                try:
                    chunk = connection.recv(65536)
                except OSError:
                    return
                if not chunk:
                    return
                with self._guard:
                    buffer.extend(chunk)
                self._first_bytes.set()

    def wait_for_bytes(self, timeout_s: float = 20.0) -> None:
        """Block until some connection sent something; AssertionError after ``timeout_s``."""
        if not self._first_bytes.wait(timeout_s):
            raise AssertionError(f"nothing reached port {self.port} in {timeout_s} s")

    @property
    def received(self) -> list[bytes]:
        """What each connection sent so far, in the order they were accepted."""
        with self._guard:
            return [bytes(buffer) for buffer in self._received]

    def close(self) -> None:
        """Stop accepting (connections already open are read to their end)."""
        self._socket.close()


@contextmanager
def recording_listener() -> Iterator[RecordingListener]:
    """A ``RecordingListener`` for a ``with`` block, closed at its end."""
    listener = RecordingListener()
    try:
        yield listener
    finally:
        listener.close()


async def first_bytes(listener: RecordingListener, attempt: Awaitable[object]) -> None:
    """Run ``attempt`` (something that connects to ``listener``) until the listener
    received its first bytes, then cancel it; re-raise what ``attempt`` raised if it
    ended first (as a lock built with wrong options does)."""
    task = asyncio.ensure_future(attempt)
    heard = asyncio.ensure_future(asyncio.to_thread(listener.wait_for_bytes))
    try:
        await asyncio.wait({task, heard}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()
        await heard
    finally:
        task.cancel()
        await asyncio.gather(task, heard, return_exceptions=True)


def is_tls_client_hello(data: bytes) -> bool:
    """Whether ``data`` starts with a TLS record carrying a handshake (a ClientHello)."""
    return len(data) >= 6 and data[0] == 0x16 and data[1] == 0x03 and data[5] == 0x01


def assert_only_tls(listener: RecordingListener, password: str) -> None:
    """Assert that every connection to ``listener`` opened with a TLS ClientHello,
    and that neither ``AUTH`` nor ``password`` went out in clear."""
    listener.wait_for_bytes()
    received = listener.received
    assert received, "no connection reached the listener"
    for data in received:
        if not data:
            continue
        assert is_tls_client_hello(data), f"not a TLS ClientHello: {data[:60]!r}"
        assert password.encode() not in data
        assert b"AUTH" not in data.upper()
