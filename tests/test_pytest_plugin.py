"""Tests for :mod:`redis_fifo_lock.pytest_plugin`, run as users load it: in a
pytest session of their own, in a subprocess, with none of this suite's
conftest files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.polling import until_sync
from tests.support.processes import alive

ROOT = Path(__file__).resolve().parent.parent

INNER_SESSION_S = 120.0
"""Seconds the inner session may take to start its processes, and again to end
(a loaded machine makes a Celery worker slow to start and to stop)."""


@pytest.fixture
def session_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory of its own for an inner pytest session (its own rootdir and
    empty ini file, so that nothing of this suite's configuration applies)."""
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\n"
    )
    yield tmp_path


def _inner_session(session_dir: Path, test_source: str) -> subprocess.Popen[str]:
    """Start ``pytest`` on ``test_source`` in ``session_dir``; it can import
    ``tests.*`` (the working directory is the repository root)."""
    test_file = session_dir / "test_inner.py"
    test_file.write_text(textwrap.dedent(test_source))
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            str(test_file),
            "--rootdir",
            str(session_dir),
            "-c",
            str(session_dir / "pytest.ini"),
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "-q",
        ],
        cwd=ROOT,
        env={**os.environ, "FIFOLOCK_PIDS": str(session_dir / "pids")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_the_plugin_fixtures_serve_a_session_of_their_own(session_dir: Path) -> None:
    session = _inner_session(
        session_dir,
        """
        from redis import Redis


        def test_shared_and_fresh(fifolock_redis_url, fifolock_redis_server):
            fresh = fifolock_redis_server(["--maxmemory-policy", "volatile-lru"])
            assert fresh.url != fifolock_redis_url
            with Redis.from_url(fifolock_redis_url) as shared:
                assert shared.ping()
            with Redis.from_url(fresh.url) as client:
                assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "volatile-lru"
        """,
    )
    out, _ = session.communicate(timeout=INNER_SESSION_S)
    assert session.returncode == 0, out


@pytest.mark.timeout(3 * INNER_SESSION_S)
def test_a_session_stopped_with_sigterm_leaves_no_server_or_worker_behind(
    session_dir: Path,
) -> None:
    """SIGTERM, as a cancelled CI job sends it, tears the session down as Ctrl-C
    does: the private server and the Celery worker its fixtures started stop."""
    pytest.importorskip("celery")
    pids = session_dir / "pids"
    session = _inner_session(
        session_dir,
        """
        import os
        import threading
        from pathlib import Path

        from tests.celery_tests import celery_app as tasks
        from tests.support.celery_worker import running_worker


        def test_runs_until_stopped(fifolock_redis_server, tmp_path):
            server = fifolock_redis_server()
            tasks.configure(server.url)
            with running_worker(server.url, "solo", tmp_path, concurrency=1) as worker:
                ready = Path(os.environ["FIFOLOCK_PIDS"])
                ready.with_suffix(".tmp").write_text(f"{server.pid} {worker.main_pid}")
                ready.with_suffix(".tmp").rename(ready)
                threading.Event().wait()  # until the session is stopped
        """,
    )
    server_pid = worker_pid = 0
    try:
        until_sync(
            lambda: pids.exists() or session.poll() is not None,
            "the inner session's server and worker are up",
            timeout_s=INNER_SESSION_S,
        )
        assert session.poll() is None, session.communicate()[0]
        server_pid, worker_pid = map(int, pids.read_text().split())
        session.send_signal(signal.SIGTERM)
        try:
            out, _ = session.communicate(timeout=INNER_SESSION_S)
        except subprocess.TimeoutExpired:
            session.kill()
            out, _ = session.communicate()
            pytest.fail(f"the session did not end within {INNER_SESSION_S:g} s of SIGTERM:\n{out}")
        survivors = [
            name
            for name, running in (
                (f"redis-server (pid {server_pid})", alive(server_pid)),
                (f"celery worker (group {worker_pid})", alive(worker_pid, group=True)),
            )
            if running
        ]
        assert survivors == [], f"left behind: {survivors}; the session said:\n{out}"
    finally:
        if session.poll() is None:
            session.kill()
            session.communicate()
        if server_pid and alive(server_pid):
            os.kill(server_pid, signal.SIGKILL)
        if worker_pid and alive(worker_pid, group=True):
            os.killpg(worker_pid, signal.SIGKILL)
