"""OpenTelemetry metrics and spans of the lock, read with the SDK's in-memory
reader and span exporter, against a real Redis server."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator

import pytest

pytest.importorskip("opentelemetry.sdk")

import redis as sync_redis
from opentelemetry.trace import StatusCode
from redis.asyncio import Redis

from redis_fifo_lock import FifoLock, LeaseLost, LockTimeout, SyncFifoLock
from redis_fifo_lock.calls import call_ids
from redis_fifo_lock.protocol import PROTOCOL
from redis_fifo_lock.waiting import hub_for
from tests.support.handover import cancel_when_handed_over
from tests.support.polling import until
from tests.support.telemetry import Telemetry, attributes, recording
from tests.support.telemetry import labels as labels_of

FAST = {"lease_ms": 600, "poll_ms": 100}
TEMPLATE = "jobs-{job_id}"


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    """The lock reports to in-memory OpenTelemetry providers during the test."""
    with recording() as recorded:
        yield recorded


def labels(template: str = TEMPLATE) -> dict[str, str]:
    return labels_of(template, "core")


def job_lock(client: Redis, name: str = "jobs-7", **overrides: int) -> FifoLock:
    return FifoLock(client, name, name_template=TEMPLATE, **{**FAST, **overrides})


async def queue_length(lock: FifoLock, length: int) -> None:
    async def check() -> bool:
        return (await lock.status()).waiting == length

    await until(check, f"{length} requests are queued")


async def test_grants_record_wait_hold_and_queue_length_with_spans(
    aredis: Redis, redis_url: str, telemetry: Telemetry
) -> None:
    # Two clients, as two processes would be: the first waiter learns of its
    # grant from a ring and its claim, the second from the release's reply.
    other = Redis.from_url(redis_url)
    try:
        lock, rival = job_lock(aredis), job_lock(other)
        holder = await lock.acquire()  # granted by the acquire script: none behind it
        first = asyncio.create_task(rival.acquire())
        await queue_length(lock, 1)
        second = asyncio.create_task(rival.acquire())
        await queue_length(lock, 2)
        await lock.release(holder)
        lease = await first  # one request still queued behind it
        await rival.release(lease)
        last = await second  # none behind it
        await rival.release(last)
    finally:
        await other.aclose()

    queue = telemetry.metric("fifolock.grant.queue_length")
    assert queue.unit == "{request}"
    [point] = queue.data.data_points
    assert dict(point.attributes) == labels()
    assert (point.count, point.sum, point.min, point.max) == (3, 1, 0, 1)
    for name in ("fifolock.wait.duration", "fifolock.hold.duration"):
        histogram = telemetry.metric(name)
        assert histogram.unit == "s"
        [point] = histogram.data.data_points
        assert dict(point.attributes) == labels() and point.count == 3
        assert 0 < point.sum < 10
    waits, holds = telemetry.finished("fifolock.wait"), telemetry.finished("fifolock.hold")
    assert len(waits) == len(holds) == 3
    fences = [attributes(span)["fifolock.fence"] for span in holds]
    assert fences == [holder.fence, lease.fence, last.fence]
    for span in waits + holds:
        assert span.status.status_code == StatusCode.UNSET
        assert {key: attributes(span)[key] for key in labels()} == labels()
        assert "jobs-7" not in str(attributes(span)), "the filled-in name was recorded"


async def test_a_timeout_is_counted_and_fails_its_wait(aredis: Redis, telemetry: Telemetry) -> None:
    lock = job_lock(aredis)
    holder = await lock.acquire()
    with pytest.raises(LockTimeout):
        await lock.acquire(timeout=0.2)
    await lock.release(holder)

    timeouts = telemetry.metric("fifolock.wait.timeouts")
    assert timeouts.unit == "{request}"
    [point] = timeouts.data.data_points
    assert (dict(point.attributes), point.value) == (labels(), 1)
    waited = {
        attributes(point).get("error.type"): point
        for point in telemetry.points("fifolock.wait.duration")
    }
    assert set(waited) == {None, "LockTimeout"}
    assert waited["LockTimeout"].count == 1 and waited["LockTimeout"].sum >= 0.2
    [failed] = [span for span in telemetry.finished("fifolock.wait") if not span.status.is_ok]
    assert failed.status.status_code == StatusCode.ERROR
    assert attributes(failed)["error.type"] == "LockTimeout"


async def test_a_lease_lost_to_blocked_renewals_is_counted_and_fails_its_hold(
    aredis: Redis, redis_url: str, telemetry: Telemetry
) -> None:
    lock = job_lock(aredis)
    lease = await lock.acquire()
    pauser = sync_redis.Redis.from_url(redis_url)
    pauser.execute_command("CLIENT", "PAUSE", "2500", "ALL")  # renewals go unanswered
    try:
        await asyncio.wait_for(lease.wait_lost(), timeout=2)
    finally:
        pauser.execute_command("CLIENT", "UNPAUSE")
        pauser.close()
    with pytest.raises(LeaseLost):
        await lock.release(lease)

    lost = telemetry.metric("fifolock.lease.lost")
    assert lost.unit == "{lease}"
    [point] = lost.data.data_points
    assert (dict(point.attributes), point.value) == (labels(), 1)
    [held] = telemetry.points("fifolock.hold.duration")
    assert dict(held.attributes) == {**labels(), "error.type": "LeaseLost"}
    assert held.count == 1 and held.sum >= 0.6  # held until its 600 ms lease ran out
    [span] = telemetry.finished("fifolock.hold")
    assert span.status.status_code == StatusCode.ERROR
    assert attributes(span)["error.type"] == "LeaseLost"


async def test_a_grant_to_a_waiter_cancelled_as_it_came_is_given_back_and_counted(
    aredis: Redis, telemetry: Telemetry, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = job_lock(aredis, lease_ms=5000, poll_ms=1000)
    holder = await lock.acquire()
    waiter = asyncio.create_task(lock.acquire(token="doomed"))
    await queue_length(lock, 1)
    # The release hands the lock to the waiter, which is cancelled before it runs.
    cancel_when_handed_over(monkeypatch, waiter)
    await lock.release(holder)
    with pytest.raises(asyncio.CancelledError):
        await waiter
    lease = await lock.acquire(timeout=1)
    await lock.release(lease)

    given_back = telemetry.metric("fifolock.grant.given_back")
    assert given_back.unit == "{grant}"
    [point] = given_back.data.data_points
    assert (dict(point.attributes), point.value) == (labels(), 1)
    cancelled = [
        point
        for point in telemetry.points("fifolock.wait.duration")
        if attributes(point).get("error.type") == "CancelledError"
    ]
    assert len(cancelled) == 1


async def test_a_ring_for_a_request_nobody_waits_for_is_given_back_and_counted(
    aredis: Redis, redis_url: str, telemetry: Telemetry
) -> None:
    other = Redis.from_url(redis_url)
    try:
        lock, rival = job_lock(aredis, lease_ms=5000), job_lock(other, lease_ms=5000)
        holder = await lock.acquire()
        # A request of the rival's process that no task waits for any more (its
        # waiter gave up, and its withdrawal has not reached Redis), ahead of a
        # live waiter of that process.
        hub = hub_for(other)
        session = hub.session_for(rival.settings)
        call = call_ids().start(rival.keys)  # in flight, as a withdrawal not yet sent
        floor = call_ids().floor(rival.keys)
        await PROTOCOL.acquire(
            other, rival.keys, "ghost", session, rival.settings, call=call, floor=floor
        )
        waiter = asyncio.create_task(rival.acquire())
        await queue_length(lock, 2)
        channel = rival.keys.doorbell_of(session)

        async def watching() -> bool:
            return dict(await aredis.pubsub_numsub(channel)).get(channel.encode(), 0) > 0

        await until(watching, "the rival's process watches its doorbell")
        await lock.release(holder)  # grants to the ghost and rings the rival's process
        lease = await asyncio.wait_for(waiter, timeout=2)
        await rival.release(lease)
        call_ids().leave(rival.keys, call)
    finally:
        await other.aclose()

    [point] = telemetry.points("fifolock.grant.given_back")
    assert (dict(point.attributes), point.value) == (labels(), 1)


def test_the_sync_facade_reports_with_its_labels(redis_url: str, telemetry: Telemetry) -> None:
    lock = SyncFifoLock(redis_url, "jobs-8", name_template=TEMPLATE, **FAST)
    with lock.hold(timeout=5):
        pass
    [point] = telemetry.points("fifolock.hold.duration")
    assert dict(point.attributes) == labels() and point.count == 1


async def test_a_lock_without_a_template_is_labelled_untemplated_never_by_name(
    aredis: Redis, telemetry: Telemetry
) -> None:
    lock = FifoLock(aredis, "customer-42", **FAST)
    async with lock.hold(timeout=5):
        pass
    [point] = telemetry.points("fifolock.wait.duration")
    assert dict(point.attributes) == labels(template="(untemplated)")


async def test_wait_and_hold_spans_nest_under_the_caller_and_hold_the_block_s_spans(
    aredis: Redis, telemetry: Telemetry
) -> None:
    tracer = telemetry.tracer()
    with tracer.start_as_current_span("caller") as caller:
        async with job_lock(aredis).hold(timeout=5):
            with tracer.start_as_current_span("work"):
                pass
    assert_nested(telemetry, caller.get_span_context().span_id)


def test_the_sync_facade_s_spans_nest_under_the_calling_thread_s_span(
    redis_url: str, telemetry: Telemetry
) -> None:
    tracer = telemetry.tracer()
    lock = SyncFifoLock(redis_url, "jobs-8", name_template=TEMPLATE, **FAST)
    with (
        tracer.start_as_current_span("caller") as caller,
        lock.hold(timeout=5),
        tracer.start_as_current_span("work"),
    ):
        pass
    assert_nested(telemetry, caller.get_span_context().span_id)


def assert_nested(telemetry: Telemetry, caller: int) -> None:
    """The wait and the hold are children of ``caller``, and "work" of the hold."""
    [wait] = telemetry.finished("fifolock.wait")
    [hold] = telemetry.finished("fifolock.hold")
    [work] = telemetry.finished("work")
    assert wait.parent is not None and wait.parent.span_id == caller
    assert hold.parent is not None and hold.parent.span_id == caller
    assert work.parent is not None and work.parent.span_id == hold.context.span_id


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"name_template": ""}, "name_template"),
        ({"name_template": "x" * 1025}, "name_template"),
        ({"integration": "flask"}, "integration"),
    ],
)
def test_bad_labels_are_refused_at_construction(
    aredis: Redis, options: dict[str, str], says: str
) -> None:
    with pytest.raises(ValueError, match=says) as caught:
        FifoLock(aredis, "jobs-9", **options)
    assert "jobs-9" in str(caught.value)


@pytest.mark.parametrize("template", [5, b"jobs-{id}", ["jobs-{id}"]])
def test_a_name_template_that_is_no_str_is_a_type_error_naming_its_type(
    aredis: Redis, template: object
) -> None:
    with pytest.raises(
        TypeError, match=rf"name_template must be a str .*{type(template).__name__}$"
    ):
        FifoLock(aredis, "jobs-9", name_template=template)  # type: ignore[arg-type]


NO_OTEL = """
import asyncio, sys
sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
from redis.asyncio import Redis
from redis_fifo_lock import FifoLock, metrics

async def main() -> None:
    client = Redis.from_url(sys.argv[1])
    async with FifoLock(client, "jobs-1", name_template="jobs-{id}").hold(timeout=5):
        pass
    await client.aclose()

asyncio.run(main())
assert not metrics.OTEL
print(sorted(name for name in sys.modules if name.startswith("opentelemetry.")))
"""


def test_without_opentelemetry_the_lock_works_and_imports_none_of_it(redis_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", NO_OTEL, redis_url], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
