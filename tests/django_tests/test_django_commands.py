"""Management commands: ``fifo_locked_command`` and ``manage.py fifolock status|run``.

The contention tests start real ``manage.py`` processes (``python -m django``
on ``tests/django_app``) against the session's Redis and judge them from the
shared record (``django_app.record``) and their exit status and output. A run
that must hold the lock until the test says so blocks on a Redis list
(``--hold-until KEY``) and announces on ``ENTERED`` that it is inside.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django_app import record
from django_app.management.commands.locked_job import JOB_LOCK
from django_app.testing import finish, manage, wait_entered, wait_until
from redis import Redis

from fifolock_django.commands import fifo_locked_command

pytestmark = pytest.mark.filterwarnings("error")


# --- fifo_locked_command ---------------------------------------------------------------


def test_two_command_processes_are_served_one_after_another_in_arrival_order(
    redis_url: str, counter_cache: Any, redis: Redis
) -> None:
    job_lock = counter_cache.fifo_lock(JOB_LOCK)
    first = manage(redis_url, "locked_job", "first", "--hold-until", "go:first")
    wait_entered(redis, "first")
    second = manage(redis_url, "locked_job", "second")
    wait_until(lambda: job_lock.status().waiting == 1, "the second run to queue")
    redis.rpush("go:first", "go")

    first_code, first_out, _ = finish(first)
    second_code, second_out, _ = finish(second)
    holds = record.holds(redis)
    assert [(hold["who"]) for hold in holds] == ["first", "second"]
    assert (first_code, first_out) == (0, f"first held fence {holds[0]['fence']}\n")
    assert (second_code, second_out) == (0, f"second held fence {holds[1]['fence']}\n")
    assert holds[0]["fence"] < holds[1]["fence"]
    assert holds[0]["ticket"] < holds[1]["ticket"]


def test_a_command_lock_timeout_exits_non_zero_naming_lock_wait_and_fence(
    redis_url: str, redis: Redis
) -> None:
    holder = manage(redis_url, "locked_job", "holder", "--hold-until", "go:holder")
    wait_entered(redis, "holder")
    late = manage(redis_url, "locked_job", "late", "--lock-timeout", "0.3")
    code, out, err = finish(late)
    redis.rpush("go:holder", "go")

    assert (code, out) == (1, "")
    assert "CommandError: FIFO lock 'nightly-job' (Redis lock 'tests:3:nightly-job') is busy" in err
    assert "not acquired within 0.3 s (waited 0.3" in err
    holder_code, holder_out, _ = finish(holder)
    holds = record.holds(redis)
    assert [hold["who"] for hold in holds] == ["holder"]
    assert f"held by fence {holds[0]['fence']}." in err
    assert (holder_code, holder_out) == (0, f"holder held fence {holds[0]['fence']}\n")


def test_no_wait_fails_at_once_with_the_holder_fence(counter_cache: Any, redis: Redis) -> None:
    with counter_cache.fifo_lock(JOB_LOCK) as held, pytest.raises(CommandError) as info:
        call_command("locked_job", "late", no_wait=True)
    assert f"held by fence {held.fence}." in str(info.value)
    assert "within 0 s" in str(info.value)
    assert record.entries(redis) == []


def test_a_locked_command_runs_holding_the_lock_with_its_lease(
    counter_cache: Any, redis: Redis
) -> None:
    call_command("locked_job", "alone", lock_timeout=5)
    call_command("locked_job", "again")

    holds = record.holds(redis)
    assert [hold["who"] for hold in holds] == ["alone", "again"]
    assert 0 < holds[0]["fence"] < holds[1]["fence"]
    assert not counter_cache.fifo_lock(JOB_LOCK).status().held


def test_fifo_locked_command_only_decorates_a_command_handle() -> None:
    with pytest.raises(Exception) as info:

        class NotACommand:
            @fifo_locked_command("x")
            def handle(self) -> None:
                pass

    # Python < 3.12 wraps errors of __set_name__ in a RuntimeError.
    error = info.value.__cause__ or info.value
    assert isinstance(error, TypeError)
    assert "NotACommand is not a django BaseCommand" in str(error)


def test_the_decorator_adds_lock_options_next_to_the_command_s_own() -> None:
    class Command(BaseCommand):
        def add_arguments(self, parser: Any) -> None:
            parser.add_argument("--mine")

        @fifo_locked_command("x", timeout=2.5)
        def handle(self, *args: Any, **options: Any) -> None:
            pass

    parser = Command().create_parser("manage.py", "job")
    options = vars(parser.parse_args(["--mine", "1", "--lock-timeout", "4"]))
    assert (options["mine"], options["lock_timeout"], options["no_wait"]) == ("1", 4.0, False)
    assert "default: 2.5 s" in " ".join(parser.format_help().split())
    with pytest.raises(CommandError, match="not allowed with argument"):
        parser.parse_args(["--no-wait", "--lock-timeout", "1"])


def test_a_locked_command_subclassing_a_locked_command_gets_the_lock_options_once() -> None:
    class Base(BaseCommand):
        def add_arguments(self, parser: Any) -> None:
            parser.add_argument("--base")

        @fifo_locked_command("x", timeout=2.5)
        def handle(self, *args: Any, **options: Any) -> None:
            pass

    class Sub(Base):
        def add_arguments(self, parser: Any) -> None:
            super().add_arguments(parser)
            parser.add_argument("--sub")

        @fifo_locked_command("y", timeout=7)
        def handle(self, *args: Any, **options: Any) -> None:
            pass

    parser = Sub().create_parser("manage.py", "job")
    options = vars(parser.parse_args(["--base", "1", "--sub", "2", "--lock-timeout", "4"]))
    assert (options["base"], options["sub"], options["lock_timeout"]) == ("1", "2", 4.0)
    shown = " ".join(parser.format_help().split())
    assert shown.count("seconds to wait for the command's FIFO lock") == 1
    assert "default: 7 s" in shown  # the subclass's own lock
    base = vars(Base().create_parser("manage.py", "job").parse_args(["--no-wait"]))
    assert base["no_wait"] is True


# --- manage.py fifolock --------------------------------------------------------------------


def status_json(redis_url: str, name: str, backend: str = "django-redis") -> dict[str, Any]:
    """``manage.py fifolock status NAME --json`` in a process of its own."""
    code, out, err = finish(
        manage(redis_url, "fifolock", "status", name, "--json", backend=backend)
    )
    assert code == 0, err
    data: dict[str, Any] = json.loads(out)
    return data


def test_fifolock_run_serialises_an_unlocked_command_across_processes(
    redis_url: str, counter_cache: Any, redis: Redis
) -> None:
    first = manage(
        redis_url, "fifolock", "run", "batch", "--", "plain_job", "first", "--hold-until", "go"
    )
    wait_entered(redis, "first")
    second = manage(redis_url, "fifolock", "run", "batch", "--", "plain_job", "second")
    lock = counter_cache.fifo_lock("batch")
    wait_until(lambda: lock.status().waiting == 1, "the second run to queue")
    held = status_json(redis_url, "batch")
    redis.rpush("go", "go")

    assert finish(first)[:2] == (0, "first ran\n")
    assert finish(second)[:2] == (0, "second ran\n")
    assert [hold["who"] for hold in record.holds(redis)] == ["first", "second"]
    assert held["held"] and held["holder_fence"] == held["last_fence"] > 0
    assert (held["redis_lock"], held["waiting"]) == ("tests:3:batch", 1)
    assert 0 < held["lease_left_ms"] <= 600
    after = status_json(redis_url, "batch")
    assert after["last_fence"] > held["last_fence"]
    assert held["holder"].endswith(": manage.py fifolock run -- plain_job")
    assert after == {
        "name": "batch",
        "cache": None,
        "redis_lock": "tests:3:batch",
        "exists": True,
        "held": False,
        "holder": None,
        "holder_fence": None,
        "holder_ticket": None,
        "lease_left_ms": None,
        "waiting": 0,
        "live_waiting": 0,
        "last_fence": after["last_fence"],
    }


def test_fifolock_status_prints_holder_fence_waiting_and_lease_left(
    counter_cache: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with counter_cache.fifo_lock("report") as lease:
        call_command("fifolock", "status", "report", "--cache", "default")
        held = capsys.readouterr().out.splitlines()
    call_command("fifolock", "status", "report")
    free = capsys.readouterr().out.splitlines()

    assert free == [
        "lock        report (Redis lock 'tests:3:report', FIFOLOCK['CACHE'])",
        "held        no",
        "holder      -",
        "lease left  -",
        "waiting     0",
        f"last fence  {lease.fence}",
    ]
    assert held[0] == "lock        report (Redis lock 'tests:3:report', cache 'default')"
    assert held[1] == f"held        yes, by fence {lease.fence} (ticket {lease.ticket})"
    assert held[2] == f"holder      {socket.gethostname()} pid {os.getpid()}"
    assert held[3].startswith("lease left  0.") and held[3].endswith(" s unless renewed")
    assert held[4:] == ["waiting     0", f"last fence  {lease.fence}"]


def test_fifolock_run_gives_up_after_the_lock_timeout_naming_the_holder_fence(
    counter_cache: Any, redis: Redis
) -> None:
    with counter_cache.fifo_lock("batch") as held, pytest.raises(CommandError) as info:
        call_command("fifolock", "run", "batch", "--lock-timeout", "0.2", "--", "plain_job", "x")

    message = str(info.value)
    assert "FIFO lock 'batch' (Redis lock 'tests:3:batch') is busy" in message
    assert "not acquired within 0.2 s (waited 0.2" in message
    assert f"held by fence {held.fence}." in message
    assert record.entries(redis) == []


def test_fifolock_run_keeps_the_command_s_failure_and_releases_the_lock(
    redis_url: str, counter_cache: Any, redis: Redis
) -> None:
    code, out, err = finish(
        manage(redis_url, "fifolock", "run", "batch", "--no-wait", "--", "plain_job", "x", "--fail")
    )

    assert (code, out) == (3, "")
    assert "CommandError: x failed on purpose" in err
    assert not counter_cache.fifo_lock("batch").status().held
    assert [hold["who"] for hold in record.holds(redis)] == ["x"]


def test_fifolock_run_refuses_an_unknown_command_before_taking_the_lock(
    counter_cache: Any,
) -> None:
    with pytest.raises(CommandError, match="Unknown command: 'no_such_command'"):
        call_command("fifolock", "run", "batch", "--", "no_such_command")
    assert counter_cache.fifo_lock("batch").status().last_fence == 0


def test_fifolock_works_on_django_s_builtin_redis_backend(redis_url: str, redis: Redis) -> None:
    code, out, err = finish(
        manage(redis_url, "fifolock", "run", "b", "--", "plain_job", "x", backend="builtin")
    )
    assert (code, out) == (0, "x ran\n"), err
    assert status_json(redis_url, "b", backend="builtin")["last_fence"] > 0
