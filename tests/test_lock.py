"""Behaviour of the asyncio ``FifoLock`` against a real Redis server."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from redis.asyncio import Redis

from redis_fifo_lock import (
    FifoLock,
    LeaseLost,
    LockTimeout,
    LockUsageError,
    RedisUnavailable,
    SyncFifoLock,
)
from redis_fifo_lock.calls import call_ids
from redis_fifo_lock.holds import violations
from redis_fifo_lock.settings import LockSettings
from tests.support.forking import RAISED, in_child, needs_fork
from tests.support.handover import cancel_when_handed_over
from tests.support.polling import until, until_sync
from tests.support.record import Record

ROOT = Path(__file__).resolve().parent.parent
FAST = {"lease_ms": 600, "poll_ms": 100}


def fast_lock(client: Redis, name: str = "jobs", **overrides: int) -> FifoLock:
    return FifoLock(client, name, **{**FAST, **overrides})


def contender(url: str, record: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.contender",
            "--url",
            url,
            "--record",
            str(record),
            *args,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


async def queued(client: Redis, lock: FifoLock, token: str) -> None:
    async def check() -> bool:
        return await client.zscore(lock.keys.key("queue"), token) is not None

    await until(check, f"{token} is queued")


async def crowd_queued(lock: FifoLock) -> bool:
    return (await lock.status()).waiting >= 200


async def test_uncontended_acquire_and_release_grant_increasing_fences(aredis: Redis) -> None:
    lock = fast_lock(aredis)
    first = await lock.acquire()
    await lock.release(first)
    second = await lock.acquire()
    await lock.release(second)
    assert 0 < first.fence < second.fence < 2**53
    assert second.ticket > first.ticket
    status = await lock.status()
    assert (status.held, status.last_fence, status.waiting) == (False, second.fence, 0)


async def test_waiters_in_one_process_are_granted_in_arrival_order(aredis: Redis) -> None:
    lock = fast_lock(aredis)
    holder = await lock.acquire()
    granted: list[int] = []

    async def wait(token: str) -> None:
        async with lock.hold(token=token) as lease:
            granted.append(lease.ticket)

    tasks = []
    for i in range(10):
        tasks.append(asyncio.create_task(wait(f"waiter-{i}")))
        await queued(aredis, lock, f"waiter-{i}")
    await lock.release(holder)
    await asyncio.gather(*tasks)
    assert granted == sorted(granted) and len(granted) == 10


def test_twenty_waiting_processes_are_served_in_arrival_order(
    redis_url: str, tmp_path: Path
) -> None:
    record = Record(tmp_path / "record")
    gate = SyncFifoLock(redis_url, "fifo20", lease_ms=1000, poll_ms=200)
    gate_lease = gate.acquire()
    record.enter(gate_lease, "gate")
    arrivals = []
    for i in range(20):
        proc = contender(
            redis_url, record.path, "--name", "fifo20", "--hold-ms", "10", "--who", str(i)
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("queued")
        arrivals.append(proc)
    record.exit(gate_lease)
    gate.release(gate_lease)
    for proc in arrivals:
        assert proc.wait(timeout=60) == 0
    holds = record.holds()
    assert [hold.who for hold in holds] == ["gate", *map(str, range(20))]
    assert violations(holds) == []


def test_processes_never_overlap_while_holds_span_many_polls(
    redis_url: str, tmp_path: Path
) -> None:
    # 3 processes x 3 tasks x 3 rounds; each hold lasts 3 poll intervals, so
    # waiters wake (doorbell and polls) many times while someone is inside.
    record = tmp_path / "record"
    procs = [
        contender(
            redis_url,
            record,
            "--name",
            "excl",
            "--hold-ms",
            "300",
            "--tasks",
            "3",
            "--rounds",
            "3",
            "--who",
            f"p{i}",
        )
        for i in range(3)
    ]
    for proc in procs:
        assert proc.wait(timeout=90) == 0
    holds = Record(record).holds()
    assert len(holds) == 27
    assert violations(holds) == []


def test_a_killed_holder_is_replaced_within_one_lease_with_a_higher_fence(
    redis_url: str, tmp_path: Path
) -> None:
    record = tmp_path / "record"
    victim = contender(
        redis_url,
        record,
        "--name",
        "crash",
        "--hold-ms",
        "60000",
        "--lease-ms",
        "1000",
        "--poll-ms",
        "200",
    )
    assert victim.stdout is not None and victim.stdout.readline().strip() == "granted"
    heir = contender(
        redis_url,
        record,
        "--name",
        "crash",
        "--hold-ms",
        "1",
        "--lease-ms",
        "1000",
        "--poll-ms",
        "200",
        "--who",
        "heir",
    )
    assert heir.stdout is not None and heir.stdout.readline().startswith("queued")
    until_sync(lambda: record.exists() and "enter" in record.read_text(), "the victim entered")
    killed_at = time.monotonic_ns()
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert heir.wait(timeout=10) == 0
    holds = Record(record).holds()
    dead, new = holds
    assert new.who == "heir" and new.fence > dead.fence
    waited_ms = (new.entered_ns - killed_at) / 1e6
    assert waited_ms < 1000 + 200 + 300, waited_ms  # lease + one poll + slack


async def test_renewal_keeps_a_hold_of_five_leases(aredis: Redis) -> None:
    lock = fast_lock(aredis, lease_ms=300, poll_ms=100)
    lease = await lock.acquire()
    rival = asyncio.create_task(lock.acquire())
    await asyncio.sleep(1.5)  # the hold under test: five lease lengths
    assert not rival.done() and not lease.lost
    await lock.release(lease)
    second = await rival
    assert second.fence > lease.fence
    await lock.release(second)


async def test_lease_deleted_behind_the_holder_is_reported_lost(aredis: Redis) -> None:
    lock = fast_lock(aredis, lease_ms=300, poll_ms=100)
    lease = await lock.acquire()
    await aredis.delete(lock.keys.key("lease"))
    await asyncio.wait_for(lease.wait_lost(), timeout=2)
    assert lease.lost and "refused" in (lease.lost_reason or "")
    with pytest.raises(LeaseLost) as caught:
        await lock.release(lease)
    assert caught.value.fence == lease.fence and "jobs" in str(caught.value)


async def test_renewal_stops_at_max_hold(aredis: Redis) -> None:
    lock = fast_lock(aredis, lease_ms=300, poll_ms=100, max_hold_ms=700)
    lease = await lock.acquire()
    rival = asyncio.create_task(lock.acquire())
    started = time.monotonic()
    await asyncio.wait_for(lease.wait_lost(), timeout=3)
    successor = await asyncio.wait_for(rival, timeout=3)
    assert 0.6 < time.monotonic() - started < 1.5
    assert "max_hold_ms" in (lease.lost_reason or "") or "refused" in (lease.lost_reason or "")
    with pytest.raises(LeaseLost):
        await lock.release(lease)
    await lock.release(successor)


async def test_a_timed_out_acquire_withdraws_and_leaves_no_stall(aredis: Redis) -> None:
    lock = fast_lock(aredis, lease_ms=5000, poll_ms=1000)
    holder = await lock.acquire()
    with pytest.raises(LockTimeout) as caught:
        await lock.acquire(timeout=0.2)
    assert isinstance(caught.value, TimeoutError)
    assert caught.value.holder_fence == holder.fence and caught.value.waited >= 0.2
    assert (await lock.status()).waiting == 0
    await lock.release(holder)
    started = time.monotonic()
    lease = await lock.acquire(timeout=1)
    assert time.monotonic() - started < 0.5
    await lock.release(lease)


async def test_acquire_with_zero_timeout_tries_once(aredis: Redis) -> None:
    lock = fast_lock(aredis)
    holder = await lock.acquire(timeout=0)
    with pytest.raises(LockTimeout) as caught:
        await lock.acquire(timeout=0)
    assert caught.value.holder_fence == holder.fence
    assert (await lock.status()).waiting == 0
    await lock.release(holder)


@pytest.mark.parametrize("after_grant", [False, True])
async def test_a_cancelled_acquire_never_leaves_a_grant_behind(
    aredis: Redis, after_grant: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = fast_lock(aredis, lease_ms=5000, poll_ms=1000)
    holder = await lock.acquire()
    waiter = asyncio.create_task(lock.acquire(token="doomed"))
    await queued(aredis, lock, "doomed")
    if after_grant:
        # Release, and cancel the waiter as the release hands it the grant,
        # before its task gets to run: the grant lands in Redis but the caller
        # never sees it.
        cancel_when_handed_over(monkeypatch, waiter)
        await lock.release(holder)
    else:
        waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    if not after_grant:
        await lock.release(holder)
    started = time.monotonic()
    lease = await lock.acquire(timeout=1)
    assert time.monotonic() - started < 0.5, "the cancelled request stalled the lock"
    await lock.release(lease)


async def test_cancelling_while_the_acquire_script_is_in_flight_withdraws(aredis: Redis) -> None:
    lock = fast_lock(aredis, lease_ms=5000, poll_ms=1000)
    for _ in range(20):
        task = asyncio.create_task(lock.acquire())
        await asyncio.sleep(0)  # let it send the script
        task.cancel()
        try:
            lease = await task
        except asyncio.CancelledError:
            pass
        else:
            await lock.release(lease)
    status = await lock.status()
    assert (status.held, status.waiting) == (False, 0)


async def test_a_retry_with_the_same_token_keeps_its_place(aredis: Redis) -> None:
    lock = fast_lock(aredis)
    holder = await lock.acquire()
    first = asyncio.create_task(lock.acquire(token="early"))
    await queued(aredis, lock, "early")
    later = asyncio.create_task(lock.acquire(token="late"))
    await queued(aredis, lock, "late")
    ticket = await aredis.zscore(lock.keys.key("queue"), "early")
    # The same request sent again (as after a lost reply) keeps its ticket.
    again = FifoLock(aredis, "jobs", **FAST)
    hub_group_session = "retry-session"
    grant, same_ticket, _, _ = await again._protocol.acquire(
        aredis,
        again.keys,
        "early",
        hub_group_session,
        again.settings,
        call="retrier/000000000001",
        floor="retrier/000000000001",
    )
    assert grant is None and same_ticket == ticket
    await lock.release(holder)
    early = await first
    assert early.ticket == ticket
    # The retry's call holds the grant now: a release of the call it took over
    # (as a late one would be) leaves it alone, and says so.
    with pytest.raises(LeaseLost):
        await lock.release(early)
    assert await lock.force_release(early.fence) == early.fence
    await lock.release(await later)


async def test_a_retried_acquire_of_a_granted_request_returns_the_same_grant(
    aredis: Redis,
) -> None:
    lock = fast_lock(aredis)
    lease = await lock.acquire(token="mine")
    grant, _, _, _ = await lock._protocol.acquire(
        aredis,
        lock.keys,
        "mine",
        "s",
        lock.settings,
        call="retrier/000000000001",
        floor="retrier/000000000001",
    )
    assert grant is not None and grant.fence == lease.fence
    assert (await lock.status()).last_fence == lease.fence  # not granted twice
    with pytest.raises(LeaseLost):  # the retry's call holds the grant now
        await lock.release(lease)
    assert (await lock.status()).held


async def test_releasing_twice_is_a_no_op(aredis: Redis) -> None:
    lock = fast_lock(aredis)
    lease = await lock.acquire()
    await lock.release(lease)
    await lock.release(lease)
    # A release that Redis sees twice (a lost reply, re-sent) is a no-op too.
    keep_ms = lock.settings.keep_ms
    token, fence, call = lease.token, lease.fence, lease.call
    outcome, _ = await lock._protocol.release(
        aredis, lock.keys, token, fence, keep_ms, call, "-", call_ids().floor(lock.keys)
    )
    assert outcome == 0


async def test_tasks_sharing_a_lock_cannot_release_each_others_grant(aredis: Redis) -> None:
    lock = fast_lock(aredis)
    mine = await lock.acquire()
    other = FifoLock(aredis, "other", **FAST)
    with pytest.raises(LockUsageError):
        await other.release(mine)
    forged = type(mine)("jobs", "forged-token", mine.fence, mine.ticket)
    with pytest.raises(LeaseLost):
        await lock.release(forged)
    assert (await lock.status()).held
    await lock.release(mine)


async def test_an_evicting_server_policy_is_warned_about(
    fresh_redis_server,
    caplog: pytest.LogCaptureFixture,  # type: ignore[no-untyped-def]
) -> None:
    server = fresh_redis_server(["--maxmemory-policy", "volatile-lru"])
    client = Redis.from_url(server.url)
    with caplog.at_level(logging.WARNING, "redis_fifo_lock"):
        lease = await fast_lock(client, "evictable").acquire()
    await fast_lock(client, "evictable").release(lease)
    await client.aclose()
    assert any(
        "evictable" in rec.getMessage() and "volatile-lru" in rec.getMessage()
        for rec in caplog.records
    )


async def test_a_starved_renewal_is_warned_about(
    aredis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    lock = fast_lock(aredis, "starved", lease_ms=300, poll_ms=100)
    with caplog.at_level(logging.WARNING, "redis_fifo_lock"):
        lease = await lock.acquire()
        time.sleep(0.35)  # noqa: ASYNC251 - the fault under test: a blocked event loop
        await asyncio.sleep(0.05)
        with pytest.raises(LeaseLost):
            await lock.release(lease)
    assert any("starved" in r.getMessage() and "late" in r.getMessage() for r in caplog.records)


async def test_an_unreachable_server_raises_our_typed_error() -> None:
    client = Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    with pytest.raises(RedisUnavailable) as caught:
        await FifoLock(client, "nowhere").acquire()
    assert caught.value.name == "nowhere" and caught.value.cause is not None
    await client.aclose()


@pytest.mark.parametrize(
    ("name", "settings", "message"),
    [
        ("", {}, "empty"),
        ("a{b}", {}, "hash tag"),
        ("x" * 2000, {}, "limit"),
        ("\ud800", {}, "Unicode"),
        ("ok", {"max_hold_ms": 10**14}, "max_hold_ms"),
        ("ok", {"lease_ms": 10**14, "poll_ms": 100}, "lease_ms"),
        ("ok", {"lease_ms": 0, "poll_ms": 1}, "lease_ms"),
        ("ok", {"lease_ms": -5}, "lease_ms"),
        ("ok", {"lease_ms": 1.5}, "lease_ms"),
        ("ok", {"lease_ms": True}, "lease_ms"),
        ("ok", {"poll_ms": 0}, "poll_ms"),
        ("ok", {"lease_ms": 1000, "poll_ms": 600}, "poll_ms"),
        ("ok", {"lease_ms": 1000, "poll_ms": 100, "max_hold_ms": 999}, "max_hold_ms"),
    ],
)
def test_bad_names_and_settings_raise_at_construction(
    name: str, settings: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        FifoLock(Redis(), name, **settings)  # type: ignore[arg-type]


def test_settings_once_hashed_still_merge_pickle_and_compare_by_their_options() -> None:
    # The hash is cached on the object (the settings key the hub's dicts): the
    # cached value is no option, in a merge, a pickle or a comparison.
    settings = LockSettings(lease_ms=9000, poll_ms=3000)
    assert hash(settings) == hash(LockSettings(lease_ms=9000, poll_ms=3000))
    merged = settings.merged(({"max_hold_ms": 60_000}, str))
    assert merged == LockSettings(lease_ms=9000, poll_ms=3000, max_hold_ms=60_000)
    copy = pickle.loads(pickle.dumps(settings))
    assert copy == settings and hash(copy) == hash(settings)
    assert {settings: "found"}.get(copy) == "found"


async def test_bad_timeouts_and_tokens_raise_before_any_io(aredis: Redis) -> None:
    lock = fast_lock(aredis)
    for timeout in (-1, float("nan"), True, "5", 10**400):
        with pytest.raises(ValueError, match="timeout"):
            await lock.acquire(timeout=timeout)  # type: ignore[arg-type]
    for token in ("", "has space", "x" * 200):
        with pytest.raises(ValueError, match="token"):
            await lock.acquire(token=token)
    assert await aredis.keys("*") == []


def test_settings_that_are_not_lock_settings_are_refused_with_a_hint() -> None:
    with pytest.raises(TypeError, match=r"settings must be a LockSettings.*lease_ms=") as caught:
        FifoLock(Redis(), "jobs", settings={"lease_ms": 5000})  # type: ignore[arg-type]
    assert "'jobs'" in str(caught.value) and "dict" in str(caught.value)


def test_a_sync_client_is_refused_with_a_hint() -> None:
    import redis

    with pytest.raises(TypeError, match="SyncFifoLock"):
        FifoLock(redis.Redis(), "jobs")  # type: ignore[arg-type]


async def test_unicode_and_spaces_are_valid_names(aredis: Redis) -> None:
    lock = fast_lock(aredis, "facture n\u00b0 42 \u2013 \u00e9t\u00e9")
    async with lock.hold() as lease:
        assert lease.name == "facture n\u00b0 42 \u2013 \u00e9t\u00e9"


async def test_waiting_costs_no_connection_per_waiter(aredis: Redis, redis_url: str) -> None:
    client = Redis.from_url(redis_url, client_name="crowd")
    lock = fast_lock(client, "crowd")
    holder = await lock.acquire()
    waiters = [asyncio.create_task(lock.acquire()) for _ in range(200)]
    await until(lambda: crowd_queued(lock), "200 waiters are queued")
    ours = [entry for entry in await aredis.client_list() if entry["name"] == "crowd"]
    assert 1 <= len(ours) <= 4, ours
    await lock.release(holder)
    for granted in asyncio.as_completed(waiters):
        await lock.release(await granted)
    await client.aclose()


def test_the_contender_helper_exits_cleanly(redis_url: str, tmp_path: Path) -> None:
    proc = contender(redis_url, tmp_path / "r", "--name", "solo")
    assert proc.wait(timeout=30) == 0
    assert os.path.exists(tmp_path / "r")


async def test_one_token_cannot_wait_twice_in_one_process(aredis: Redis) -> None:
    lock = fast_lock(aredis)
    holder = await lock.acquire()
    first = asyncio.create_task(lock.acquire(token="twice"))
    await queued(aredis, lock, "twice")
    with pytest.raises(LockUsageError, match="already waits for"):
        await lock.acquire(token="twice")
    await lock.release(holder)
    await lock.release(await first)


async def test_a_holder_cut_off_from_redis_learns_it_lost_the_lease_when_it_expires(
    aredis: Redis, redis_url: str
) -> None:
    import redis as sync_redis

    lock = fast_lock(aredis, "cut-off", lease_ms=600, poll_ms=100)
    lease = await lock.acquire()
    pauser = sync_redis.Redis.from_url(redis_url)
    started = time.monotonic()
    pauser.execute_command("CLIENT", "PAUSE", "2500", "ALL")  # the fault: Redis goes silent
    try:
        await asyncio.wait_for(lease.wait_lost(), timeout=2)
        assert time.monotonic() - started < 1.5
        assert "expired" in (lease.lost_reason or "")
    finally:
        pauser.execute_command("CLIENT", "UNPAUSE")
        pauser.close()
    with pytest.raises(LeaseLost):
        await lock.release(lease)


async def test_an_outer_cancellation_racing_a_timeout_leaves_no_ghost(aredis: Redis) -> None:
    lock = fast_lock(aredis, lease_ms=5000, poll_ms=1000)
    holder = await lock.acquire()

    async def impatient(inner: float, outer: float) -> None:
        with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
            await asyncio.wait_for(lock.acquire(timeout=inner), outer)

    await asyncio.gather(*(impatient(0.2, 0.2 + i / 1000) for i in range(20)))
    await lock.release(holder)
    assert (await lock.status()).waiting == 0
    started = time.monotonic()
    await lock.release(await lock.acquire(timeout=2))
    assert time.monotonic() - started < 0.5


async def test_waiters_with_different_settings_on_one_name_are_woken_at_once(
    aredis: Redis,
) -> None:
    slow_polls = {"lease_ms": 20_000, "poll_ms": 10_000}
    first = FifoLock(aredis, "mixed", **slow_polls)
    second = FifoLock(aredis, "mixed", lease_ms=30_000, poll_ms=10_000)
    holder = await first.acquire()
    waiting = [asyncio.create_task(first.acquire()), asyncio.create_task(second.acquire())]
    await until(lambda: mixed_queued(first), "both are queued")
    started = time.monotonic()
    await first.release(holder)
    for granted in asyncio.as_completed(waiting):
        lease = await granted
        await FifoLock(aredis, "mixed", **slow_polls).release(lease)
    assert time.monotonic() - started < 2


async def mixed_queued(lock: FifoLock) -> bool:
    return (await lock.status()).waiting == 2


def test_event_loops_and_their_clients_are_not_kept_alive(redis_url: str) -> None:
    import gc
    import weakref

    from redis_fifo_lock import LoopClients

    clients = LoopClients(redis_url)
    used: list[weakref.ref[Redis]] = []

    async def use() -> None:
        client = clients.client()
        used.append(weakref.ref(client))
        async with FifoLock(client, "gc", **FAST).hold():
            pass

    for _ in range(20):
        asyncio.run(use())
    gc.collect()
    assert [ref for ref in used if ref() is not None] == []


# --- a forked child, and a release that fails as the body raises -------------------------


@needs_fork
async def test_a_forked_child_leaving_the_hold_cannot_release_the_parents_lease(
    aredis: Redis, redis_url: str
) -> None:
    from redis_fifo_lock import LoopClients

    # A LoopClients, so that the child gets a client of its own and could
    # really reach Redis: nothing but the lease's owner check stops it.
    lock = FifoLock(LoopClients(redis_url), "forked-hold", lease_ms=6000, poll_ms=1000)
    hold = lock.hold()
    lease = await hold.__aenter__()

    def leave_the_hold() -> None:
        try:
            asyncio.run(hold.__aexit__(None, None, None))
        except LockUsageError as exc:
            assert "forked-hold" in str(exc)
            raise

    assert in_child(leave_the_hold, LockUsageError) == RAISED
    status = await lock.status()
    assert (status.holder_fence, status.last_fence, status.waiting) == (lease.fence, lease.fence, 0)
    assert not lease.released
    await hold.__aexit__(None, None, None)  # the parent's own release still works
    assert not (await lock.status()).held


class BodyFailed(Exception):
    """What the body of a hold raises in the tests below."""


async def test_a_failed_release_is_attached_to_the_error_the_body_raised(aredis: Redis) -> None:
    lock = fast_lock(aredis, "body-error")
    with pytest.raises(BodyFailed) as caught:
        async with lock.hold():
            await aredis.delete(lock.keys.key("lease"))  # the release will fail: LeaseLost
            raise BodyFailed("the body's own error")
    failure = caught.value.fifolock_release_error  # type: ignore[attr-defined]
    assert isinstance(failure, LeaseLost)
    if sys.version_info >= (3, 11):
        assert any("LeaseLost" in note for note in caught.value.__notes__)


async def test_a_release_that_cannot_reach_redis_is_retried_when_the_body_raised(
    aredis: Redis, redis_url: str
) -> None:
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    # Replies slower than 0.2 s time out, and redis-py does not retry on its own.
    client = Redis.from_url(redis_url, socket_timeout=0.2, retry=Retry(NoBackoff(), 0))
    lock = FifoLock(client, "retried-release", lease_ms=30_000, poll_ms=5000)
    try:
        with pytest.raises(BodyFailed) as caught:
            async with lock.hold():
                # Scripts wait for 0.5 s: the first release times out, a retry gets in.
                await aredis.execute_command("CLIENT", "PAUSE", 500, "WRITE")
                raise BodyFailed("the body's own error")
        assert getattr(caught.value, "fifolock_release_error", None) is None
        assert not (await lock.status()).held  # freed now, not in lease_ms (30 s)
    finally:
        await client.aclose()


async def test_a_lease_dropped_without_release_is_released_not_renewed_for_ever(
    aredis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A lease nobody can release any more (its holder dropped it: a sync caller
    interrupted as acquire returned, a forgotten variable) must not keep the
    lock until max_hold_ms: the renewal does not keep it alive, and once it is
    garbage-collected its grant is released, with a warning."""
    lock = FifoLock(aredis, "dropped", lease_ms=30_000, poll_ms=15_000)
    lease = await lock.acquire(timeout=5)
    fence = lease.fence
    del lease
    gc.collect()
    started = time.monotonic()
    nxt = await FifoLock(aredis, "dropped", lease_ms=30_000, poll_ms=15_000).acquire(timeout=10)
    waited = time.monotonic() - started
    assert nxt.fence > fence
    assert waited < 5, f"the next holder waited {waited:.1f} s behind a dropped lease"
    assert "dropped without being released" in caplog.text
    await lock.release(nxt)
