"""Celery lock settings: no password in reprs or errors, URLs checked when the
configuration is built (and at worker start), names refused naming the task."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from fifolock_celery import REDIS_URL_SETTING, LockConfig, fifo_locked, start_warnings
from fifolock_celery.names import NameTemplate
from fifolock_celery.server import ServerError, lock_server
from redis_fifo_lock import LockUsageError
from tests.support.celery_worker import unique

SECRET = "c3lery-s3cret"


@pytest.mark.parametrize(
    ("url", "options"),
    [
        (f"redis://:{SECRET}@locks.example:6379/0", None),
        (
            f"sentinel://:{SECRET}@s1.example:26379/0;sentinel://:{SECRET}@s2.example",
            {"master_name": "mymaster", "sentinel_kwargs": {"password": SECRET}},
        ),
        (f"redis://:{SECRET}@n1.example:7000;redis://n2.example:7000", {"cluster": True}),
    ],
    ids=["server", "sentinel", "cluster"],
)
def test_the_lock_server_and_config_never_show_a_password(
    url: str, options: dict[str, Any] | None
) -> None:
    app = Celery("t", broker="memory://")
    app.conf.fifo_lock_redis_url = url
    app.conf.fifo_lock_transport_options = options
    config = LockConfig.from_app(app, "jobs")

    shown = [repr(config), repr(config.server), config.server.describe()]
    shown.append(repr(config.server.clients()))

    assert all(SECRET not in text for text in shown), shown
    assert all("example" in text for text in shown[:3]), shown


def test_an_error_about_the_url_path_never_shows_the_password() -> None:
    with pytest.raises(ServerError, match="database number") as caught:
        lock_server(
            f"sentinel://:{SECRET}@s1.example/x;sentinel://s2.example", {"master_name": "m"}
        )
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize(
    "url",
    [f"http://:{SECRET}@locks.example/0", "redis+socket:///tmp/redis.sock", "locks.example:6379"],
)
def test_an_unsupported_lock_url_is_refused_by_the_config_and_the_start_checks(url: str) -> None:
    app = Celery("t", broker="memory://")
    app.conf.fifo_lock_redis_url = url

    @app.task(shared=False, name="t.checked")
    @fifo_locked("jobs")
    def checked() -> None: ...

    with pytest.raises(LockUsageError, match=REDIS_URL_SETTING) as caught:
        LockConfig.from_app(app, "jobs")
    assert isinstance(caught.value.__cause__, ValueError)
    assert "redis://, rediss://, unix:// or sentinel://" in str(caught.value)
    [message] = [m for m in start_warnings(app) if m.startswith("task t.checked")]
    assert "every execution will fail" in message and REDIS_URL_SETTING in message
    assert SECRET not in message and SECRET not in str(caught.value)


def test_an_argument_with_a_brace_fails_the_task_naming_it(app: Celery) -> None:
    @app.task(shared=False, name="t.braced")
    @fifo_locked("invoice-{invoice}", timeout=5)
    def braced(invoice: str) -> str:
        return invoice

    with pytest.raises(LockUsageError, match=r"task t\.braced") as caught:
        braced.apply(("a{b}",), throw=True)
    assert "'{'" in str(caught.value)
    key = unique("fine")
    assert braced.apply((key,), throw=True).get() == key


def test_a_huge_argument_that_breaks_the_name_gives_a_short_message() -> None:
    def job(invoice: str) -> None: ...

    with pytest.raises(LockUsageError, match=r"task billing\.job") as caught:
        NameTemplate("invoice-{invoice}", job).format(("\u2028" * 1_000_000,), {}, "billing.job")
    assert "U+2028" in str(caught.value)
    assert len(str(caught.value)) < 500
    with pytest.raises(LockUsageError) as caught:
        NameTemplate("obj-{invoice.id}", job).format(("x" * 1_000_000,), {}, "billing.job")
    assert len(str(caught.value)) < 500
