"""The Django integration's OpenTelemetry labels: ``fifolock.integration`` is
``django``, and the name template is what the caller (or the command
decorator) gave, never the cache key."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from django.core.management import call_command
from django.test import AsyncClient, Client
from django_app.testing import get_json
from redis import Redis

from tests.support.telemetry import Telemetry, attributes, labels, recording

UNTEMPLATED = labels("(untemplated)", "django")


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    """The lock reports to in-memory OpenTelemetry providers during the test."""
    with recording() as recorded:
        yield recorded


async def test_views_report_waits_and_holds_labelled_django(
    counter_cache: Any, telemetry: Telemetry
) -> None:
    await AsyncClient().get("/async/?hold=0")
    response = await AsyncClient().get("/async/?hold=0")
    assert response.status_code == 200

    [waited] = telemetry.points("fifolock.wait.duration")
    [held] = telemetry.points("fifolock.hold.duration")
    assert attributes(waited) == attributes(held) == UNTEMPLATED
    assert (waited.count, held.count) == (2, 2)


def test_a_sync_view_reports_labelled_django(counter_cache: Any, telemetry: Telemetry) -> None:
    get_json(Client(), "/sync/?hold=0")
    [held] = telemetry.points("fifolock.hold.duration")
    assert attributes(held) == UNTEMPLATED and held.count == 1
    [span] = telemetry.finished("fifolock.hold")
    assert "counter" not in str(attributes(span)), "the cache key was recorded"


def test_a_name_template_given_to_fifo_lock_labels_its_metrics(
    counter_cache: Any, telemetry: Telemetry
) -> None:
    with counter_cache.fifo_lock("invoice-7", timeout=5, name_template="invoice-{id}"):
        pass
    [point] = telemetry.points("fifolock.grant.queue_length")
    assert attributes(point) == labels("invoice-{id}", "django")


def test_a_bad_name_template_is_refused_before_any_io(counter_cache: Any) -> None:
    with pytest.raises(ValueError, match="name_template"):
        counter_cache.fifo_lock("invoice-7", name_template="")


def test_a_locked_command_labels_its_metrics_with_its_lock_name(
    counter_cache: Any, redis: Redis, telemetry: Telemetry
) -> None:
    call_command("locked_job", "alone", lock_timeout=5)
    [point] = telemetry.points("fifolock.hold.duration")
    assert attributes(point) == labels("nightly-job", "django")
