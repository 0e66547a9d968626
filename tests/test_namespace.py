"""``namespace``: the lock's keys and doorbell channel under a caller's key prefix."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest
from redis.asyncio import Redis as AsyncRedis

from redis_fifo_lock import FifoLock, SyncFifoLock
from redis_fifo_lock.protocol import LockKeys


def test_without_a_namespace_the_keys_are_as_before() -> None:
    assert LockKeys("jobs").key("queue") == "fifolock:{jobs}:queue"


def test_keys_unpickled_in_another_process_are_the_same_dict_key() -> None:
    # The hash is cached on the object; a str's hash differs between processes
    # (PYTHONHASHSEED), so the pickled form must not carry it.
    keys = LockKeys("jobs", "tenantA")
    hash(keys)
    script = (
        "import pickle, sys; from redis_fifo_lock.protocol import LockKeys; "
        "keys = pickle.loads(sys.stdin.buffer.read()); "
        "print({LockKeys('jobs', 'tenantA'): 'found'}.get(keys, 'missing'))"
    )
    found = subprocess.run(
        [sys.executable, "-c", script],
        input=pickle.dumps(keys),
        capture_output=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "random"},
    )
    assert found.stdout.strip() == b"found"


async def test_every_key_and_the_doorbell_start_with_the_namespace(aredis: AsyncRedis) -> None:
    lock = FifoLock(aredis, "jobs", namespace="tenantA", lease_ms=5000, poll_ms=1000)
    assert all(key.startswith("tenantA:fifolock:{jobs}:") for key in lock.keys.all)
    assert lock.keys.doorbell_of("s1") == "tenantA:fifolock:{jobs}:doorbell:s1"
    async with lock.hold(timeout=20):
        held = {key.decode() for key in await aredis.keys("*")}
    assert held and all(key.startswith("tenantA:fifolock:{jobs}:") for key in held)


@pytest.mark.parametrize(
    ("namespace", "says"),
    [("a{b", "'{'"), ("a}b", "'}'"), ("x" * 257, "256"), ("a\nb", "control"), (7, "str")],
)
def test_a_namespace_that_would_break_the_keys_is_refused(namespace: object, says: str) -> None:
    for build in (
        lambda: FifoLock(AsyncRedis(), "jobs", namespace=namespace),  # type: ignore[arg-type]
        lambda: SyncFifoLock("redis://127.0.0.1:1/0", "jobs", namespace=namespace),  # type: ignore[arg-type]
    ):
        with pytest.raises(ValueError, match="namespace") as caught:
            build()
        assert says in str(caught.value)
