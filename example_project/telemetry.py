"""The lock's OpenTelemetry metrics in the demo, from every process it starts.

Each child of the demo (the Celery worker's pool processes, the web server,
each ``manage.py`` run) records the lock's metrics (``redis_fifo_lock.metrics``)
with an in-memory reader when ``EXAMPLE_TELEMETRY_DIR`` is set, and writes them
to ``<pid>.json`` there: at exit, when a pool process ends, and after each HTTP
request (uvicorn ends on the signal that stopped it, so ``atexit`` never runs
there). The demo adds the files up (``collect``) and prints them
(``format_table``) next to its own table.

A real deployment would configure an exporter (OTLP, Prometheus) instead; the
metrics are the same.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV = "EXAMPLE_TELEMETRY_DIR"
"""Environment variable: the directory (str) each process writes its metrics to."""

_reader: Any = None
_dumping = threading.Lock()
"""Held while a thread writes this process's file: the web server finishes
requests on several threads, and two writers of one file interleave."""


def _after_fork_in_child() -> None:
    # A thread of the parent may have held it at the fork; it is not here to release it.
    global _dumping
    _dumping = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def install() -> None:
    """Record the lock's metrics in this process, if ``EXAMPLE_TELEMETRY_DIR``
    is set, and write them there (``dump``) when the process exits and after
    each HTTP request. Once per process; forked children (Celery's pool)
    inherit the reader and write their own file from ``worker_process_shutdown``
    (``example_project.celery``)."""
    global _reader
    if _reader is not None or not os.environ.get(ENV):
        return
    from django.core.signals import request_finished
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from redis_fifo_lock import metrics

    _reader = InMemoryMetricReader()
    metrics.set_providers(MeterProvider(metric_readers=[_reader]))
    atexit.register(dump)
    request_finished.connect(_dump_after_request, dispatch_uid="example-telemetry")


def _dump_after_request(**kwargs: Any) -> None:
    dump()


def dump() -> None:
    """Write what this process recorded to ``<EXAMPLE_TELEMETRY_DIR>/<pid>.json``
    (nothing if it recorded nothing)."""
    if _reader is None:
        return
    with _dumping:
        _dump_to(Path(os.environ[ENV]), _reader.get_metrics_data())


def _dump_to(folder: Path, data: Any) -> None:
    points = [
        {
            "metric": metric.name,
            "attributes": dict(point.attributes or {}),
            "count": getattr(point, "count", None),
            "sum": getattr(point, "sum", None),
            "max": getattr(point, "max", None),
            "value": getattr(point, "value", None),
        }
        for resource in (data.resource_metrics if data else [])
        for scope in resource.scope_metrics
        for metric in scope.metrics
        for point in metric.data.data_points
    ]
    if not points:
        return
    temporary = folder / f".{os.getpid()}.json"
    temporary.write_text(json.dumps(points))
    temporary.replace(folder / f"{os.getpid()}.json")


@dataclass
class Series:
    """One time series's data points from all processes, added up.

    Attributes:
        count: observations of a histogram (int).
        sum: their sum (float; seconds or requests), or a counter's value.
        max: the largest observation (float), 0 for a counter.
    """

    count: int = 0
    sum: float = 0.0
    max: float = 0.0

    def add(self, point: dict[str, Any]) -> None:
        """Add one process's data point (from ``dump``)."""
        if point["value"] is not None:
            self.sum += point["value"]
            return
        self.count += point["count"]
        self.sum += point["sum"]
        self.max = max(self.max, point["max"])

    @property
    def mean(self) -> float:
        """Mean observation (float), 0 without any."""
        return self.sum / self.count if self.count else 0.0


@dataclass
class Labelled:
    """The metrics of one (integration, name template) pair."""

    integration: str
    template: str
    series: dict[str, Series] = field(default_factory=dict)

    def __getitem__(self, metric: str) -> Series:
        return self.series.get(metric, Series())


def collect(folder: Path) -> list[Labelled]:
    """Add up the files that the processes wrote to ``folder``, by integration and
    name template (successful waits only: a failed one has ``error.type``)."""
    found: dict[tuple[str, str], Labelled] = {}
    for path in sorted(folder.glob("[0-9]*.json")):
        for point in json.loads(path.read_text()):
            attributes = point["attributes"]
            key = (attributes["fifolock.integration"], attributes["fifolock.name_template"])
            labelled = found.setdefault(key, Labelled(*key))
            metric = point["metric"]
            if "error.type" in attributes:
                metric += " (" + attributes["error.type"] + ")"
            labelled.series.setdefault(metric, Series()).add(point)
    return [found[key] for key in sorted(found)]


COLUMNS: Sequence[tuple[str, str]] = (
    ("waits", ">6"),
    ("wait mean", ">10"),
    ("wait max", ">10"),
    ("hold mean", ">10"),
    ("hold max", ">10"),
    ("queue mean", ">10"),
    ("queue max", ">9"),
    ("timeouts", ">8"),
    ("lost", ">4"),
    ("given back", ">10"),
)


def format_table(rows: Iterable[Labelled]) -> str:
    """The metrics as a text table, one line per integration and name template."""
    header = f"{'integration':<11} {'name template':<14} " + " ".join(
        f"{name:{spec}}" for name, spec in COLUMNS
    )
    lines = ["OpenTelemetry metrics (fifolock.*), all processes", header]
    for row in rows:
        wait, hold = row["fifolock.wait.duration"], row["fifolock.hold.duration"]
        queue = row["fifolock.grant.queue_length"]
        values = (
            str(wait.count),
            f"{wait.mean * 1000:.1f} ms",
            f"{wait.max * 1000:.1f} ms",
            f"{hold.mean * 1000:.1f} ms",
            f"{hold.max * 1000:.1f} ms",
            f"{queue.mean:.1f}",
            f"{queue.max:.0f}",
            f"{row['fifolock.wait.timeouts'].sum:.0f}",
            f"{row['fifolock.lease.lost'].sum:.0f}",
            f"{row['fifolock.grant.given_back'].sum:.0f}",
        )
        cells = " ".join(
            f"{value:{spec}}" for value, (_, spec) in zip(values, COLUMNS, strict=True)
        )
        lines.append(f"{row.integration:<11} {row.template:<14} {cells}")
    if len(lines) == 2:
        lines.append("(nothing recorded)")
    return "\n".join(lines)
