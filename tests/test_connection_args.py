"""Connection arguments are checked when the lock or its clients are built."""

from __future__ import annotations

import asyncio
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import Connection, ConnectionPool

from redis_fifo_lock import (
    FifoLock,
    LoopClients,
    RedisUnavailable,
    SyncFifoLock,
    waiting,
)
from redis_fifo_lock import connection as connection_module
from redis_fifo_lock import lock as lock_module
from redis_fifo_lock.connection import CHECKED_MAX
from tests.support.polling import until


def test_a_url_given_to_fifo_lock_is_a_type_error_pointing_at_loop_clients(
    redis_url: str,
) -> None:
    with pytest.raises(TypeError, match=r"redis_client.*got str.*LoopClients\("):
        FifoLock(redis_url, "jobs")  # type: ignore[arg-type]


@pytest.mark.parametrize("connection", [123, None, b"redis://localhost", ["redis://h"]])
def test_sync_fifo_lock_refuses_a_connection_of_the_wrong_type(connection: object) -> None:
    with pytest.raises(TypeError, match=rf"connection must be .* got {type(connection).__name__}"):
        SyncFifoLock(connection, "jobs")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "url", ["http://localhost:6379/0", "localhost:6379", "redis+socket:///tmp/r.sock", ""]
)
def test_an_unsupported_url_is_refused_when_the_lock_is_built(url: str) -> None:
    with pytest.raises(ValueError, match=r"connection .*redis://, rediss:// or unix://"):
        SyncFifoLock(url, "jobs")
    with pytest.raises(ValueError, match="url"):
        LoopClients(url)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis://u:s3cret@h:notaport/0", "Port could not be cast"),
        ("redis://u:s3cret@h:99999/0", "Port out of range"),
        ("redis://u:s3cret@[::1/0", "Invalid IPv6 URL"),
        ("redis://u:s3cret@h:6379/0?db=x", "Invalid value for .db."),
        ("unix://", "must give the socket's path"),
        ("unix://:s3cret@?db=2", "must give the socket's path"),
    ],
)
def test_a_malformed_url_is_refused_when_the_lock_is_built_naming_the_setting(
    url: str, reason: str
) -> None:
    # Before, redis-py's own error surfaced from the constructor, naming
    # neither the setting nor the URL (or, from a Django or Celery setting,
    # at the first acquire).
    with pytest.raises(ValueError, match=rf"^connection '.*' is not a URL .*{reason}") as refused:
        SyncFifoLock(url, "jobs")
    assert "s3cret" not in str(refused.value)
    with pytest.raises(ValueError, match=rf"^url .*{reason}"):
        LoopClients(url)


@pytest.mark.parametrize(
    ("url", "kwargs", "error", "reason"),
    [
        ("rediss://u:s3cret@h:6380/0?ssl_cert_reqs=bogus", {}, ValueError, "Certificate Req"),
        ("redis://u:s3cret@h:6379/0?protocol=9", {}, ValueError, "protocol must be"),
        ("redis://u:s3cret@h:6379/0?colour=blue", {}, TypeError, "'colour'"),
        ("redis://h/0", {"sockettimeout": 1, "password": "s3cret"}, TypeError, "sockettimeout"),
        ("unix:///run/r.sock", {"protocol": 4, "password": "s3cret"}, ValueError, "protocol"),
        ("redis://u:s3cret@h:6379/0?socket_timeout=-1", {}, ValueError, "socket_timeout"),
        ("redis://u:s3cret@h:6379/0?socket_connect_timeout=0", {}, ValueError, "connect_timeout"),
        ("redis://h/0", {"socket_timeout": "5", "password": "s3cret"}, ValueError, "socket_t"),
        ("redis://h/0", {"socket_timeout": float("nan")}, ValueError, "socket_timeout"),
        ("redis://h/0", {"socket_connect_timeout": float("inf")}, ValueError, "connect_timeout"),
        ("redis://h/0", {"socket_timeout": True}, ValueError, "socket_timeout"),
    ],
)
def test_connection_options_redis_py_would_refuse_are_refused_when_the_lock_is_built(
    url: str, kwargs: dict[str, object], error: type[Exception], reason: str
) -> None:
    # Before, each was taken at construction and refused by redis-py only at
    # the first acquire, as a bare TypeError or a RedisError the caller would
    # take for an outage.
    with pytest.raises(error, match=rf"^LoopClients: .*{reason}") as refused:
        LoopClients(url, **kwargs)
    assert "s3cret" not in str(refused.value)
    if not kwargs:
        with pytest.raises(error, match=reason):
            SyncFifoLock(url, "jobs")


def test_a_configuration_is_checked_once_however_many_locks_are_built_on_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # redis-py 8 reads its package metadata for every connection it builds
    # (about 0.5 ms): checking each SyncFifoLock's made building one 10 times
    # slower (58 -> 590 us; found by an outside attack).
    built: list[object] = []
    make_connection = ConnectionPool.make_connection

    def counted(pool: ConnectionPool) -> object:
        built.append(pool)
        return make_connection(pool)

    monkeypatch.setattr(ConnectionPool, "make_connection", counted)
    url = "redis://u:s3cret@checked-once.example:6379/0"
    for n in range(50):
        SyncFifoLock(url, f"jobs-{n}")
    LoopClients(url)
    assert len(built) == 1, f"{len(built)} connections built to check one configuration"
    LoopClients(url, socket_timeout=2)
    assert len(built) == 2, "another configuration is checked"
    for n in range(CHECKED_MAX + 1):
        LoopClients(url, client_name=f"c{n}")
    assert len(connection_module._accepted) <= CHECKED_MAX


def test_a_configuration_with_an_object_is_checked_every_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Remembered by its text, a connection class that refuses its options was
    # let through after another of the same name and text had been accepted
    # (found by an outside attack).
    def connection_class(refuses: bool) -> type:
        class Conn(Connection):
            def __init__(self, **kwargs: object) -> None:
                if refuses:
                    raise TypeError("Conn() got an unexpected keyword argument 'x'")
                super().__init__(**kwargs)  # type: ignore[arg-type]

        return Conn

    url = "redis://checked-objects.example:6379/0"
    LoopClients(url, connection_class=connection_class(False))
    with pytest.raises(TypeError, match="LoopClients: redis-py takes no such"):
        LoopClients(url, connection_class=connection_class(True))


def test_locks_built_in_many_threads_at_once_are_all_checked_without_error() -> None:
    # Evicting the oldest remembered configuration raced another thread's
    # insert: 90 of 24,000 constructions raised "dictionary changed size
    # during iteration" (found by an outside attack).
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with ThreadPoolExecutor(8) as pool:
            built = list(
                pool.map(
                    lambda n: LoopClients("redis://threads.example/0", client_name=f"c{n}"),
                    range(8 * 600),
                )
            )
    finally:
        sys.setswitchinterval(interval)
    assert len(built) == 8 * 600
    assert len(connection_module._accepted) <= CHECKED_MAX


def test_loop_clients_refuse_wrong_types_and_schemes() -> None:
    with pytest.raises(TypeError, match="url must be a str"):
        LoopClients(6379)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="url"):
        LoopClients.cluster("http://node:7000")
    with pytest.raises(TypeError, match="factory must be callable"):
        LoopClients(factory="redis://h")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"LoopClients\(\) needs"):
        LoopClients()


async def test_supported_urls_still_make_working_locks(redis_url: str, aredis: Redis) -> None:
    for url in (redis_url, redis_url.replace("redis://", "REDIS://")):
        lock = FifoLock(LoopClients(url), "schemes")
        async with lock.hold(timeout=5) as lease:
            assert lease.fence > 0
    LoopClients("rediss://tls.example:6380/0")
    LoopClients("unix:///run/redis.sock?db=2")


@pytest.mark.parametrize("limit", [1, 2, 3, 4])
def test_a_pool_smaller_than_one_loop_s_connections_is_refused_when_the_lock_is_built(
    redis_url: str, limit: int
) -> None:
    """A lock on one event loop may have 5 connections open at once (its two
    lanes of calls, the renewal and release lane, the doorbell, and the
    doorbell's new subscription while it rebuilds a broken one). With fewer,
    every call beyond the pool's size failed with "Too many connections" and
    was retried as an outage: with 1, no release ever went through; with 4, 11
    of 12 rebuilds of a killed subscription failed (an outside attack)."""
    match = rf"max_connections of .* is {limit}; .* needs 5 connections"
    with pytest.raises(ValueError, match=match):
        SyncFifoLock(f"{redis_url}?max_connections={limit}", "jobs")
    with pytest.raises(ValueError, match=match):
        LoopClients(redis_url, max_connections=limit)
    with pytest.raises(ValueError, match=match):
        FifoLock(Redis.from_url(redis_url, max_connections=limit), "jobs")


async def _waiting(lock: FifoLock) -> int:
    return (await lock.status()).waiting


async def test_a_pool_of_five_serves_a_contended_lock(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    clients = LoopClients(redis_url, max_connections=5)
    lock = FifoLock(clients, "five", lease_ms=2000, poll_ms=500)
    held = await lock.acquire(timeout=5)
    waiting = asyncio.ensure_future(lock.acquire(timeout=5))
    await until(lambda: _waiting(lock), "the second acquire is queued")
    await lock.release(held)
    await lock.release(await waiting)
    await clients.aclose()
    assert "Too many connections" not in caplog.text


def _never_refuses_a_pool(where: str, client: object) -> None:
    """MUTANT pool-size-unchecked: any pool is taken, however small (before the
    check): a lock on a pool of one connection cannot release."""


async def test_a_pool_of_one_kills_pool_size_unchecked(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lock_module, "check_pool_size", _never_refuses_a_pool)
    monkeypatch.setattr(waiting, "check_pool_size", _never_refuses_a_pool)
    client = Redis.from_url(redis_url, max_connections=1)
    lock = FifoLock(client, "one-connection", lease_ms=1000, poll_ms=200)
    held = await lock.acquire(timeout=5)
    outcomes = await asyncio.gather(
        lock.acquire(timeout=2), lock.release(held), return_exceptions=True
    )
    failures = [
        outcome
        for outcome in outcomes
        if isinstance(outcome, RedisUnavailable) and "Too many connections" in str(outcome)
    ]
    assert failures, f"pool-size-unchecked passed: {outcomes}"
    await client.aclose()
