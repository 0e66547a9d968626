"""OpenTelemetry metrics and spans of the lock (the ``otel`` extra).

With ``opentelemetry-api`` installed (``pip install "redis-fifo-lock[otel]"``)
every lock reports to the global meter and tracer providers, or to those given
to ``set_providers``; without an OpenTelemetry SDK configured, those are the
API's no-ops. Without ``opentelemetry-api`` every hook here returns at once and
nothing of OpenTelemetry is imported.

Metrics (instrumentation scope ``redis_fifo_lock``):

- ``fifolock.wait.duration`` (histogram, ``s``): one ``acquire``, from its call
  to its grant or failure (``error.type`` names the exception).
- ``fifolock.hold.duration`` (histogram, ``s``): from the grant to the release
  (``error.type`` is ``LeaseLost`` when the lease had been lost).
- ``fifolock.grant.queue_length`` (histogram, ``{request}``): requests still
  queued behind a grant when its holder took it.
- ``fifolock.wait.timeouts`` (counter, ``{request}``): ``acquire`` calls that
  raised ``LockTimeout``.
- ``fifolock.lease.lost`` (counter, ``{lease}``): leases lost while held
  (renewal refused, or unanswered until the lease ran out, or not held at
  release).
- ``fifolock.grant.given_back`` (counter, ``{grant}``): grants this process gave
  back because nobody waited for them any more (the waiter gave up, timed out
  or was cancelled as it was granted).

Spans: ``fifolock.wait`` around each ``acquire`` and ``fifolock.hold`` from
grant to release (with ``fifolock.fence`` and ``fifolock.ticket``), both of
kind INTERNAL, with an error status when the wait failed or the lease was lost.
Both are children of the span current where ``acquire`` was called (also for
``SyncFifoLock``, whose calls run on the portal thread), and inside a
``hold()`` block the hold's span is the current one.

Every metric and span carries two attributes, both of bounded cardinality:
``fifolock.name_template`` (the lock's name template, never its filled-in name;
see ``lock_labels``) and ``fifolock.integration`` (``core``, ``django`` or
``celery``). The lock's name itself is never recorded: it may hold an id.
"""

from __future__ import annotations

import os
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING

from . import native
from .errors import LockTimeout

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Span, TracerProvider

    from .lease import Lease
    from .protocol import LockKeys

try:
    from opentelemetry import context as otel_context
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace as otel_trace
except ImportError:  # the otel extra is not installed: every hook is a no-op
    OTEL = False
else:
    OTEL = True
# OTEL: whether opentelemetry-api is installed (bool); nothing is recorded if not.

NAME_TEMPLATE = "fifolock.name_template"
"""Attribute: the lock's name template (str)."""
INTEGRATION = "fifolock.integration"
"""Attribute: what made the lock: ``core``, ``django`` or ``celery`` (str)."""
ERROR_TYPE = "error.type"
"""Attribute (OpenTelemetry's): the exception class a wait failed with, or
``LeaseLost`` for a hold whose lease was lost."""

DEFAULT_NAME_TEMPLATE = "(untemplated)"
"""``fifolock.name_template`` of a lock made without ``name_template``: one value
for all of them, since a filled-in name (``customer-42``) would make one time
series per customer."""
INTEGRATIONS = ("core", "django", "celery")
"""The values of ``fifolock.integration``."""
MAX_TEMPLATE_LENGTH = 1024
"""Longest ``name_template`` accepted, in characters (as long as a lock name may be)."""

DURATION_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0
)  # fmt: skip
"""Bucket boundaries advised for the two duration histograms, in seconds: from a
grant without contention (milliseconds) to ``max_hold_ms``'s default (30 min)."""
QUEUE_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000, 10000)
"""Bucket boundaries advised for ``fifolock.grant.queue_length`` (requests)."""

MAX_KNOWN_NAMES = 4096
"""Lock names (per process) whose labels are remembered for the give-backs that
the hub makes on its own; the least recently used are forgotten beyond that, and
their give-backs counted under ``DEFAULT_NAME_TEMPLATE``."""


@dataclass(frozen=True)
class Labels:
    """The attributes every metric and span of one lock carries.

    Attributes:
        name_template: the lock's name template (str).
        integration: ``core``, ``django`` or ``celery`` (str).
        attributes: both, keyed by their OpenTelemetry attribute names.
    """

    name_template: str
    integration: str
    attributes: Mapping[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        attributes = {NAME_TEMPLATE: self.name_template, INTEGRATION: self.integration}
        object.__setattr__(self, "attributes", attributes)


def lock_labels(name: str, name_template: str | None, integration: str = "core") -> Labels:
    """The ``Labels`` of lock ``name``.

    Args:
        name: the lock's name (str), for error messages only.
        name_template: the template its name was filled in from (str, e.g.
            ``"customer-{customer_id}"``; a fixed name is its own template), or
            None (default): ``DEFAULT_NAME_TEMPLATE``. Never pass a filled-in
            name: each distinct value is a time series of its own.
        integration: ``"core"`` (default), ``"django"`` or ``"celery"``.

    Raises:
        TypeError: ``name_template`` is neither a str nor None.
        ValueError: ``name_template`` is not of 1 to ``MAX_TEMPLATE_LENGTH``
            characters, or ``integration`` is not one of ``INTEGRATIONS``.
    """
    if name_template is None:
        name_template = DEFAULT_NAME_TEMPLATE
    elif not isinstance(name_template, str):
        raise TypeError(
            f"FIFO lock {name!r}: name_template must be a str (the template the name "
            f"was filled in from) or None, got {type(name_template).__name__}"
        )
    elif not 0 < len(name_template) <= MAX_TEMPLATE_LENGTH:
        raise ValueError(
            f"FIFO lock {name!r}: name_template must be a str of 1 to {MAX_TEMPLATE_LENGTH} "
            f"characters or None, got one of {len(name_template)}"
        )
    if integration not in INTEGRATIONS:
        raise ValueError(
            f"FIFO lock {name!r}: integration must be one of {INTEGRATIONS}, got {integration!r}"
        )
    return Labels(name_template, integration)


class _Instruments:
    """The tracer and the six instruments, made once per pair of providers."""

    def __init__(
        self, meter_provider: MeterProvider | None, tracer_provider: TracerProvider | None
    ) -> None:
        scope = "redis_fifo_lock"
        meter = (meter_provider or otel_metrics.get_meter_provider()).get_meter(scope)
        self.tracer = (tracer_provider or otel_trace.get_tracer_provider()).get_tracer(scope)
        self.wait = meter.create_histogram(
            "fifolock.wait.duration",
            unit="s",
            description="Time one acquire waited, from its call to its grant or failure.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
        )
        self.hold = meter.create_histogram(
            "fifolock.hold.duration",
            unit="s",
            description="Time a lease was held, from its grant to its release.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
        )
        self.queue = meter.create_histogram(
            "fifolock.grant.queue_length",
            unit="{request}",
            description="Requests still queued behind a grant when its holder took it.",
            explicit_bucket_boundaries_advisory=QUEUE_BUCKETS,
        )
        self.timeouts = meter.create_counter(
            "fifolock.wait.timeouts",
            unit="{request}",
            description="Acquire calls that gave up when their timeout ran out.",
        )
        self.lost = meter.create_counter(
            "fifolock.lease.lost",
            unit="{lease}",
            description="Leases lost while held: the lock may have had two holders.",
        )
        self.given_back = meter.create_counter(
            "fifolock.grant.given_back",
            unit="{grant}",
            description="Grants given back because their waiter no longer waited for them.",
        )


_providers: tuple[MeterProvider | None, TracerProvider | None] = (None, None)
_instruments: _Instruments | None = None
_instruments_lock = native.lock()  # made once, whichever thread's lock asks first


def set_providers(
    meter_provider: MeterProvider | None = None, tracer_provider: TracerProvider | None = None
) -> None:
    """Report to these providers from now on, instead of the global ones.

    Args:
        meter_provider: an OpenTelemetry ``MeterProvider``, or None (default):
            the global one (``opentelemetry.metrics.get_meter_provider()``).
        tracer_provider: an OpenTelemetry ``TracerProvider``, or None (default):
            the global one (``opentelemetry.trace.get_tracer_provider()``).

    For tests and for applications that keep their providers out of the
    global ones; holds already running end with the providers they started on.
    Without the ``otel`` extra it does nothing.
    """
    global _providers, _instruments
    with _instruments_lock:
        _providers, _instruments = (meter_provider, tracer_provider), None


def _get() -> _Instruments | None:
    global _instruments
    if not OTEL:
        return None
    instruments = _instruments
    if instruments is None:
        with _instruments_lock:
            if _instruments is None:
                _instruments = _Instruments(*_providers)
            instruments = _instruments
    return instruments


_known: OrderedDict[LockKeys, Labels] = OrderedDict()
"""Labels by lock keys, most recently used last: see ``MAX_KNOWN_NAMES``."""
_known_lock = native.lock()  # locks run on several event loops, in several threads


def _after_fork_in_child() -> None:
    # A thread of the parent may have held a guard at the moment of the fork,
    # and that thread does not exist here to release it.
    global _instruments_lock, _known_lock
    _instruments_lock = native.lock()
    _known_lock = native.lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _remember(keys: LockKeys, labels: Labels) -> None:
    with _known_lock:
        _known[keys] = labels
        _known.move_to_end(keys)
        if len(_known) > MAX_KNOWN_NAMES:
            _known.popitem(last=False)


class Waiting:
    """Records one ``acquire`` of the lock with ``keys``: use as
    ``with Waiting(labels, keys): ...`` around the wait. On exit it records
    ``fifolock.wait.duration`` (with ``error.type`` when the block raised),
    counts a ``LockTimeout`` in ``fifolock.wait.timeouts`` and ends the
    ``fifolock.wait`` span."""

    def __init__(self, labels: Labels, keys: LockKeys) -> None:
        self.labels = labels
        self.keys = keys
        self._started = 0.0
        self._instruments: _Instruments | None = None
        self._span: Span | None = None

    def __enter__(self) -> Waiting:
        instruments = self._instruments = _get()
        if instruments is not None:
            _remember(self.keys, self.labels)
            self._span = instruments.tracer.start_span(
                "fifolock.wait", attributes=self.labels.attributes
            )
            self._started = time.monotonic()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        instruments, span = self._instruments, self._span
        if instruments is None or span is None:
            return
        attributes = dict(self.labels.attributes)
        if exc_type is not None:
            attributes[ERROR_TYPE] = exc_type.__name__
            span.set_attribute(ERROR_TYPE, exc_type.__name__)
            span.set_status(otel_trace.StatusCode.ERROR)
        instruments.wait.record(time.monotonic() - self._started, attributes)
        if isinstance(exc, LockTimeout):
            instruments.timeouts.add(1, self.labels.attributes)
        span.end()


@dataclass
class _Hold:
    instruments: _Instruments
    labels: Labels
    started: float
    span: Span
    ended: bool = False


_holds: weakref.WeakKeyDictionary[Lease, _Hold] = weakref.WeakKeyDictionary()
"""The holds not yet released (and released ones while their lease lives)."""


def hold_started(labels: Labels, lease: Lease, queued: int) -> None:
    """``lease`` was just granted, with ``queued`` requests (int) queued behind it:
    record ``fifolock.grant.queue_length`` and start the ``fifolock.hold`` span."""
    instruments = _get()
    if instruments is None:
        return
    instruments.queue.record(queued, labels.attributes)
    attributes: dict[str, str | int] = {
        **labels.attributes,
        "fifolock.fence": lease.fence,
        "fifolock.ticket": lease.ticket,
    }
    span = instruments.tracer.start_span("fifolock.hold", attributes=attributes)
    _holds[lease] = _Hold(instruments, labels, time.monotonic(), span)


def hold_ended(lease: Lease, *, lost: bool) -> None:
    """``lease`` was released (``lost``: it had been lost, or was not held any
    more): record ``fifolock.hold.duration`` and end the ``fifolock.hold`` span."""
    hold = _holds.get(lease)
    if hold is None or hold.ended:
        return
    hold.ended = True
    attributes = dict(hold.labels.attributes)
    if lost:
        attributes[ERROR_TYPE] = "LeaseLost"
        hold.span.set_attribute(ERROR_TYPE, "LeaseLost")
        hold.span.set_status(otel_trace.StatusCode.ERROR, lease.lost_reason or "lease lost")
    hold.instruments.hold.record(time.monotonic() - hold.started, attributes)
    hold.span.end()


def lease_lost(lease: Lease) -> None:
    """``lease`` was just marked lost: count it in ``fifolock.lease.lost``."""
    hold = _holds.get(lease)
    if hold is not None:
        hold.instruments.lost.add(1, hold.labels.attributes)


def gave_back(keys: LockKeys) -> None:
    """This process gave back a grant of the lock with ``keys`` that nobody here
    waited for: count it in ``fifolock.grant.given_back``."""
    instruments = _get()
    if instruments is not None:
        with _known_lock:
            labels = _known.get(keys) or Labels(DEFAULT_NAME_TEMPLATE, "core")
        instruments.given_back.add(1, labels.attributes)


@contextmanager
def current(lease: Lease) -> Iterator[None]:
    """Inside the block, ``lease``'s ``fifolock.hold`` span is the current span,
    so spans started there are its children. Exceptions pass through untouched
    (the release sets the span's status)."""
    hold = _holds.get(lease)
    if hold is None:
        yield
        return
    with otel_trace.use_span(
        hold.span, end_on_exit=False, record_exception=False, set_status_on_exception=False
    ):
        yield


def caller_context() -> Context | None:
    """The calling thread's OpenTelemetry context, for ``in_context`` on the
    thread that acts for it; None without the ``otel`` extra."""
    return otel_context.get_current() if OTEL else None


@contextmanager
def in_context(context: Context | None) -> Iterator[None]:
    """Run the block in ``context`` (from ``caller_context``), so that the spans
    it starts have the caller's current span as parent."""
    if context is None:
        yield
        return
    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)
