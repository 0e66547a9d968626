"""The operator command: ``manage.py fifolock list|status|release --force``, Django's
common options anywhere on the line, and Redis errors as one-line ``CommandError``s.

Run in-process with ``call_command`` where that is enough, and as real
``manage.py`` processes (``django_app.testing.manage``) for exit statuses,
stderr and processes killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from django_app import settings as project
from django_app.testing import finish, manage, wait_entered, wait_until
from redis import Redis

from redis_fifo_lock import FifoLock, Lease, LeaseLost, LoopClients, acl_rules
from redis_fifo_lock.portal import portal
from redis_fifo_lock.testing import PrivateRedisFactory

pytestmark = pytest.mark.filterwarnings("error")

HERE = f"{socket.gethostname()} pid {os.getpid()}"


def run_json(*args: str, capsys: pytest.CaptureFixture[str]) -> Any:
    call_command("fifolock", *args, "--json")
    return json.loads(capsys.readouterr().out)


def acquire_in_thread(cache: Any, name: str) -> tuple[threading.Thread, list[Lease]]:
    """Another thread queues for ``name`` (10 s at most); its lease lands in the list."""
    leases: list[Lease] = []
    thread = threading.Thread(
        target=lambda: leases.append(cache.fifo_lock(name, timeout=10).acquire())
    )
    thread.start()
    return thread, leases


def test_list_shows_every_lock_of_the_namespace_with_holder_fence_and_live_waiters(
    counter_cache: Any, redis: Redis, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with counter_cache.fifo_lock("idle"):
        pass
    # Same name, another namespace: not this cache's lock.
    portal().call("x", lambda: _use_elsewhere(redis_url))
    calls_before = _keys_calls(redis)
    held = counter_cache.fifo_lock("busy").acquire()
    waiter, leases = acquire_in_thread(counter_cache, "busy")
    wait_until(lambda: counter_cache.fifo_lock("busy").status().live_waiting == 1, "a waiter")
    rows = run_json("list", capsys=capsys)
    call_command("fifolock", "list")
    text = capsys.readouterr().out.splitlines()
    counter_cache.fifo_lock("busy").release(held)
    waiter.join(10)
    counter_cache.fifo_lock("busy").release(leases[0])

    assert [row["redis_lock"] for row in rows] == ["tests:3:busy", "tests:3:idle"]
    busy, idle = rows
    assert (busy["held"], busy["holder_fence"], busy["live_waiting"]) == (True, held.fence, 1)
    assert busy["holder"] == HERE
    assert (idle["held"], idle["holder"], idle["live_waiting"]) == (False, None, 0)
    assert text[0].split() == ["lock", "holder", "fence", "live", "waiters", "holder"]
    assert text[1].split() == ["tests:3:busy", str(held.fence), "1", *HERE.split()]
    assert text[2].split() == ["tests:3:idle", "-", "0", "(free)"]
    assert _keys_calls(redis) == calls_before  # SCAN, never KEYS


def test_list_shows_the_good_locks_and_skips_each_odd_key_with_a_short_note(
    counter_cache: Any, redis: Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    with counter_cache.fifo_lock("idle"):
        pass
    keys = "tests:fifolock:{%s}:counters"
    # Foreign keys in the lock namespace: names no lock can have, and a key
    # of the wrong type.
    for name in ["esc\x1b[31mape", "L" * 100_000, "a{b"]:
        redis.hset(keys % name, "x", "1")
    redis.sadd(keys % "tests:3:wrongtype", "x")
    rows = run_json("list", capsys=capsys)
    call_command("fifolock", "list")
    captured = capsys.readouterr()

    assert [row["redis_lock"] for row in rows] == ["tests:3:idle"]
    assert [line.split()[0] for line in captured.out.splitlines()] == ["lock", "tests:3:idle"]
    notes = captured.err.splitlines()
    assert len(notes) == 4, notes
    assert all(note.startswith("fifolock list: skipped ") for note in notes), notes
    assert all(len(note) <= 500 for note in notes), notes
    assert "\x1b" not in captured.err
    assert any("'tests:3:wrongtype'" in note and "WRONGTYPE" in note for note in notes), notes


async def _use_elsewhere(redis_url: str) -> None:
    lock = FifoLock(LoopClients(redis_url), "busy", namespace="another-app")
    await lock.release(await lock.acquire(timeout=5))


def _keys_calls(redis: Redis) -> int:
    stats = redis.info("commandstats").get("cmdstat_keys", {})
    return int(stats.get("calls", 0)) if isinstance(stats, dict) else 0


def test_status_names_the_holder_and_counts_only_live_waiters(
    redis_url: str, counter_cache: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = counter_cache.fifo_lock("batch")
    held = lock.acquire()
    waiter = manage(redis_url, "fifolock", "run", "batch", "--", "plain_job", "killed")
    wait_until(lambda: lock.status().live_waiting == 1, "the waiter process is queued")
    os.kill(waiter.pid, signal.SIGKILL)
    assert finish(waiter)[0] == -signal.SIGKILL
    # Its liveness lasts LEASE_MS (600 ms) after its last poll.
    wait_until(lambda: lock.status().live_waiting == 0, "the killed waiter stops counting")
    call_command("fifolock", "status", "batch")
    lines = capsys.readouterr().out.splitlines()
    data = run_json("status", "batch", capsys=capsys)
    lock.release(held)

    assert lines[1] == f"held        yes, by fence {held.fence} (ticket {held.ticket})"
    assert lines[2] == f"holder      {HERE}"
    assert lines[4] == "waiting     0 (and 1 of dead processes)"
    assert (data["holder"], data["waiting"], data["live_waiting"]) == (HERE, 1, 0)


def test_status_of_an_unknown_name_says_there_is_no_such_lock(
    counter_cache: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    call_command("fifolock", "status", "never-used")
    lines = capsys.readouterr().out.splitlines()
    data = run_json("status", "never-used", capsys=capsys)

    assert lines == [
        "lock        never-used (Redis lock 'tests:3:never-used', FIFOLOCK['CACHE'])",
        "state       no such lock (never used, or expired)",
    ]
    assert (data["exists"], data["held"], data["last_fence"]) == (False, False, 0)


def test_release_force_frees_the_lock_the_holder_loses_it_and_the_next_gets_a_higher_fence(
    counter_cache: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = counter_cache.fifo_lock("stuck")
    held = lock.acquire()
    waiter, leases = acquire_in_thread(counter_cache, "stuck")
    wait_until(lambda: lock.status().live_waiting == 1, "a waiter")
    with pytest.raises(CommandError, match="pass --force"):
        call_command("fifolock", "release", "stuck")
    with pytest.raises(CommandError, match="not held with fence 1: nothing was released"):
        call_command("fifolock", "release", "--force", "stuck", "--fence", "1")
    call_command("fifolock", "release", "stuck", "--force")
    out = capsys.readouterr().out
    waiter.join(10)
    # The holder's renewal (every LEASE_MS / 3) is refused: its lease is lost.
    wait_until(lambda: held.lost, "the evicted holder's next renewal")

    assert f"held by fence {held.fence}; its holder's next renewal fails" in out
    assert leases[0].fence > held.fence
    assert "refused" in (held.lost_reason or "")
    with pytest.raises(LeaseLost):
        lock.release(held)
    assert lock.status().holder_fence == leases[0].fence
    lock.release(leases[0])


def test_django_s_common_options_are_accepted_after_the_subcommand(
    redis_url: str, counter_cache: Any
) -> None:
    status = finish(
        manage(
            redis_url,
            "fifolock",
            "status",
            "x",
            "-v",
            "2",
            "--traceback",
            "--settings",
            "django_app.settings",
            "--no-color",
        )
    )
    ran = finish(
        manage(redis_url, "fifolock", "run", "x", "--verbosity", "2", "--", "plain_job", "me")
    )

    assert status[0] == 0, status[2]
    assert ran[:2] == (0, "me ran\n"), ran[2]
    assert "fifolock: 'tests:3:x' held with fence" in ran[2]


@pytest.mark.parametrize("action", [["status", "x"], ["list"], ["release", "--force", "x"]])
def test_redis_down_is_a_one_line_command_error_saying_what_to_check(
    action: list[str],
) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"redis://127.0.0.1:{probe.getsockname()[1]}/0"
    code, out, err = finish(manage(dead, "fifolock", *action))

    assert (code, out) == (1, "")
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("CommandError: ")
    assert "check that the server is reachable" in err or "check that the server is running" in err
    assert dead.rsplit("/", 1)[0].removeprefix("redis://") in err


def test_list_as_a_user_the_acl_refuses_scan_says_to_add_scan(redis_url: str, redis: Redis) -> None:
    # Exactly the lock's rules, which do not include SCAN.
    rules = acl_rules("tests", database=True)
    redis.execute_command(
        "ACL", "SETUSER", "noscan", "reset", "resetchannels", "on", ">pw-x", *rules
    )
    parts = urlsplit(redis_url)
    url = urlunsplit(parts._replace(netloc=f"noscan:pw-x@{parts.hostname}:{parts.port}"))
    try:
        with (
            override_settings(CACHES=project.caches_for(url)),
            pytest.raises(CommandError) as caught,
        ):
            call_command("fifolock", "list")
    finally:
        redis.acl_deluser("noscan")
    message = str(caught.value)

    assert "ACL" in message and "'scan'" in message and "+scan" in message, message
    assert "docs/security.md" in message, message
    assert "LOCATION" not in message and "pw-x" not in message, message
    assert "\n" not in message, message


def test_run_against_a_frozen_redis_says_redis_did_not_answer_not_that_the_lock_is_busy(
    fresh_redis_server: PrivateRedisFactory,
) -> None:
    server = fresh_redis_server()
    os.kill(server.pid, signal.SIGSTOP)
    try:
        code, out, err = finish(
            manage(server.url, "fifolock", "run", "foo", "--lock-timeout", "1", "--", "check")
        )
    finally:
        os.kill(server.pid, signal.SIGCONT)
    lines = err.strip().splitlines()
    [error] = [line for line in lines if line.startswith("CommandError: ")]

    assert (code, out) == (1, ""), err
    assert "Redis did not answer" in error, err
    assert "busy" not in error and "--lock-timeout" not in error, err
    assert f"127.0.0.1:{server.port}" in error, err


def _dead_url() -> str:
    """A Redis URL on a port nobody listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"redis://127.0.0.1:{probe.getsockname()[1]}/0"


@pytest.mark.parametrize(
    "line",
    [["locked_job", "me"], ["fifolock", "run", "nightly-job", "--", "locked_job", "me"]],
    ids=["decorated", "run-of-decorated"],
)
def test_redis_down_under_a_decorated_command_is_a_one_line_command_error(
    line: list[str],
) -> None:
    dead = _dead_url()
    code, out, err = finish(manage(dead, *line))

    # Around it the core may log one warning line (its queued request could
    # not be withdrawn yet); never a traceback.
    lines = err.strip().splitlines()
    [last] = [line for line in lines if line.startswith("CommandError: ")]
    assert (code, out) == (1, ""), err
    assert all("could not withdraw request" in line for line in lines if line != last), err
    assert last.startswith("CommandError: FIFO lock 'tests:3:nightly-job'"), err
    assert "check that the server is reachable" in last, err
    assert dead.rsplit("/", 1)[0].removeprefix("redis://") in last, err


def test_a_decorated_command_whose_lease_was_lost_ends_with_a_one_line_command_error(
    redis_url: str, redis: Redis
) -> None:
    job = manage(redis_url, "locked_job", "me", "--hold-until", "go")
    wait_entered(redis, "me")
    call_command("fifolock", "release", "--force", "nightly-job")
    redis.rpush("go", "1")
    code, out, err = finish(job)

    assert (code, out.split()[:3]) == (1, ["me", "held", "fence"]), err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("CommandError: "), err
    assert "'tests:3:nightly-job'" in err, err


BAD_NAMES = ["{x}", "esc\x1bape", "", "n" * 3000]


@pytest.mark.parametrize("name", BAD_NAMES, ids=["braces", "escape", "empty", "3000-bytes"])
@pytest.mark.parametrize(
    "action",
    [("status",), ("release", "--force"), ("run",)],
    ids=lambda action: action[0],
)
def test_a_bad_lock_name_is_a_short_command_error(
    counter_cache: Any, action: tuple[str, ...], name: str
) -> None:
    tail = ("--", "check") if action[0] == "run" else ()
    with pytest.raises(CommandError, match="lock name") as caught:
        call_command("fifolock", *action, name, *tail)
    message = str(caught.value)
    assert "\n" not in message and "\x1b" not in message
    assert len(message) < 600, message


@pytest.mark.parametrize("action", [("list",), ("status", "x")], ids=["list", "status"])
@pytest.mark.parametrize("alias", ["nope", "a" * 3000])
def test_an_unknown_cache_alias_is_a_short_command_error(
    counter_cache: Any, action: tuple[str, ...], alias: str
) -> None:
    with pytest.raises(CommandError, match="--cache") as caught:
        call_command("fifolock", *action, "--cache", alias)
    message = str(caught.value)
    assert "'default'" in message  # the aliases there are
    assert len(message) < 600, message


@pytest.mark.parametrize("action", [("list",), ("status", "x")], ids=["list", "status"])
def test_a_key_prefix_that_cannot_prefix_lock_keys_is_a_short_command_error(
    redis_url: str, action: tuple[str, ...]
) -> None:
    entry = {"BACKEND": project.BACKENDS["django-redis"], "LOCATION": redis_url}
    braces = override_settings(CACHES={"default": {**entry, "KEY_PREFIX": "{tenant}"}})
    with braces, pytest.raises(CommandError, match="KEY_PREFIX") as caught:
        call_command("fifolock", *action)
    message = str(caught.value)
    assert message.startswith(f"fifolock {action[0]}: "), message
    assert "\n" not in message and len(message) < 600, message


@pytest.mark.parametrize("fence", ["0", "-5", "x"])
def test_release_with_a_fence_that_is_not_a_positive_int_is_a_one_line_command_error(
    counter_cache: Any, fence: str
) -> None:
    with pytest.raises(CommandError, match="--fence") as caught:
        call_command("fifolock", "release", "--force", "stuck", "--fence", fence)
    message = str(caught.value)
    assert "positive" in message and "\n" not in message, message
