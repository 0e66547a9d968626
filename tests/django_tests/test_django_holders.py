"""Who holds a lock, and no waiting for yourself, in the Django integration.

Requests (through Django's real test clients), ``@fifo_locked_command``
commands and ``fifolock run`` record what they are in the holder description;
a nested ``with cache.fifo_lock(name)`` and ``fifolock run`` over a command
that takes the same lock never wait for themselves.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import AsyncClient, Client
from django_app import record
from django_app.management.commands.locked_job import JOB_LOCK
from django_app.testing import finish, manage, wait_entered
from redis import Redis

from redis_fifo_lock import LockUsageError

pytestmark = [pytest.mark.filterwarnings("error"), pytest.mark.timeout(60)]

HERE = f"{socket.gethostname()} pid {os.getpid()}"


def test_a_nested_with_of_the_same_lock_is_refused_at_once(counter_cache: Any) -> None:
    with counter_cache.fifo_lock("x") as lease:
        with pytest.raises(LockUsageError) as info, counter_cache.fifo_lock("x"):
            pass
        assert counter_cache.fifo_lock("x").status().waiting == 0
    message = str(info.value)
    assert message.startswith("FIFO lock 'tests:3:x': already held (fence ")
    assert f"fence {lease.fence}) by thread " in message
    assert not counter_cache.fifo_lock("x").status().held


def test_a_view_that_nests_its_lock_fails_instead_of_hanging(counter_cache: Any) -> None:
    with pytest.raises(LockUsageError, match="not reentrant"):
        Client().get("/nested/?lock=view")
    assert not counter_cache.fifo_lock("view").status().held


def test_a_sync_view_s_lock_records_the_request_method_and_path(counter_cache: Any) -> None:
    response = Client().get("/holder/?lock=h&secret=do-not-show")
    with counter_cache.fifo_lock("h"):
        after = counter_cache.fifo_lock("h").status().holder

    assert response.json() == {"holder": f"{HERE}: request GET /holder/"}
    assert after == HERE  # the request's description ends with it


async def test_an_async_view_s_lock_records_the_request_method_and_path(
    counter_cache: Any,
) -> None:
    response = await AsyncClient().get("/aholder/?lock=h")
    assert response.json() == {"holder": f"{HERE}: request GET /aholder/"}


def test_a_locked_command_records_its_name(
    redis_url: str, counter_cache: Any, redis: Redis
) -> None:
    run = manage(redis_url, "locked_job", "me", "--hold-until", "go")
    wait_entered(redis, "me")
    holder = counter_cache.fifo_lock(JOB_LOCK).status().holder
    redis.rpush("go", "go")

    assert finish(run)[0] == 0
    assert holder.endswith(f"pid {run.pid}: manage.py locked_job")


def test_fifolock_run_over_a_command_taking_the_same_lock_runs_it_once_without_deadlock(
    redis_url: str, counter_cache: Any, redis: Redis
) -> None:
    code, out, err = finish(
        manage(redis_url, "fifolock", "run", JOB_LOCK, "--", "locked_job", "me")
    )

    assert code == 0, err
    assert out.startswith("me held fence ")
    assert [hold["who"] for hold in record.holds(redis)] == ["me"]


def test_fifolock_run_hands_its_lock_options_to_a_command_taking_the_same_lock(
    counter_cache: Any, redis: Redis
) -> None:
    with counter_cache.fifo_lock(JOB_LOCK) as held, pytest.raises(CommandError) as info:
        call_command("fifolock", "run", JOB_LOCK, "--no-wait", "--", "locked_job", "me")
    assert f"held by fence {held.fence}" in str(info.value)
    assert record.entries(redis) == []


def test_fifolock_run_over_a_command_taking_the_lock_in_its_body_refuses_at_once(
    counter_cache: Any,
) -> None:
    with pytest.raises(CommandError) as info:
        call_command("fifolock", "run", "body", "--", "cache_locked_job", "body")

    message = str(info.value)
    assert message.startswith("cache_locked_job takes FIFO lock 'body' itself")
    assert "already held (fence " in message
    assert not counter_cache.fifo_lock("body").status().held


def test_fifolock_run_over_a_command_taking_the_lock_in_its_body_with_a_timeout_says_so(
    counter_cache: Any,
) -> None:
    with pytest.raises(CommandError) as info:
        call_command(
            "fifolock", "run", "body", "--", "cache_locked_job", "body", "--timeout", "0.3"
        )

    message = str(info.value)
    assert message.startswith("cache_locked_job takes FIFO lock 'body' itself"), message
    assert "waited 0.3" in message and "\n" not in message, message
    assert not counter_cache.fifo_lock("body").status().held
