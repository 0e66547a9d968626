"""``fifolock_celery`` without a worker: settings, names, decoration rules, start checks.

These run in the test process. Where a task must run, it runs eagerly with
``apply()`` (the lock is still real, on the session's Redis): only for rules
that do not depend on the worker; lock behaviour between executions is tested
in real workers (``test_celery.py`` and the other modules here).
"""

from __future__ import annotations

import datetime
import decimal
import enum
import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NamedTuple

import pytest
from celery import Celery, Task
from celery.exceptions import Retry
from django.db import models
from django.utils.functional import Promise, lazy
from kombu.serialization import dumps as kombu_dumps
from kombu.serialization import loads as kombu_loads

import fifolock_celery.decorator as decorator_module
import fifolock_celery.lease as lease_module
import fifolock_celery.names as names_module
import fifolock_celery.policies as policies_module
from fifolock_celery import (
    REDIS_URL_SETTING,
    SKIPPED,
    FifoLockedTask,
    LockConfig,
    LockServer,
    current_lease,
    fifo_locked,
    lock_for,
    start_warnings,
)
from fifolock_celery.decorator import LockSpec
from fifolock_celery.names import NameTemplate
from fifolock_celery.worker import spec_of
from redis_fifo_lock import (
    Lease,
    LeaseLost,
    LockError,
    LockSettings,
    LockTimeout,
    LockUsageError,
    NotReplicated,
    RedisUnavailable,
    SyncFifoLock,
)
from redis_fifo_lock.holds import violations
from tests.celery_tests import celery_app as tasks
from tests.conftest import FaultProxyFactory
from tests.support.celery_worker import ROOT, Log, unique
from tests.support.proxy import FaultProxy, OutageEndsAtRetry

# -- settings, decoration rules, outside a worker ------------------------------


def test_the_lock_server_defaults_to_a_redis_broker() -> None:
    app = Celery("t", broker="redis://broker.example:6379/4")

    config = LockConfig.from_app(app, "jobs")

    assert config.server == LockServer.server("redis://broker.example:6379/4")
    assert (config.settings.lease_ms, config.settings.poll_ms) == (60_000, 30_000)


def test_fifo_lock_redis_url_wins_over_the_broker_and_reads_the_django_namespace() -> None:
    class DjangoSettings:
        CELERY_BROKER_URL = "redis://broker.example/1"
        CELERY_FIFO_LOCK_REDIS_URL = "rediss://locks.example/0"
        CELERY_FIFO_LOCK_LEASE_MS = 9000

    app = Celery("t")
    app.config_from_object(DjangoSettings, namespace="CELERY")

    config = LockConfig.from_app(app, "jobs", poll_ms=1000)

    assert config.server == LockServer.server("rediss://locks.example/0")
    assert (config.settings.lease_ms, config.settings.poll_ms) == (9000, 1000)


@pytest.mark.parametrize(
    "broker", ["amqp://guest:secret@rabbit//", "redis://a/0;redis://b/0", "sqs://"]
)
def test_a_broker_that_is_not_one_redis_url_is_an_error_naming_the_setting(broker: str) -> None:
    app = Celery("t", broker=broker)

    with pytest.raises(LockUsageError, match=REDIS_URL_SETTING) as caught:
        LockConfig.from_app(app, "jobs")

    assert "secret" not in str(caught.value)
    assert "CELERY_FIFO_LOCK_REDIS_URL" in str(caught.value)


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("fifo_lock_lease_ms", "600"),
        ("fifo_lock_poll_ms", 1.5),
        ("fifo_lock_max_hold_ms", 0),
        ("fifo_lock_replicas", -1),
        ("fifo_lock_replicas", True),
        ("fifo_lock_replica_wait_ms", 0),
    ],
)
def test_a_bad_lock_setting_is_refused_by_name(setting: str, value: object) -> None:
    app = Celery("t", broker="redis://localhost/0")
    app.conf[setting] = value

    with pytest.raises(ValueError, match=setting):
        LockConfig.from_app(app, "jobs")


def test_inconsistent_merged_settings_are_refused_with_the_lock_name() -> None:
    app = Celery("t", broker="redis://localhost/0")
    app.conf.fifo_lock_lease_ms = 1000

    with pytest.raises(ValueError, match=r"'jobs'.*poll_ms"):
        LockConfig.from_app(app, "jobs", poll_ms=800)
    with pytest.raises(
        ValueError,
        match=r"'jobs': @fifo_locked\(replica_wait_ms=\.\.\.\) \(400\) must be at most a third "
        r"of fifo_lock_lease_ms \(1000\)",
    ):
        LockConfig.from_app(app, "jobs", poll_ms=500, replica_wait_ms=400)


def test_the_replica_settings_reach_the_lock_settings_and_options_win() -> None:
    app = Celery("t", broker="redis://localhost/0")
    app.conf.update(fifo_lock_replicas=2, fifo_lock_replica_wait_ms=250)

    settings = LockConfig.from_app(app, "jobs").settings
    overridden = LockConfig.from_app(app, "jobs", replicas=0, replica_wait_ms=100).settings

    assert (settings.replicas, settings.replica_wait_ms) == (2, 250)
    assert (overridden.replicas, overridden.replica_wait_ms) == (0, 100)
    assert lock_for(app, "jobs", replicas=1).settings == LockSettings(
        replicas=1, replica_wait_ms=250
    )


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("invoice-{invoice}", "names invoice, which the function does not take"),
        ("invoice-{}", "positional field"),
        ("invoice-{0}", "positional field"),
        ("invoice-{{id}}", "can never make a valid lock name"),
        ("invoice-{invoice_id", "not a valid format string"),
    ],
)
def test_a_bad_name_template_fails_at_decoration(template: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):

        @fifo_locked(template)
        def job(invoice_id: int) -> None: ...


@pytest.mark.parametrize(
    "options",
    [
        {"timeout": -1},
        {"lease_ms": 1.5},
        {"poll_ms": 0},
        {"max_hold_ms": True},
        {"replicas": -1},
        {"replicas": 1.0},
        {"replica_wait_ms": 0},
    ],
)
def test_bad_options_fail_at_decoration(options: dict[str, Any]) -> None:
    [option] = [name for name in options if name != "timeout"] or ["timeout"]
    with pytest.raises(ValueError, match=option):
        fifo_locked("jobs", **options)


def test_fifo_locked_on_top_of_app_task_is_refused() -> None:
    app = Celery("t")

    @app.task
    def job() -> None: ...

    with pytest.raises(TypeError, match=r"put it under @app\.task"):
        fifo_locked("jobs")(job)


def test_the_task_keeps_its_signature_for_celerys_argument_check(app: Celery) -> None:
    with pytest.raises(TypeError):
        tasks.hold_invoice.delay(log="x")  # invoice_id missing: refused before sending


def test_current_lease_outside_a_locked_body_is_a_usage_error(app: Celery) -> None:
    with pytest.raises(LockUsageError, match="outside the body of a @fifo_locked task"):
        current_lease()

    @app.task
    def unlocked() -> int:
        return current_lease().fence

    with pytest.raises(LockUsageError):
        unlocked.apply(throw=True)


def test_calling_the_body_outside_a_task_is_a_usage_error() -> None:
    with pytest.raises(LockUsageError, match="outside a Celery task"):
        tasks.fail_inside.run("log", "key")


def test_a_body_that_reenters_its_own_lock_fails_instead_of_waiting_forever(
    app: Celery,
) -> None:
    key = unique("reenter")

    @app.task
    @fifo_locked("reenter-{key}", timeout=5)
    def outer(key: str) -> None:
        inner.run(key)

    @app.task
    @fifo_locked("reenter-{key}", timeout=5)
    def inner(key: str) -> None: ...

    with pytest.raises(LockUsageError, match="already held in this task"):
        outer.apply((key,), throw=True)
    assert not lock_for(app, f"reenter-{key}").status().held


def test_eager_self_retry_releases_before_the_retry_runs(app: Celery, log: Log) -> None:
    # Celery >= 5.3 re-runs an eager retry from apply(), after the body returned.
    fence = tasks.retry_once.apply((log.key, unique("eager"))).get()

    holds = log.holds()
    assert [h.retries for h in holds] == [0, 1]
    assert violations(holds) == []
    assert fence == holds[1].fence


def test_equal_lock_servers_share_one_loop_clients_per_process(app: Celery) -> None:
    other = Celery("other", broker=app.conf.broker_url)
    clients = LockConfig.from_app(app, "jobs").server.clients()

    assert clients is LockServer.server(app.conf.broker_url).clients()
    assert clients is LockConfig.from_app(other, "jobs").server.clients()
    timeout = LockServer.server(app.conf.broker_url + "?socket_timeout=5")
    assert clients is not timeout.clients()


def test_a_forked_child_builds_its_own_portal_and_clients(app: Celery) -> None:
    name = unique("fork")
    with lock_for(app, name).hold(timeout=5) as parent_lease:
        pass
    parent_clients = LockServer.server(app.conf.broker_url).clients()
    assert len(parent_clients) == 1

    pid = os.fork()
    if pid == 0:  # the child: report through the exit code only
        code = 1
        try:
            signal.alarm(10)  # a child that hangs dies instead of hanging the test
            fresh = len(parent_clients) == 0  # the parent's client is not the child's
            with lock_for(app, name).hold(timeout=5) as child_lease:
                code = 0 if fresh and child_lease.fence > parent_lease.fence else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)

    assert os.waitstatus_to_exitcode(status) == 0
    assert len(parent_clients) == 1
    with lock_for(app, name).hold(timeout=5):  # and the parent still works
        pass


# -- lock names: the same for every way of making the same call ------------------


def name_of(task: Task[Any, Any], *args: Any, **kwargs: Any) -> str:
    """The lock name ``task`` would take for this call, as computed in the worker."""
    spec = spec_of(task)
    assert spec is not None, f"{task.name} is not locked"
    if "self" in spec.name.signature.parameters:  # bind=True: the task comes first
        args = (task, *args)
    return spec.name.format(args, kwargs, task.name)


CALL_SHAPES: list[tuple[Task[Any, Any], tuple[Any, ...], dict[str, Any], str]] = [
    (tasks.hold_invoice, ("log", "7"), {}, "invoice-7"),
    (tasks.hold_invoice, ("log",), {"invoice_id": "7"}, "invoice-7"),
    (tasks.hold_invoice, (), {"log": "log", "invoice_id": "7", "hold_ms": 5}, "invoice-7"),
    (tasks.hold_invoice_by_base, ("log", "7"), {}, "invoice-7"),
    (tasks.hold_region, ("log", "7"), {}, "region-eu-7"),
    (tasks.hold_region, ("log", "7", "eu"), {}, "region-eu-7"),
    (tasks.hold_region, ("log",), {"invoice_id": "7", "region": "eu", "hold_ms": 1}, "region-eu-7"),
    (tasks.autoretried, ("log", "7"), {}, "auto-7"),
    (tasks.locked_over_another_decorator, ("log", "7"), {}, "deco-7"),
    (tasks.locked_under_another_decorator, ("log",), {"key": "7", "suffix": "s"}, "deco-7"),
    (tasks.skip_gate_by_base, ("log", "7"), {}, "gate-7"),
]


@pytest.mark.parametrize(
    ("task", "args", "kwargs", "expected"),
    CALL_SHAPES,
    ids=[f"{shape[0].name.rsplit('.', 1)[1]}-{i}" for i, shape in enumerate(CALL_SHAPES)],
)
def test_every_way_of_making_the_same_call_gives_the_same_lock_name(
    task: Task[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any], expected: str
) -> None:
    assert name_of(task, *args, **kwargs) == expected


def test_another_process_with_another_hash_seed_computes_the_same_names() -> None:
    script = (
        "import json, sys\n"
        "from tests.celery_tests.test_celery_config import CALL_SHAPES, name_of\n"
        "json.dump([name_of(t, *a, **k) for t, a, k, _ in CALL_SHAPES], sys.stdout)\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, check=True
    )

    assert json.loads(out.stdout) == [expected for *_, expected in CALL_SHAPES]


def test_a_field_only_kwargs_can_fill_is_checked_when_the_task_runs() -> None:
    def job(**kwargs: Any) -> None: ...

    template = NameTemplate("tenant-{tenant}", job)

    assert template.format((), {"tenant": "a", "other": 1}, "billing.job") == "tenant-a"
    with pytest.raises(LockUsageError, match=r"task billing\.job was called without 'tenant'"):
        template.format((), {"other": 1}, "billing.job")


_AS_RECEIVED = names_module._as_received
"""The real ``_as_received``, which the mutants below call for what they do not change."""

CET = datetime.timezone(datetime.timedelta(hours=1), "CET")
"""A named zone: ``%Z`` shows ``CET``, kombu's JSON brings back ``UTC+01:00``."""


class Opaque:
    """An object shown by its address."""


class Cents(decimal.Decimal):
    """A Decimal subclass: kombu's JSON brings back a plain Decimal."""

    def __str__(self) -> str:
        return f"{self:.2f} EUR"


class Jsonable:
    """An object kombu's JSON sends as what ``__json__`` returns."""

    def __str__(self) -> str:
        return "jsonable"

    def __json__(self) -> str:
        return "sent"


class JsonDay(datetime.date):
    """A date with ``__json__``: kombu's JSON sends what it returns (helper-38)."""

    def __json__(self) -> int:
        return self.toordinal()


class ShortIso(datetime.datetime):
    """A datetime whose ``isoformat`` drops the microseconds; kombu's JSON calls
    ``datetime.isoformat`` itself, so a worker receives them (helper-38)."""

    def isoformat(self, sep: str = "T", timespec: str = "seconds") -> str:
        return super().isoformat(sep, timespec)


UNCARRIED: list[tuple[str, object, str]] = [
    ("zone-{tags.tzinfo}", datetime.datetime(2026, 1, 2, tzinfo=CET), "is a time zone"),
    ("zone-{tags}", CET, r"field \{tags\} is a time zone"),
    ("amount-{tags}", Cents("1.1"), "JSON brings back as a Decimal"),
    ("obj-{tags}", Jsonable(), r"sends as its __json__\(\)"),
    ("map-{tags}", {"a": 1}, r"is a dict, whose keys JSON turns into strings"),
    ("text-{tags}", lazy(lambda: "text", str)(), "lazy text"),
    ("day-{tags}", JsonDay(2026, 1, 2), r"sends as its __json__\(\)"),
]
"""Values whose text a worker could see otherwise (template, value, refusal)."""


@pytest.mark.parametrize(
    ("template", "value", "message"),
    [
        ("tags-{tags}", {"a", "b"}, r"field \{tags\} is a set"),
        ("obj-{tags}", Opaque(), r"field \{tags\} shows as .* with a memory address"),
        ("obj-{tags!r}", [Opaque()], "with a memory address"),
        ("fn-{tags}", lambda: None, "with a memory address"),
        ("obj-{tags.id}", Opaque(), "AttributeError"),
        ("obj-{tags[0]}", [], "IndexError"),
        *UNCARRIED,
    ],
)
def test_a_value_that_cannot_make_a_stable_name_is_an_error_naming_the_task(
    template: str, value: object, message: str
) -> None:
    def job(tags: object) -> None: ...

    with pytest.raises(LockUsageError, match=message) as caught:
        NameTemplate(template, job).format((value,), {}, "billing.job")

    assert "task billing.job" in str(caught.value)
    assert caught.value.name == template


def _uncarried_as_given(value: Any, field: str) -> Any:
    """MUTANT uncarried-as-given: a value that JSON or pickle would bring back
    with another text (a zone, a Decimal subclass, an object with __json__, a
    dict, a lazy text) is formatted as given instead of refused."""
    uncarried = (dict, datetime.tzinfo, decimal.Decimal, Jsonable, Promise)
    if isinstance(value, uncarried) and type(value) is not decimal.Decimal:
        return value
    return _AS_RECEIVED(value, field)


def test_the_uncarried_values_kill_uncarried_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(names_module, "_as_received", _uncarried_as_given)

    def job(tags: object) -> None: ...

    refused = []
    for template, value, _ in UNCARRIED:
        try:
            NameTemplate(template, job).format((value,), {}, "billing.job")
        except LockUsageError:
            refused.append(template)

    assert len(refused) < len(UNCARRIED), "uncarried-as-given passed"


class Kind(str, enum.Enum):
    """A str-mixin enum: JSON carries its value, ``format()`` shows ``Kind.A``."""

    A = "a"


class Level(enum.IntEnum):
    """An int enum: shown as its value (``1``) on every path."""

    ONE = 1


class Status(models.TextChoices):
    """Django's choices show as their value, so they lock the same name everywhere."""

    OPEN = "open"


class Shown(int):
    """An int that shows itself otherwise than JSON writes it."""

    def __str__(self) -> str:
        return f"shown-{int(self)}"


class Point(NamedTuple):
    x: int
    y: int


def _carried(args: tuple[Any, ...], serializer: str) -> tuple[Any, ...]:
    """``args`` as a worker receives them from a message that ``serializer`` wrote."""
    content_type, encoding, body = kombu_dumps(args, serializer=serializer)
    return tuple(kombu_loads(body, content_type, encoding, accept=[content_type]))


SERIALIZED: list[tuple[str, object]] = [
    ("batch-{ids}", (1, 2)),
    ("batch-{ids}", Point(1, 2)),
    ("batch-{ids}", [1, (2, (3, "x"))]),
    ("batch-{ids!r}", ("a", 1.5)),
    ("batch-{ids}", Kind.A),
    ("batch-{ids:>3}", Kind.A),
    ("batch-{ids}", [Kind.A, Level.ONE]),
    ("batch-{ids}", Level.ONE),
    ("batch-{ids}", Status.OPEN),
    ("batch-{ids}", Shown(3)),
    ("batch-{ids}", True),
    ("batch-{ids}", 10**20),
    ("at-{ids}", datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=CET)),
    ("at-{ids:%H %Z}", datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=CET)),
    ("at-{ids}", datetime.date(2026, 1, 2)),
    ("at-{ids}", decimal.Decimal("1.10")),
    ("at-{ids}", uuid.UUID(int=7)),
    ("at-{ids}", ShortIso(2026, 1, 2, 3, 4, 5, 123456)),
]


def _names(template: str, value: object, serializer: str) -> tuple[str, str]:
    """The lock names of one call: as a direct or eager call computes it, and as a
    worker does from the message ``serializer`` wrote."""

    def job(ids: object) -> None: ...

    name = NameTemplate(template, job)
    return (
        name.format((value,), {}, "billing.job"),
        name.format(_carried((value,), serializer), {}, "billing.job"),
    )


@pytest.mark.parametrize("serializer", ["json", "pickle"])
@pytest.mark.parametrize(("template", "value"), SERIALIZED, ids=[repr(v) for _, v in SERIALIZED])
def test_a_call_gets_the_same_name_from_its_arguments_and_from_the_message(
    template: str, value: object, serializer: str
) -> None:
    """A tuple or a str-enum locked "batch-(1, 2)" / "batch-Kind.A" in a direct
    or eager call but "batch-[1, 2]" / "batch-a" in a worker, whose arguments
    came through JSON: two locks for one call, and the bodies overlapped."""
    direct, received = _names(template, value, serializer)

    assert direct == received


def _tuples_as_given(value: Any, field: str) -> Any:
    """MUTANT tuples-as-given: a tuple (a namedtuple, a tuple in a list) is
    formatted as given, "batch-(1, 2)", while a JSON worker formats the list it
    receives, "batch-[1, 2]" (the bug before the test above)."""
    return value if isinstance(value, tuple) else _AS_RECEIVED(value, field)


def _subclasses_as_given(value: Any, field: str) -> Any:
    """MUTANT subclasses-as-given: a str, int or float subclass is formatted as
    it shows itself, "batch-Kind.A", while a JSON worker receives the plain
    value, "batch-a" (the bug before the test above)."""
    plain = isinstance(value, (str, int, float)) and type(value) not in (str, int, float, bool)
    return value if plain else _AS_RECEIVED(value, field)


def _zones_as_given(value: Any, field: str) -> Any:
    """MUTANT zones-as-given: a datetime keeps its named zone, "at-03 CET", while
    kombu's JSON brings it back with a UTC offset, "at-03 UTC+01:00"."""
    dated = isinstance(value, (datetime.datetime, datetime.time))
    return value if dated else _AS_RECEIVED(value, field)


@pytest.mark.parametrize("mutant", [_tuples_as_given, _subclasses_as_given, _zones_as_given])
def test_the_same_name_from_arguments_and_message_kills_the_as_given_mutants(
    monkeypatch: pytest.MonkeyPatch, mutant: Callable[[Any, str], Any]
) -> None:
    monkeypatch.setattr(names_module, "_as_received", mutant)

    differing = [(t, v) for t, v in SERIALIZED if len(set(_names(t, v, "json"))) > 1]

    assert differing, f"{mutant.__name__} passed"


def test_arguments_that_do_not_fit_are_a_type_error_naming_the_task() -> None:
    def job(invoice_id: int) -> None: ...

    with pytest.raises(TypeError, match=r"task billing\.job: cannot fill lock name"):
        NameTemplate("invoice-{invoice_id}", job).format((), {"other": 1}, "billing.job")


# -- contention policies: options --------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"policy": "sometimes"}, "policy must be one of"),
        ({"policy": "retry", "timeout": None}, "waits forever"),
        ({"policy": "skip", "timeout": None}, "waits forever"),
        ({"policy": "retry", "countdown": -1}, "countdown must be >= 0"),
        ({"policy": "retry", "countdown": True}, "countdown must be a number"),
        ({"policy": "retry", "countdown": float("inf")}, "finite"),
    ],
)
def test_bad_policy_options_fail_at_decoration(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fifo_locked("jobs", **options)


@pytest.mark.parametrize(
    ("options", "timeout"),
    [
        ({}, None),
        ({"policy": "wait"}, None),
        ({"policy": "retry"}, 0.0),
        ({"policy": "skip"}, 0.0),
        ({"policy": "skip", "timeout": 2}, 2.0),
    ],
)
def test_retry_and_skip_try_once_unless_given_a_timeout(
    options: dict[str, Any], timeout: float | None
) -> None:
    @fifo_locked("jobs", **options)
    def job() -> None: ...

    assert getattr(job, "fifo_lock_spec").timeout == timeout  # noqa: B009


# -- FifoLockedTask ----------------------------------------------------------------


@pytest.fixture
def fresh_app(app: Celery) -> Iterator[Celery]:
    """A finalized app of its own (tasks are made at decoration), on the test Redis."""
    fresh = Celery("fresh", broker=app.conf.broker_url, set_as_current=False)
    fresh.conf.update(fifo_lock_lease_ms=tasks.LEASE_MS, fifo_lock_poll_ms=tasks.POLL_MS)
    fresh.finalize()
    yield fresh
    fresh.close()


def test_a_locked_task_class_takes_its_options_from_task_attributes(fresh_app: Celery) -> None:
    @fresh_app.task(
        shared=False,
        base=FifoLockedTask,
        fifo_lock_name="ledger-{customer_id}",
        fifo_lock_policy="retry",
        fifo_lock_countdown=7,
        fifo_lock_lease_ms=9000,
        fifo_lock_replicas=1,
    )
    def post(customer_id: int) -> None: ...

    spec = spec_of(post)
    assert spec is not None
    assert (spec.name.template, spec.policy, spec.countdown, spec.timeout) == (
        "ledger-{customer_id}",
        "retry",
        7.0,
        0.0,
    )
    assert spec.options == {"lease_ms": 9000, "replicas": 1}


def test_a_subclass_changing_only_options_relocks_the_same_body(fresh_app: Celery) -> None:
    class Ledger(FifoLockedTask):
        fifo_lock_name = "ledger-{customer_id}"

    @fresh_app.task(shared=False, base=Ledger, bind=True)
    def post(self: Task[Any, Any], customer_id: int) -> str:
        return current_lease().name

    class Patient(type(post)):  # type: ignore[misc]
        fifo_lock_timeout = 3

    assert [spec_of(post).timeout, Patient.fifo_lock_spec.timeout] == [None, 3.0]  # type: ignore[union-attr]
    assert post.apply((5,)).get() == "ledger-5"


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({}, TypeError, r"FifoLockedTask fresh\.job has no fifo_lock_name"),
        ({"fifo_lock_name": "job-{nope}"}, ValueError, r"fresh\.job: lock name .* names nope"),
        ({"fifo_lock_name": "j", "fifo_lock_policy": "x"}, ValueError, r"fresh\.job: policy"),
        ({"fifo_lock_name": "j", "fifo_lock_poll_ms": 0}, ValueError, "fifo_lock_poll_ms must"),
        ({"fifo_lock_name": "j", "fifo_lock_replicas": -1}, ValueError, "fifo_lock_replicas must"),
    ],
)
def test_a_bad_locked_task_class_fails_when_the_task_is_made_naming_it(
    fresh_app: Celery, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    def job(key: str) -> None: ...

    with pytest.raises(error, match=message):
        fresh_app.task(shared=False, base=FifoLockedTask, name="fresh.job", **options)(job)


def test_base_class_and_decorator_together_are_refused(fresh_app: Celery) -> None:
    @fifo_locked("j")
    def job() -> None: ...

    with pytest.raises(TypeError, match="would take the lock twice"):
        fresh_app.task(shared=False, base=FifoLockedTask, name="fresh.j", fifo_lock_name="j")(job)


def test_an_abstract_locked_base_class_needs_no_name() -> None:
    class Abstract(FifoLockedTask):
        fifo_lock_policy = "skip"

    assert Abstract.fifo_lock_spec is None


# -- eager calls (apply / direct): same lock, no broker ---------------------------


def test_eager_skip_returns_the_sentinel_and_logs_a_warning(
    app: Celery, log: Log, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    with lock_for(app, f"gate-{key}").hold(timeout=5):
        skipped = tasks.skip_gate.apply((log.key, key)).get()
        by_base = tasks.skip_gate_by_base.apply((log.key, key)).get()

    assert skipped == by_base == SKIPPED
    assert log.holds() == []
    warnings = [
        r for r in caplog.records if r.name == "fifolock_celery" and r.levelname == "WARNING"
    ]
    assert [getattr(r, "fifo_lock_policy") for r in warnings] == ["skip", "skip"]  # noqa: B009
    assert all("skipped" in r.getMessage() for r in warnings)


def test_eager_retry_cannot_republish_so_it_fails_with_lock_timeout(
    app: Celery, log: Log, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    with lock_for(app, f"gate-{key}").hold(timeout=5):
        result = tasks.retry_gate.apply((log.key, key))

    assert isinstance(result.result, LockTimeout)
    assert any("cannot republish a task run eagerly" in r.getMessage() for r in caplog.records)


def test_a_free_lock_runs_the_body_under_every_policy_and_logs_the_grant(
    app: Celery, log: Log, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="fifolock_celery")
    tasks.pass_gate.apply((log.key, key)).get()
    tasks.retry_gate.apply((log.key, key)).get()
    tasks.skip_gate.apply((log.key, key)).get()

    assert violations(log.holds()) == []
    grants = [r for r in caplog.records if "after waiting" in r.getMessage()]
    assert [getattr(r, "fifo_lock_policy") for r in grants] == ["wait", "retry", "skip"]  # noqa: B009


def test_a_locked_task_class_called_directly_holds_its_lock(log: Log) -> None:
    assert tasks.hold_invoice_by_base(log.key, unique("direct")).startswith("invoice-direct-")
    assert len(log.holds()) == 1


# -- worker start-up checks --------------------------------------------------------


def checked_app(broker: str = "redis://localhost/0", *, beyond: bool = True, **conf: Any) -> Celery:
    """An app with locked and unlocked tasks, to run ``warnings_about`` on; with
    ``beyond``, one whose own ``max_hold_ms`` is shorter than its own time limit."""
    app = Celery("checked", broker=broker, set_as_current=False)
    app.conf.update(fifo_lock_lease_ms=1000, fifo_lock_poll_ms=500)
    app.conf.update(conf)

    if beyond:

        @app.task(shared=False, name="t.beyond_max_hold", time_limit=30)
        @fifo_locked("a", max_hold_ms=5000)
        def beyond_max_hold() -> None: ...

    @app.task(shared=False, name="t.within_max_hold", time_limit=30)
    @fifo_locked("b")
    def within_max_hold() -> None: ...

    @app.task(shared=False, name="t.acks_late", time_limit=120, acks_late=True)
    @fifo_locked("c")
    def acks_late() -> None: ...

    @app.task(
        shared=False,
        name="t.retry",
        base=FifoLockedTask,
        fifo_lock_name="d",
        fifo_lock_policy="retry",
    )
    def retry() -> None: ...

    @app.task(shared=False, name="t.unlocked", time_limit=10**6, acks_late=True)
    def unlocked() -> None: ...

    return app


def warnings_about(app: Celery) -> list[str]:
    """``start_warnings(app)`` about the tasks of ``checked_app`` (named ``t.*``).

    Every app also gets the tasks other modules declared with the default
    ``shared=True`` (those of ``tests.celery_tests.celery_app`` among them).
    """
    return [message for message in start_warnings(app) if message.startswith("task t.")]


def test_no_start_warning_for_sound_settings() -> None:
    assert warnings_about(checked_app(beyond=False, fifo_lock_max_hold_ms=10**6)) == []


def test_a_time_limit_beyond_max_hold_is_warned_about_at_start() -> None:
    [message] = warnings_about(checked_app())

    assert message.startswith(
        "task t.beyond_max_hold: its time_limit is 30 s but its FIFO lock may be held for at "
        "most max_hold_ms=5000 ms;"
    )


def test_the_app_time_limit_counts_for_tasks_without_their_own() -> None:
    messages = warnings_about(checked_app(task_time_limit=3600, fifo_lock_max_hold_ms=1_000_000))

    # t.within_max_hold and t.acks_late have time limits of their own, below 1000 s.
    assert [m.split(":")[0] for m in messages] == ["task t.beyond_max_hold", "task t.retry"]


def test_acks_late_with_a_short_redis_visibility_timeout_is_warned_about_at_start() -> None:
    app = checked_app(beyond=False, broker_transport_options={"visibility_timeout": 60})

    [message] = warnings_about(app)

    assert message.startswith(
        "task t.acks_late: it is acks_late and the Redis broker's visibility_timeout is 60 s, "
        "shorter than its time_limit of 120 s:"
    )


def test_a_retry_countdown_beyond_the_visibility_timeout_is_warned_about_at_start() -> None:
    app = checked_app(beyond=False, broker_transport_options={"visibility_timeout": 3})

    messages = warnings_about(app)

    assert [m.split(":")[0] for m in messages] == ["task t.acks_late", "task t.retry"]
    assert "its retry countdown of 5 s exceeds" in messages[1]


def test_no_visibility_warning_on_a_broker_that_is_not_redis() -> None:
    app = checked_app(
        "amqp://localhost//",
        beyond=False,
        broker_transport_options={"visibility_timeout": 1},
        fifo_lock_redis_url="redis://localhost/0",
    )

    assert warnings_about(app) == []


def test_settings_that_make_every_execution_fail_are_warned_about_at_start() -> None:
    messages = warnings_about(checked_app("amqp://localhost//"))

    assert len(messages) == 4
    assert all("every execution will fail" in m and REDIS_URL_SETTING in m for m in messages)


def test_the_worker_signal_logs_the_start_warnings(caplog: pytest.LogCaptureFixture) -> None:
    from celery.signals import celeryd_after_setup

    app = checked_app()

    class FakeWorker:
        def __init__(self, app: Celery) -> None:
            self.app = app

    celeryd_after_setup.send(sender="w@host", instance=FakeWorker(app), conf=app.conf)

    [record] = [r for r in caplog.records if r.getMessage().startswith("task t.")]
    assert record.levelname == "WARNING"
    assert record.getMessage().startswith("task t.beyond_max_hold:")


# -- the release, whatever ends the body -----------------------------------------


class Interrupted(Exception):
    """Stands for an exception raised into the task from outside (Celery's
    ``SoftTimeLimitExceeded``, raised by a signal handler) just after the grant."""


class BodyFailed(Exception):
    """What a task body raises in the tests below."""


class _InterruptTheGrantLog(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if "holds FIFO lock" in record.getMessage():
            raise Interrupted("a soft time limit while the grant is logged")


@pytest.fixture
def watched(request: pytest.FixtureRequest) -> Iterator[list[logging.Handler]]:
    """Handlers to attach, at INFO, to the loggers of ``fifolock_celery`` and
    ``redis_fifo_lock`` for the test (removed after it)."""
    handlers: list[logging.Handler] = []
    yield handlers
    for name in ("fifolock_celery", "redis_fifo_lock"):
        for handler in handlers:
            logging.getLogger(name).removeHandler(handler)


def _watch(handlers: list[logging.Handler], handler: logging.Handler, logger: str) -> None:
    handlers.append(handler)
    watched_logger = logging.getLogger(logger)
    watched_logger.addHandler(handler)
    if not watched_logger.isEnabledFor(logging.INFO):
        watched_logger.setLevel(logging.INFO)


@pytest.fixture
def proxied_app(app: Celery, fault_proxy: FaultProxyFactory) -> Iterator[tuple[Celery, FaultProxy]]:
    """An app of its own whose locks reach the test Redis through a fault proxy."""
    proxy = fault_proxy(app.conf.broker_url)
    fresh = Celery("proxied", broker=app.conf.broker_url, set_as_current=False)
    fresh.conf.update(
        fifo_lock_redis_url=f"{proxy.url[: -len('/0')]}/{tasks.BROKER_DB}",
        fifo_lock_lease_ms=5000,
        fifo_lock_poll_ms=1000,
    )
    fresh.finalize()
    yield fresh, proxy
    proxy.max_connections = 256
    fresh.close()


def _interrupted_as_granted(app: Celery, key: str, handlers: list[logging.Handler]) -> bool:
    """Run a locked task eagerly whose grant log raises ``Interrupted``; whether
    its lock is still held afterwards."""

    @app.task(shared=False, name=f"interrupted-{key}")
    @fifo_locked("interrupted-{key}", timeout=5)
    def body(key: str) -> str:
        return "ran"

    _watch(handlers, _InterruptTheGrantLog(), "fifolock_celery")
    result = body.apply((key,))
    assert isinstance(result.result, Interrupted)
    # The result keeps the traceback, and with it the lease: only a release frees it.
    return lock_for(app, f"interrupted-{key}").status().held


def _released_through_a_short_outage(
    app: Celery, proxy: FaultProxy, key: str, handlers: list[logging.Handler]
) -> str:
    """Run a locked task eagerly whose release meets an outage that ends at its
    first retry; what went wrong ("" for nothing)."""

    @app.task(shared=False, name=f"blip-{key}")
    @fifo_locked("blip-{key}", timeout=5)
    def body(key: str) -> str:
        proxy.max_connections = 0  # Redis cannot be reached until the first retry
        proxy.reset()
        return "done"

    _watch(handlers, OutageEndsAtRetry(proxy), "redis_fifo_lock")
    result = body.apply((key,))
    proxy.max_connections = 256
    if not result.successful():
        return f"the task failed: {result.result!r}"
    if lock_for(app, f"blip-{key}").status().held:
        return "the lock is still held"
    return ""


def _raised_when_redis_is_gone(app: Celery, proxy: FaultProxy, key: str) -> BaseException:
    """What a locked task raises whose body raises ``BodyFailed`` once Redis
    cannot be reached any more."""

    @app.task(shared=False, name=f"down-{key}", autoretry_for=(BodyFailed,), max_retries=0)
    @fifo_locked("down-{key}", timeout=5)
    def body(key: str) -> None:
        proxy.max_connections = 0  # for good: every try of the release fails
        proxy.reset()
        raise BodyFailed("the body's own error")

    raised = body.apply((key,)).result
    assert isinstance(raised, BaseException)
    return raised


def test_an_interruption_while_the_grant_is_logged_still_releases_the_lock(
    fresh_app: Celery, key: str, watched: list[logging.Handler]
) -> None:
    assert not _interrupted_as_granted(fresh_app, key, watched)


def test_a_release_that_meets_a_short_outage_is_retried_and_the_task_succeeds(
    proxied_app: tuple[Celery, FaultProxy], key: str, watched: list[logging.Handler]
) -> None:
    assert _released_through_a_short_outage(*proxied_app, key, watched) == ""


def test_a_release_that_cannot_reach_redis_never_hides_what_the_body_raised(
    proxied_app: tuple[Celery, FaultProxy], key: str
) -> None:
    raised = _raised_when_redis_is_gone(*proxied_app, key)

    assert isinstance(raised, BodyFailed)
    failure = getattr(raised, "fifolock_release_error", None)
    assert isinstance(failure, RedisUnavailable)
    assert f"down-{key}" in str(failure)


def _grant_logged_unguarded(
    spec: LockSpec, func: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> Any:
    """MUTANT grant-logged-unguarded: the grant is logged before the release is
    guarded, so what is raised into the task meanwhile leaves the lease held
    (the bug before this test)."""
    task = decorator_module._running_task(args, spec)
    lock = spec.lock(task, spec.name.format(args, kwargs, task.name))
    lease = lease_module.acquire(lock, spec.timeout)
    policies_module.granted(task, spec.policy, lease, 0.0)
    with lease_module.published(lock, lease):
        return func(*args, **kwargs)


@contextmanager
def _released_once(lock: SyncFifoLock, lease: Lease) -> Iterator[Lease]:
    """MUTANT release-once: the body's lease is released with one plain
    ``release``, whose failure replaces what the body raised (the bug before
    these tests)."""
    try:
        yield lease
    finally:
        lock.release(lease)


def test_an_interruption_while_the_grant_is_logged_kills_grant_logged_unguarded(
    fresh_app: Celery, key: str, watched: list[logging.Handler], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(decorator_module, "run_locked", _grant_logged_unguarded)
    assert _interrupted_as_granted(fresh_app, key, watched), "grant-logged-unguarded passed"
    lock_for(fresh_app, f"interrupted-{key}").force_release()


def test_the_release_through_outages_kills_release_once(
    proxied_app: tuple[Celery, FaultProxy],
    key: str,
    watched: list[logging.Handler],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(decorator_module, "published", _released_once)
    assert _released_through_a_short_outage(*proxied_app, key, watched), "release-once passed"
    assert not isinstance(_raised_when_redis_is_gone(*proxied_app, f"{key}-2"), BodyFailed)


# -- errors ------------------------------------------------------------------------


RAISED: list[BaseException] = [
    LeaseLost("jobs", "lost it", fence=7, token="t"),
    LockTimeout("jobs", "busy", waited=0.25, holder_fence=3),
    RedisUnavailable("jobs", "down", cause=None),
    NotReplicated("jobs", "not acknowledged", replicas=2, acknowledged=1),
    LockUsageError("invoice-{invoice_id}", "task billing.job was called without 'x'"),
    Retry("FIFO lock 'jobs' is busy", exc=LockTimeout("jobs", "busy", waited=0.0), when=0.2),
]


@pytest.mark.parametrize("error", RAISED, ids=lambda error: type(error).__name__)
def test_every_exception_we_raise_survives_pickle_with_its_attributes(
    error: BaseException,
) -> None:
    copy = pickle.loads(pickle.dumps(error))

    assert type(copy) is type(error)
    assert str(copy) == str(error)
    if isinstance(error, LockError):
        assert vars(copy) == vars(error)
    else:
        assert isinstance(copy, Retry) and isinstance(error, Retry)
        assert isinstance(copy.exc, LockTimeout) and vars(copy.exc) == vars(error.exc)
