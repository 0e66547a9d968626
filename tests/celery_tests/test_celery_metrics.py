"""The Celery integration's OpenTelemetry labels: ``fifolock.integration`` is
``celery`` and the name template is ``@fifo_locked``'s, never the filled-in
name. Run in this process (``Task.apply``), where the in-memory reader is."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("opentelemetry.sdk")

from celery import Celery

from fifolock_celery import fifo_locked, lock_for
from tests.support.celery_worker import unique
from tests.support.telemetry import Telemetry, attributes, labels, recording


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    """The lock reports to in-memory OpenTelemetry providers during the test."""
    with recording() as recorded:
        yield recorded


def test_a_locked_task_reports_its_name_template_labelled_celery(
    app: Celery, telemetry: Telemetry
) -> None:
    @app.task(shared=False, name="t.metered")
    @fifo_locked("invoice-{invoice}", timeout=5)
    def metered(invoice: str) -> str:
        return invoice

    keys = [unique("m"), unique("m")]
    for key in keys:
        assert metered.apply((key,), throw=True).get() == key

    [waited] = telemetry.points("fifolock.wait.duration")
    [held] = telemetry.points("fifolock.hold.duration")
    assert attributes(waited) == attributes(held) == labels("invoice-{invoice}", "celery")
    assert (waited.count, held.count) == (2, 2)
    spans = telemetry.finished("fifolock.hold")
    assert len(spans) == 2 and not any(key in str(attributes(s)) for s in spans for key in keys)


def test_lock_for_takes_a_name_template(app: Celery, telemetry: Telemetry) -> None:
    lock = lock_for(app, unique("report"), name_template="report-{day}")
    with lock.hold(timeout=5):
        pass
    [point] = telemetry.points("fifolock.grant.queue_length")
    assert attributes(point) == labels("report-{day}", "celery")


def test_a_task_body_s_spans_are_children_of_its_hold(app: Celery, telemetry: Telemetry) -> None:
    tracer = telemetry.tracer()

    @app.task(shared=False, name="t.traced")
    @fifo_locked("traced-{key}", timeout=5)
    def traced(key: str) -> None:
        with tracer.start_as_current_span("body"):
            pass

    traced.apply((unique("t"),), throw=True)
    [hold] = telemetry.finished("fifolock.hold")
    [body] = telemetry.finished("body")
    assert body.parent is not None and body.parent.span_id == hold.context.span_id
