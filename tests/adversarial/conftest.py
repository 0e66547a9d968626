"""Fixtures of the adversarial suite: the seed, and a fresh context per scenario.

Every random choice of a run derives from one master seed: ``$FIFOLOCK_SEED`` if
set, else a random one. It is printed in the header of every run and in every
failure; ``FIFOLOCK_SEED=<seed> uv run --all-extras pytest -m adversarial`` replays
the same schedules (OS timing still varies). Each test derives its own seed from
the master seed and its node id, so one test can be rerun alone.
"""

from __future__ import annotations

import os
import random
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from redis_fifo_lock.testing import PrivateRedisFactory
from tests.adversarial.registry import Context
from tests.adversarial.table import RESULTS

MASTER_SEED = int(os.environ.get("FIFOLOCK_SEED") or random.SystemRandom().randrange(1, 2**31))


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Print the master seed at the top of the run."""
    return [f"adversarial suite: seed {MASTER_SEED} (replay with FIFOLOCK_SEED={MASTER_SEED})"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The suite needs ``Task.cancelling()`` (Python 3.11)."""
    if sys.version_info >= (3, 11):
        return
    skip = pytest.mark.skip(reason="the adversarial suite needs Python 3.11+ (Task.cancelling)")
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the totals and the mutant table of the run, if anything adversarial ran."""
    lines = RESULTS.summary()
    if lines:
        terminalreporter.section(f"adversarial suite (seed {MASTER_SEED})")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """This test's seed: derived from the master seed and the test's node id."""
    return zlib.crc32(f"{MASTER_SEED}:{request.node.nodeid}".encode())


@pytest.fixture
def replay(request: pytest.FixtureRequest) -> str:
    """The command that reruns this test with the same seed."""
    return (
        f"replay: FIFOLOCK_SEED={MASTER_SEED} uv run --all-extras pytest -m adversarial "
        f"'{request.node.nodeid}'"
    )


@pytest.fixture
def contexts(
    seed: int, tmp_path: Path, fresh_redis_server: PrivateRedisFactory
) -> Callable[..., Context]:
    """Makes a fresh ``Context`` (own run directory) per call; keyword arguments
    (``mutant``, ``dup_exec``) go to the context. Servers stop after the test."""
    made = 0

    def make(**options: object) -> Context:
        nonlocal made
        made += 1
        run_dir = tmp_path / f"run{made}"
        run_dir.mkdir()
        return Context(seed + made, run_dir, fresh_redis_server, **options)  # type: ignore[arg-type]

    return make
