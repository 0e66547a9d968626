"""Reading what the lock reports to OpenTelemetry, in memory (``opentelemetry-sdk``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Metric
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer

from redis_fifo_lock import metrics


@dataclass
class Telemetry:
    """What the lock reported during one test."""

    reader: InMemoryMetricReader
    spans: InMemorySpanExporter
    tracer_provider: TracerProvider

    def tracer(self) -> Tracer:
        """A tracer of the same provider, for the test's own spans."""
        return self.tracer_provider.get_tracer("tests")

    def metric(self, name: str) -> Metric:
        """Metric ``name``; fails the test if it was not recorded."""
        data = self.reader.get_metrics_data()
        found = [
            metric
            for resource in (data.resource_metrics if data else [])
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == name
        ]
        assert len(found) == 1, f"metric {name} was not recorded"
        return found[0]

    def points(self, name: str) -> list[Any]:
        """The data points of metric ``name``."""
        return list(self.metric(name).data.data_points)

    def finished(self, name: str) -> list[ReadableSpan]:
        """The ended spans called ``name``, in the order they ended."""
        return [span for span in self.spans.get_finished_spans() if span.name == name]


@contextmanager
def recording() -> Iterator[Telemetry]:
    """Make the lock report to private in-memory providers inside the block."""
    reader = InMemoryMetricReader()
    spans = InMemorySpanExporter()
    meter_provider = MeterProvider(metric_readers=[reader])
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    metrics.set_providers(meter_provider, tracer_provider)
    try:
        yield Telemetry(reader, spans, tracer_provider)
    finally:
        metrics.set_providers()
        meter_provider.shutdown()
        tracer_provider.shutdown()


def labels(template: str, integration: str) -> dict[str, str]:
    """The two attributes every metric of a lock carries."""
    return {metrics.NAME_TEMPLATE: template, metrics.INTEGRATION: integration}


def attributes(item: Any) -> dict[str, Any]:
    """The attributes of a span or a data point, as a dict."""
    return dict(item.attributes or {})
