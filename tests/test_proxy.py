"""The TCP fault proxy of the adversarial tests does what it says (no lock involved)."""

from __future__ import annotations

import time

import pytest
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tests.conftest import FaultProxyFactory
from tests.support.polling import until_sync

pytestmark = pytest.mark.timeout(30)


def test_bytes_pass_both_ways_and_connections_are_counted(
    redis: Redis, redis_url: str, fault_proxy: FaultProxyFactory
) -> None:
    proxy = fault_proxy(redis_url)
    with Redis.from_url(proxy.url) as client:
        assert client.set("through", "proxy")
        assert redis.get("through") == b"proxy"
        assert proxy.accepted == 1
        assert proxy.open == 1
    until_sync(lambda: proxy.open == 0, "the closed connection is gone from the proxy")


def test_a_delay_postpones_every_reply(redis_url: str, fault_proxy: FaultProxyFactory) -> None:
    proxy = fault_proxy(redis_url)
    with Redis.from_url(proxy.url) as client:
        client.ping()
        proxy.delay("down", 300)
        started = time.monotonic()
        client.ping()
        assert 0.29 <= time.monotonic() - started < 2.0
        proxy.delay("down", 0)
        started = time.monotonic()
        client.ping()
        assert time.monotonic() - started < 0.2


def test_a_held_command_runs_only_once_released(
    redis: Redis, redis_url: str, fault_proxy: FaultProxyFactory
) -> None:
    proxy = fault_proxy(redis_url)
    with Redis.from_url(proxy.url, socket_timeout=0.3, retry_on_timeout=False) as client:
        client.ping()
        proxy.hold("up", current_only=True)
        with pytest.raises((RedisTimeoutError, RedisConnectionError)):
            client.execute_command("INCR", "late")
        assert redis.get("late") is None
        assert proxy.held_bytes("up") > 0
        proxy.release("up")
        until_sync(lambda: redis.get("late") == b"1", "the held INCR reached Redis late")


def test_a_held_reply_is_lost_and_new_connections_pass_with_current_only(
    redis: Redis, redis_url: str, fault_proxy: FaultProxyFactory
) -> None:
    proxy = fault_proxy(redis_url)
    with Redis.from_url(proxy.url, socket_timeout=0.3, retry_on_timeout=False) as client:
        client.ping()
        proxy.hold("down", current_only=True)
        with pytest.raises((RedisTimeoutError, RedisConnectionError)):
            client.execute_command("INCR", "ran")
        assert redis.get("ran") == b"1"  # it ran; only the reply is held
        assert client.ping()  # a new connection is not held
        assert proxy.accepted == 2


def test_a_reset_closes_every_connection(redis_url: str, fault_proxy: FaultProxyFactory) -> None:
    proxy = fault_proxy(redis_url)
    with Redis.from_url(proxy.url, retry_on_timeout=False) as client:
        client.ping()
        assert proxy.reset() == 1
        assert proxy.open == 0
        client.ping()  # redis-py reconnects
        assert proxy.accepted == 2
