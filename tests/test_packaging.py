"""Installing the package the way the README says, into a fresh virtual environment.

The test copies the checkout (the files git tracks or would track, as a fresh
clone of this working tree holds), makes a virtual environment with
``python -m venv``, and installs the copy with pip, using the README's install
line as written (the package name swapped for the copy's path) and the
machine's pip configuration. Then it starts that environment's ``celery``
worker, prefork with two processes, on a private Redis server as broker, and
has it run a ``@fifo_locked`` task: the worker must start, both processes must
run the task, one at a time, with rising fences.

It is marked ``slow`` (it downloads and installs Django, Celery and their
dependencies, about a minute) and runs only with ``-m slow``, as ``.ci/run``
does.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("celery")

from celery import Celery
from celery.exceptions import TimeoutError as ResultTimeout

from redis_fifo_lock.testing import private_redis_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("redis_fifo_lock", "fifolock_celery", "fifolock_django")
INSTALL_LINE = re.compile(r'^pip install "redis-fifo-lock\[(?P<extras>[a-z,]+)\]"$', re.MULTILINE)
"""The README's install line: ``pip install "redis-fifo-lock[django,celery]"``."""
INSTALL_TIMEOUT_S = 600.0
"""Seconds pip may take to install the package and its dependencies."""
RESULT_TIMEOUT_S = 60.0
"""Seconds the worker may take to start and run every task."""
TASKS = 8

SMOKE_APP = '''\
"""The Celery app the installed worker runs: one locked task that keeps a record."""

import os
import time

from celery import Celery
from redis import Redis

import fifolock_celery
from fifolock_celery import current_lease, fifo_locked

URL = os.environ["FIFOLOCK_SMOKE_URL"]
app = Celery("smoke_app", broker=URL, backend=URL)


@app.task
@fifo_locked("smoke-{batch}", timeout=60)
def locked(batch: str, number: int) -> dict[str, object]:
    record = Redis.from_url(URL)
    entered = time.monotonic_ns()
    inside = record.incr(f"inside:{batch}")
    time.sleep(0.1)  # the workload: long enough for the other process to queue
    record.decr(f"inside:{batch}")
    return {
        "number": number,
        "pid": os.getpid(),
        "fence": current_lease().fence,
        "inside": inside,
        "entered_ns": entered,
        "exited_ns": time.monotonic_ns(),
        "module": fifolock_celery.__file__,
    }
'''

INSPECT_INSTALL = """\
import importlib.metadata, importlib.resources, json
meta = importlib.metadata.metadata("redis-fifo-lock")
print(json.dumps({
    "typed": {p: importlib.resources.files(p).joinpath("py.typed").is_file() for p in %r},
    "classifiers": meta.get_all("Classifier") or [],
    "urls": meta.get_all("Project-URL") or [],
}))
"""


def readme_install_extras() -> str:
    """The extras (str, e.g. ``"django,celery"``) of the README's install line."""
    found = INSTALL_LINE.search((ROOT / "README.md").read_text())
    assert found, 'README.md has no line `pip install "redis-fifo-lock[...]"`'
    return found["extras"]


def copy_checkout(dest: Path) -> Path:
    """Copy the files git tracks or would track (not ignored) to ``dest``; return it."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return dest


def clean_env(**extra: str) -> dict[str, str]:
    """The environment minus whatever points Python at this checkout or its venv."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "UV_PROJECT_ENVIRONMENT"}
    }
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@contextlib.contextmanager
def running(
    command: list[str], cwd: Path, env: dict[str, str], log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``command`` in a session of its own; SIGTERM, then SIGKILL, its group at the end."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # pool children left behind, if any


def results(worker: subprocess.Popen[bytes], log: Path, pending: list[Any]) -> list[Any]:
    """Every task's result, failing at once (with the worker's log) if the worker exits."""
    deadline = time.monotonic() + RESULT_TIMEOUT_S
    done: list[Any] = []
    for result in pending:
        while True:
            if worker.poll() is not None:
                pytest.fail(
                    f"the installed worker exited with {worker.returncode}:\n"
                    f"{log.read_text(errors='replace')[-4000:]}"
                )
            if time.monotonic() > deadline:
                pytest.fail(
                    f"the installed worker did not run {len(pending)} tasks within "
                    f"{RESULT_TIMEOUT_S} s (raise RESULT_TIMEOUT_S):\n"
                    f"{log.read_text(errors='replace')[-4000:]}"
                )
            try:
                done.append(result.get(timeout=0.5))
                break
            except ResultTimeout:
                continue
    return done


def test_the_readme_install_line_gives_a_prefork_worker_that_runs_a_locked_task(
    tmp_path: Path,
) -> None:
    extras = readme_install_extras()
    assert "celery" in extras.split(","), f"the README's install line has no celery extra: {extras}"
    checkout = copy_checkout(tmp_path / "clone")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=clean_env())
    python = venv / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", f"{checkout}[{extras}]"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    assert install.returncode == 0, f"pip install failed:\n{install.stdout}\n{install.stderr}"

    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "smoke_app.py").write_text(SMOKE_APP)
    with private_redis_server() as server:
        env = clean_env(FIFOLOCK_SMOKE_URL=server.url, PATH=f"{venv / 'bin'}:{os.environ['PATH']}")
        command = [
            str(venv / "bin" / "celery"),
            "-A",
            "smoke_app",
            "worker",
            "--pool=prefork",
            "--concurrency=2",
            "--loglevel=INFO",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        log = tmp_path / "worker.log"
        with running(command, app_dir, env, log) as worker:
            client = Celery("smoke_client", broker=server.url, backend=server.url)
            try:
                pending = [
                    client.send_task("smoke_app.locked", args=["batch", number])
                    for number in range(TASKS)
                ]
                holds = results(worker, log, pending)
            finally:
                client.close()

    assert all(Path(hold["module"]).is_relative_to(venv) for hold in holds), holds
    assert len({hold["pid"] for hold in holds}) == 2, f"not both processes ran tasks: {holds}"
    assert all(hold["inside"] == 1 for hold in holds), f"two tasks inside at once: {holds}"
    by_entry = sorted(holds, key=lambda hold: hold["entered_ns"])
    for before, after in itertools.pairwise(by_entry):
        assert before["exited_ns"] <= after["entered_ns"], f"overlap: {before} {after}"
        assert before["fence"] < after["fence"], f"fences not rising: {before} {after}"

    inspected = subprocess.run(
        [str(python), "-c", INSPECT_INSTALL % (PACKAGES,)],
        cwd=tmp_path,
        env=clean_env(),
        check=True,
        capture_output=True,
        text=True,
    )
    installed = json.loads(inspected.stdout)
    assert installed["typed"] == dict.fromkeys(PACKAGES, True)
    assert {"Framework :: Django", "Framework :: Celery", "Typing :: Typed"} <= set(
        installed["classifiers"]
    )
    assert installed["urls"], "no project URLs in the installed metadata"
