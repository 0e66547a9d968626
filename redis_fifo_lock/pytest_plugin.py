"""pytest plugin: private Redis servers for your own test suite.

Installed with the package (the ``pytest11`` entry point ``fifolock``), so
pytest loads it by itself; it starts nothing until a test asks for one of its
fixtures. It needs the ``testing`` extra (``pip install
"redis-fifo-lock[testing]"``) once a server is started; ``-p no:fifolock``
switches it off.

Fixtures:

- ``fifolock_redis_url`` (session scope, ``str``): ``$REDIS_URL`` if set, else
  the URL of a private server (see :func:`redis_fifo_lock.testing.redis_url`)
  that lives as long as the session.
- ``fifolock_redis_server`` (function scope,
  :class:`~redis_fifo_lock.testing.PrivateRedisFactory`): call it as
  ``fifolock_redis_server(extra_args=None, *, port=None)`` to start one more
  private server, stopped after the test; it returns a
  :class:`~redis_fifo_lock.testing.PrivateRedis`. Redefine it in a conftest to
  start servers differently.

A session stopped with SIGTERM (a CI job being cancelled) is wound down as
Ctrl-C winds it down: fixtures are torn down, so no server a fixture started
(nor any other process a fixture owns) is left running. The plugin installs
that handler only while SIGTERM has its default action; a second SIGTERM
kills at once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from types import FrameType

import pytest

from .testing import PrivateRedis, PrivateRedisFactory, private_redis_server, redis_url


def _interrupt_on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Turn the first SIGTERM into ``KeyboardInterrupt``; the next one kills."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise KeyboardInterrupt(f"signal {signum} (SIGTERM)")


def pytest_configure(config: pytest.Config) -> None:
    """Make SIGTERM tear the session down like Ctrl-C, if nothing else handles it."""
    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt_on_sigterm)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Give SIGTERM back its default action if this plugin took it."""
    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread and signal.getsignal(signal.SIGTERM) == _interrupt_on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.fixture(scope="session")
def fifolock_redis_url() -> Iterator[str]:
    """URL (str) of a Redis server for the whole session: ``$REDIS_URL``, or a
    private server on ``127.0.0.1`` and a free port, without persistence.

    Raises:
        RuntimeError: when no server binary is found or the server fails to
            start (the message says what to install).
        ImportError: when the ``testing`` extra is missing.
    """
    with redis_url() as url:
        yield url


@pytest.fixture
def fifolock_redis_server() -> Iterator[PrivateRedisFactory]:
    """Factory (``PrivateRedisFactory``) of extra private servers, each stopped
    after the test; always private, even when ``$REDIS_URL`` is set.

    To simulate a restart (all data lost, same address), shut a server down
    and start a new one on its port: ``fifolock_redis_server(port=old.port)``.

    Raises:
        RuntimeError, ImportError: when called, as
            :func:`redis_fifo_lock.testing.private_redis_server`.
    """
    with ExitStack() as stack:

        def start(
            extra_args: Sequence[str] | None = None, *, port: int | None = None
        ) -> PrivateRedis:
            """Start one more private server; see the fixture's docstring."""
            return stack.enter_context(private_redis_server(extra_args=extra_args, port=port))

        yield start
