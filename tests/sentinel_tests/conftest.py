"""A real local Sentinel set-up on loopback, for the Sentinel tests.

The session fixture ``sentinel_setup`` runs one master, one replica and three
sentinels with :func:`tests.support.sentinel.private_sentinel_setup`, shared
by the tests that leave the roles alone. Tests that fail the master over take
``fresh_sentinel_setup``, their own set-up, so that each starts from a known
master. When the set-up cannot be started (no server binary, ...) every test
that uses it is skipped, with the reason.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack

import pytest
from redis.asyncio import Redis
from redis.asyncio.sentinel import Sentinel

from tests.support.sentinel import PrivateSentinelSetup, private_sentinel_setup

SERVICE = "mymaster"


def sentinel_url(setup: PrivateSentinelSetup) -> str:
    """The ``sentinel://host:port,.../service`` URL ``tests.support.contender`` takes."""
    addresses = ",".join(f"{host}:{port}" for host, port in setup.sentinel_addresses)
    return f"sentinel://{addresses}/{setup.service_name}"


def _start(stack: ExitStack) -> PrivateSentinelSetup:
    try:
        return stack.enter_context(private_sentinel_setup(SERVICE))
    except (RuntimeError, ImportError, OSError) as exc:
        pytest.skip(f"cannot start a local Sentinel set-up: {exc}")


@pytest.fixture(scope="session")
def sentinel_setup() -> Iterator[PrivateSentinelSetup]:
    """A master, a replica and three sentinels on 127.0.0.1 for the whole session.

    Do not fail it over: use ``fresh_sentinel_setup`` for that.
    """
    with ExitStack() as stack:
        yield _start(stack)


@pytest.fixture
def fresh_sentinel_setup() -> Iterator[PrivateSentinelSetup]:
    """A set-up of the test's own, stopped after the test; free to fail over or kill."""
    with ExitStack() as stack:
        yield _start(stack)


async def master_client(setup: PrivateSentinelSetup, **connection_kwargs: object) -> Redis:
    """An asyncio client for the current master of ``setup``, found through Sentinel.

    Close it with :func:`close_master_client`, which closes the sentinel
    connections too.
    """
    sentinel = Sentinel(setup.sentinel_addresses, **connection_kwargs)  # type: ignore[no-untyped-call]
    client: Redis = sentinel.master_for(setup.service_name)
    return client


async def close_master_client(client: Redis) -> None:
    """Close a client from :func:`master_client` and its sentinels' connections."""
    await client.aclose()
    for sentinel in client.connection_pool.sentinel_manager.sentinels:  # type: ignore[attr-defined]
        await sentinel.aclose()


@pytest.fixture
async def amaster(sentinel_setup: PrivateSentinelSetup) -> AsyncIterator[Redis]:
    """An asyncio master client from ``Sentinel.master_for``, on an empty master."""
    client = await master_client(sentinel_setup)
    try:
        await client.flushall()
        yield client
    finally:
        await close_master_client(client)
