"""The lock as a Redis user holding exactly ``redis_fifo_lock.acl_rules()``.

Issue 12, must-hold 2. Each test starts a private server of its own (so its
ACL users, ACL LOG and script cache are the test's alone) and creates the user
with ``ACL SETUSER <user> reset resetchannels on ><password> <rules...>``, as
the docs' "Running with least privilege" section (docs/security.md) says. Then:

- the core's main scenarios (acquire/release, a contended FIFO hand-off rung by
  the doorbell, timeout and withdrawal, renewal past several leases, status,
  the sync facade) pass, and Redis logs no refusal (ACL LOG) beyond what
  redis-py's connection set-up tries and does without;
- with any single rule left out, something breaks: Redis logs the refusal of
  that command, key or channel, and the lock's error or warning names the rule
  to add;
- the docs quote the rules exactly as ``acl_rules`` returns them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from redis_fifo_lock import (
    FifoLock,
    LockError,
    LockTimeout,
    LoopClients,
    RedisUnavailable,
    SyncFifoLock,
    doorbell,
    eviction,
)
from redis_fifo_lock import doorbell as doorbell_module
from redis_fifo_lock.acl import acl_rules, key_pattern
from redis_fifo_lock.doorbell import PROBE_TIMEOUT_S
from redis_fifo_lock.testing import PrivateRedis, PrivateRedisFactory
from tests.support.polling import until, until_sync

pytestmark = pytest.mark.timeout(120)

USER, PASSWORD = "fifolock-app", "least-privilege-pw"
SECURITY_DOC = Path(__file__).resolve().parent.parent / "docs" / "security.md"

SHORT = {"lease_ms": 300, "poll_ms": 150}
"""Settings for the renewal scenario: several leases pass in about a second."""
RUNG = {"lease_ms": 20_000, "poll_ms": 10_000}
"""Settings for the hand-off scenarios: a waiter polls every 10 s, so a hand-off
within HAND_OFF_S can only have come from the doorbell."""
HAND_OFF_S = 1.5

CONNECT_NOISE = {"client", "client|setinfo"}
"""What redis-py tries when it connects and does without when refused (``CLIENT
SETINFO``, Redis 7.2+; denied by its parent command on 6.2). Redis logs it."""


@dataclass
class Server:
    """A private server and an admin client of it."""

    server: PrivateRedis
    admin: Redis
    version: tuple[int, ...]
    denials: list[dict[str, Any]] = field(default_factory=list)

    def user(self, rules: list[str], database: int = 0) -> str:
        """Create the test user with exactly ``rules``; its URL."""
        self.admin.execute_command(
            "ACL", "SETUSER", USER, "reset", "resetchannels", "on", f">{PASSWORD}", *rules
        )
        host, port = self.server.host, self.server.port
        return f"redis://{quote(USER)}:{quote(PASSWORD)}@{host}:{port}/{database}"

    def refusals(self) -> list[dict[str, Any]]:
        """ACL LOG entries for the test user, but redis-py's connection noise."""
        entries = [
            entry
            for entry in self.admin.acl_log()
            if entry["username"] == USER
            and not (entry["reason"] == "command" and entry["object"] in CONNECT_NOISE)
        ]
        return entries


@pytest.fixture
def server(
    fresh_redis_server: PrivateRedisFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Server]:
    """A private server of the test's own, with ACL (Redis 6.2+ or Valkey)."""
    # What this process checked of earlier servers is kept per address: an
    # earlier test's server on the same (reused) port and user must not stand
    # in for this one's.
    monkeypatch.setattr(doorbell, "_ringing_checked", set())
    monkeypatch.setattr(doorbell, "_refusals_reported", set())
    private = fresh_redis_server()
    admin = Redis(host=private.host, port=private.port, decode_responses=True)
    try:
        info = admin.info("server")
        version = tuple(int(part) for part in str(info["redis_version"]).split(".")[:2])
        if version < (6, 2):
            pytest.skip(f"ACL rules need Redis 6.2 or newer; the server is {version}")
        yield Server(private, admin, version)
    finally:
        admin.close()


# -- the scenarios --------------------------------------------------------------


Scenario = Callable[[str, str], Awaitable[None]]
"""An async scenario run as the user at a URL (str), with a namespace (str)."""


async def acquire_and_release(url: str, namespace: str) -> None:
    client = AsyncRedis.from_url(url)
    try:
        lock = FifoLock(client, "lp-basic", namespace=namespace, **SHORT)
        lease = await lock.acquire(timeout=5)
        status = await lock.status()
        assert status.held and status.last_fence == lease.fence and status.waiting == 0
        await lock.release(lease)
        assert not (await lock.status()).held
        async with lock.hold(timeout=5) as again:
            assert again.fence > lease.fence
    finally:
        await client.aclose()


async def contended_hand_off_by_the_doorbell(url: str, namespace: str) -> None:
    """A holder and three waiters, each on a client of its own: grants go in
    arrival order, each within HAND_OFF_S (polls come every 10 s)."""
    clients = [AsyncRedis.from_url(url) for _ in range(4)]
    tasks: list[asyncio.Task[Any]] = []
    try:
        locks = [FifoLock(client, "lp-fifo", namespace=namespace, **RUNG) for client in clients]
        lease = await locks[0].acquire(timeout=5)
        order: list[int] = []

        async def wait(index: int) -> None:
            got = await locks[index].acquire(timeout=20)
            order.append(index)
            await asyncio.sleep(0.05)
            await locks[index].release(got)

        for index in (1, 2, 3):
            tasks.append(asyncio.create_task(wait(index)))
            await until(lambda n=index: _waiting(locks[0], n), f"waiter {index} is queued")
        started = time.monotonic()
        await locks[0].release(lease)
        await asyncio.wait_for(asyncio.gather(*tasks), 3 * HAND_OFF_S)
        took = time.monotonic() - started
        assert order == [1, 2, 3], f"grants came in order {order}"
        assert took < 3 * HAND_OFF_S, f"three hand-offs took {took:.1f} s (not rung?)"
    finally:
        await _cancel(tasks)
        for client in clients:
            await client.aclose()


async def two_locks_waited_for_on_one_client(url: str, namespace: str) -> None:
    """One client waits for two locks at once: when its first wait ends, the
    doorbell drops that channel (UNSUBSCRIBE) and still rings for the other."""
    holder_client, waiter_client = AsyncRedis.from_url(url), AsyncRedis.from_url(url)
    tasks: list[asyncio.Task[Any]] = []
    try:
        held = {
            name: await FifoLock(holder_client, name, namespace=namespace, **RUNG).acquire(
                timeout=5
            )
            for name in ("lp-p", "lp-q")
        }
        waiting = {
            name: FifoLock(waiter_client, name, namespace=namespace, **RUNG)
            for name in ("lp-p", "lp-q")
        }
        tasks = [
            asyncio.create_task(waiting[name].acquire(timeout=20)) for name in ("lp-p", "lp-q")
        ]
        for name in ("lp-p", "lp-q"):
            checker = FifoLock(holder_client, name, namespace=namespace, **RUNG)
            await until(lambda c=checker: _waiting(c, 1), f"{name} is waited for")
        for task, name in zip(tasks, ("lp-p", "lp-q"), strict=True):
            started = time.monotonic()
            await FifoLock(holder_client, name, namespace=namespace, **RUNG).release(held[name])
            lease = await asyncio.wait_for(task, 3 * HAND_OFF_S)
            took = time.monotonic() - started
            assert took < HAND_OFF_S, f"the hand-off of {name} took {took:.1f} s (not rung?)"
            await waiting[name].release(lease)
            await asyncio.sleep(0.2)  # the group of lp-p ends: its channel is dropped
    finally:
        await _cancel(tasks)
        await holder_client.aclose()
        await waiter_client.aclose()


async def waits_one_after_another_on_a_lingering_channel(url: str, namespace: str) -> None:
    """One waiter client waits again and again: each wait after the first reuses
    the lingering channel and probes its connection with what the rules allow,
    and is rung within the probe's bound (a refused probe would wait it out)."""
    holder_client, waiter_client = AsyncRedis.from_url(url), AsyncRedis.from_url(url)
    try:
        holder = FifoLock(holder_client, "lp-again", namespace=namespace, **RUNG)
        waiter = FifoLock(waiter_client, "lp-again", namespace=namespace, **RUNG)
        for attempt in range(3):
            lease = await holder.acquire(timeout=5)
            waiting = asyncio.create_task(waiter.acquire(timeout=20))
            try:
                await until(lambda: _waiting(holder, 1), "the waiter is queued")
                started = time.monotonic()
                await holder.release(lease)
                await waiter.release(await asyncio.wait_for(waiting, 3 * HAND_OFF_S))
            finally:
                await _cancel([waiting])  # its error read, when a rule is missing
            took = time.monotonic() - started
            assert took < PROBE_TIMEOUT_S, f"wait {attempt} was rung {took:.2f} s after the release"
    finally:
        await holder_client.aclose()
        await waiter_client.aclose()


async def timeout_and_withdrawal(url: str, namespace: str) -> None:
    holder_client, waiter_client = AsyncRedis.from_url(url), AsyncRedis.from_url(url)
    try:
        holder = FifoLock(holder_client, "lp-timeout", namespace=namespace, **RUNG)
        waiter = FifoLock(waiter_client, "lp-timeout", namespace=namespace, **RUNG)
        lease = await holder.acquire(timeout=5)
        with pytest.raises(LockTimeout):
            await waiter.acquire(timeout=0.3)
        await until(lambda: _waiting(holder, 0), "the timed-out request is withdrawn")
        await holder.release(lease)
        assert not (await holder.status()).held
    finally:
        await holder_client.aclose()
        await waiter_client.aclose()


async def renewal_past_several_leases(url: str, namespace: str) -> None:
    client = AsyncRedis.from_url(url)
    try:
        lock = FifoLock(client, "lp-renew", namespace=namespace, **SHORT)
        lease = await lock.acquire(timeout=5)
        await asyncio.sleep(5 * SHORT["lease_ms"] / 1000)
        assert not lease.lost, "the lease was lost while held past five leases"
        assert (await lock.status()).last_fence == lease.fence
        await lock.release(lease)  # LeaseLost if it had expired
    finally:
        await client.aclose()


async def the_sync_facade(url: str, namespace: str) -> None:
    def run() -> None:
        clients = LoopClients(url)
        lock = SyncFifoLock(clients, "lp-sync", namespace=namespace, **SHORT)
        with lock.hold(timeout=5) as lease:
            status = lock.status()
            assert status.held and status.last_fence == lease.fence
        assert not lock.status().held

    await asyncio.to_thread(run)


SCENARIOS: list[Scenario] = [
    acquire_and_release,
    contended_hand_off_by_the_doorbell,
    two_locks_waited_for_on_one_client,
    waits_one_after_another_on_a_lingering_channel,
    timeout_and_withdrawal,
    renewal_past_several_leases,
    the_sync_facade,
]


async def _waiting(lock: FifoLock, count: int) -> bool:
    return (await lock.status()).waiting == count


async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# -- the rule set is enough ------------------------------------------------------


@pytest.mark.parametrize("namespace", ["", "tenantA"])
async def test_the_main_scenarios_pass_as_a_user_with_exactly_the_rules(
    server: Server, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = server.user(acl_rules(namespace, config=True))
    caplog.set_level(logging.WARNING, logger="redis_fifo_lock")

    for scenario in SCENARIOS:
        await scenario(url, namespace)

    assert server.refusals() == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == []


def test_the_user_holds_exactly_the_rules_and_nothing_more(server: Server) -> None:
    server.user(acl_rules("tenantA"))
    user = server.admin.acl_getuser(USER)

    if server.version >= (7, 0):  # Redis 6.2 shows +eval and +evalsha as a category
        assert set(_as_list(user["commands"])) - {"-@all"} == set(acl_rules("tenantA")[:-2])
    assert [str(k).lstrip("~") for k in _as_list(user["keys"])] == ["tenantA:fifolock:*"]
    assert [str(c).lstrip("&") for c in _as_list(user["channels"])] == ["tenantA:fifolock:*"]


def _as_list(value: Any) -> list[str]:
    return value.split() if isinstance(value, str) else list(value)


async def test_a_database_other_than_0_needs_select(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    url = server.user(acl_rules(database=True, config=True), database=3)

    await acquire_and_release(url, "")
    await the_sync_facade(url, "")

    assert server.refusals() == []
    assert Redis(host=server.server.host, port=server.server.port, db=3).dbsize() > 0


async def test_replicas_need_wait(fresh_redis_server: PrivateRedisFactory) -> None:
    master = fresh_redis_server(["--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"])
    replica = fresh_redis_server(["--replicaof", master.host, str(master.port)])
    with Redis(host=replica.host, port=replica.port, decode_responses=True) as follower:
        until_sync(
            lambda: follower.info("replication").get("master_link_status") == "up",
            "the replica is in sync",
        )
    admin = Redis(host=master.host, port=master.port, decode_responses=True)
    admin.set("fifolock-test:replica-ready", 1)  # WAIT counts only after a real ack
    until_sync(lambda: int(admin.wait(1, 100)) == 1, "the master counts its replica")
    server = Server(master, admin, (7, 0))
    url = server.user(acl_rules(replicas=True, config=True))
    client = AsyncRedis.from_url(url)
    try:
        # Leases long enough for the replica's acknowledgement on a busy machine.
        lock = FifoLock(
            client, "lp-replicas", replicas=1, lease_ms=1500, poll_ms=500, replica_wait_ms=500
        )
        lease = await lock.acquire(timeout=5)
        await asyncio.sleep(3.5)  # past two leases: acknowledged renewals
        assert not lease.lost
        await lock.release(lease)
        assert server.refusals() == []

        server.user([rule for rule in acl_rules(replicas=True) if rule != "+wait"])
        with pytest.raises(RedisUnavailable) as info:
            await lock.acquire(timeout=2)
        assert "ACL" in str(info.value) and "+wait" in str(info.value), str(info.value)
    finally:
        await client.aclose()
        admin.close()


# -- every rule is needed ------------------------------------------------------------


@dataclass
class Run:
    """What the scenarios did as a user short of one rule."""

    errors: list[BaseException] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


async def run_leniently(url: str, namespace: str, caplog: pytest.LogCaptureFixture) -> Run:
    """Every scenario, each bounded in time, whatever the others did."""
    run = Run()
    caplog.set_level(logging.WARNING, logger="redis_fifo_lock")
    for scenario in SCENARIOS:
        try:
            await asyncio.wait_for(scenario(url, namespace), 15)
        except (LockError, AssertionError, asyncio.TimeoutError) as exc:
            run.errors.append(exc)
    run.warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    return run


ALL_RULES = acl_rules(config=True)


@pytest.mark.parametrize("missing", ALL_RULES)
async def test_without_any_one_rule_something_breaks_and_the_lock_names_the_rule(
    server: Server, missing: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A channel is unsubscribed when its linger ends: at once here, so that the
    # UNSUBSCRIBE (refused without +unsubscribe) comes during the scenarios.
    monkeypatch.setattr(doorbell_module, "LINGER_S", 0.0)
    url = server.user([rule for rule in ALL_RULES if rule != missing])
    server.admin.script_flush()  # so that EVAL is needed as well as EVALSHA

    run = await run_leniently(url, "", caplog)

    refused = server.refusals()
    kind = {"~": "key", "&": "channel"}.get(missing[0], "command")
    objects = {entry["object"] for entry in refused if entry["reason"] == kind}
    if kind == "command":
        # Redis 6.2 logs a refused subcommand by its command ('config').
        logged = objects | {name.split("|")[0] for name in objects}
        command = missing[1:] if server.version >= (7, 0) else missing[1:].split("|")[0]
        assert command in logged, f"Redis logged no refusal of {missing}: {refused}"
    else:
        assert objects, f"Redis logged no refusal of a {kind} without {missing}: {refused}"
    told = [str(exc) for exc in run.errors if isinstance(exc, RedisUnavailable)]
    told += run.warnings
    if missing == "+unsubscribe":
        return  # documented: nothing the client can see until it unsubscribes
    assert any(missing in message for message in told), (
        f"no error or warning names {missing}: {told}"
    )
    for exc in run.errors:
        assert "something other than the lock" not in str(exc), str(exc)


# -- the errors ------------------------------------------------------------------------


async def test_a_command_refused_inside_a_script_is_named_with_the_rule_to_add(
    server: Server,
) -> None:
    url = server.user([rule for rule in acl_rules() if rule != "+zadd"])
    client = AsyncRedis.from_url(url)
    try:
        with pytest.raises(RedisUnavailable) as info:
            await FifoLock(client, "lp-zadd", **SHORT).acquire(timeout=2)
    finally:
        await client.aclose()
    message = str(info.value)
    assert "ACL" in message and "+zadd" in message, message
    assert "something other than the lock" not in message
    if server.version >= (7, 2):  # Redis 7.2+ and Valkey name the command
        assert "'zadd'" in message and "+time" not in message, message


@pytest.mark.parametrize(
    ("rules", "lock_namespace", "named"),
    [
        (acl_rules(), "tenantA", "~tenantA:fifolock:*"),
        ([rule for rule in acl_rules() if rule != "+evalsha"], "", "+evalsha"),
    ],
    ids=["key pattern", "evalsha"],
)
async def test_a_refused_key_or_command_is_named_with_the_rule_to_add(
    server: Server, rules: list[str], lock_namespace: str, named: str
) -> None:
    client = AsyncRedis.from_url(server.user(rules))
    try:
        with pytest.raises(RedisUnavailable) as info:
            await FifoLock(client, "lp-denied", namespace=lock_namespace, **SHORT).acquire(
                timeout=2
            )
    finally:
        await client.aclose()
    assert "ACL" in str(info.value) and named in str(info.value), str(info.value)


async def test_a_refused_select_is_named_with_the_rule_to_add(server: Server) -> None:
    client = AsyncRedis.from_url(server.user(acl_rules(), database=2))
    try:
        with pytest.raises(RedisUnavailable, match=re.escape("+select")):
            await FifoLock(client, "lp-select", **SHORT).acquire(timeout=2)
    finally:
        await client.aclose()


async def test_a_refused_subscribe_is_one_warning_naming_acl_and_the_rule(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    channels_elsewhere = [r for r in acl_rules() if not r.startswith("&")] + ["&other:*"]
    url = server.user(channels_elsewhere)
    caplog.set_level(logging.WARNING, logger="redis_fifo_lock")
    clients = [AsyncRedis.from_url(url) for _ in range(2)]
    try:
        holder, waiter = (
            FifoLock(client, "lp-sub", lease_ms=4000, poll_ms=300) for client in clients
        )
        for _ in range(3):  # three waits, each its own wait group and SUBSCRIBE
            lease = await holder.acquire(timeout=5)
            getting = asyncio.create_task(waiter.acquire(timeout=10))
            await until(lambda: _waiting(holder, 1), "the waiter is queued")
            started = time.monotonic()
            await holder.release(lease)
            got = await getting
            # Refused at once, so the waiter polls from the start, every poll_ms
            # (not first after half a lease, as when the refusal went unread).
            assert time.monotonic() - started < 1.5
            await waiter.release(got)
    finally:
        for client in clients:
            await client.aclose()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    doorbell = [w for w in warnings if "doorbell" in w]
    assert len(doorbell) == 1, warnings
    assert "ACL" in doorbell[0] and f"&{key_pattern()}" in doorbell[0], doorbell[0]


async def test_a_refused_subscribe_command_names_its_rule(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    url = server.user([rule for rule in acl_rules() if rule != "+subscribe"])
    caplog.set_level(logging.WARNING, logger="redis_fifo_lock")
    client, other = AsyncRedis.from_url(url), AsyncRedis.from_url(url)
    try:
        lease = await FifoLock(other, "lp-subcmd", **SHORT).acquire(timeout=5)
        with contextlib.suppress(LockTimeout):
            await FifoLock(client, "lp-subcmd", **SHORT).acquire(timeout=0.5)
        await FifoLock(other, "lp-subcmd", **SHORT).release(lease)
    finally:
        await client.aclose()
        await other.aclose()
    doorbell = [r.getMessage() for r in caplog.records if "doorbell" in r.getMessage()]
    assert len(doorbell) == 1 and "+subscribe" in doorbell[0], doorbell


async def test_a_refused_config_get_warns_once_naming_its_rule(
    server: Server, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What this process learnt of earlier servers is kept per address for
    # RECHECK_S: an earlier test's server on the same (reused) port must not
    # stand in for this one.
    monkeypatch.setattr(eviction, "_servers", {})
    client = AsyncRedis.from_url(server.user(acl_rules()))
    caplog.set_level(logging.WARNING, logger="redis_fifo_lock")
    try:
        for name in ("lp-c1", "lp-c2"):
            async with FifoLock(client, name, **SHORT).hold(timeout=5):
                pass
    finally:
        await client.aclose()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "+config|get" in warnings[0], warnings


# -- docs and product agree -----------------------------------------------------------


def test_the_rules_cover_every_command_the_scripts_call() -> None:
    folder = Path(__file__).resolve().parent.parent / "redis_fifo_lock" / "lua"
    called = {
        command.lower()
        for script in folder.glob("*.lua")
        for command in re.findall(r"redis\.p?call\('([A-Za-z]+)'", script.read_text())
    }
    rules = acl_rules()
    assert {f"+{command}" for command in called} <= set(rules)
    assert [r for r in rules if r[0] in "~&"] == ["~fifolock:*", "&fifolock:*"]


def test_optional_rules_and_namespaces() -> None:
    base = acl_rules()
    assert acl_rules(replicas=True, database=True, config=True) == [
        *base,
        "+wait",
        "+select",
        "+config|get",
    ]
    assert acl_rules("tenantA")[-2:] == ["~tenantA:fifolock:*", "&tenantA:fifolock:*"]
    # Glob characters in a namespace are matched literally.
    assert key_pattern("a*b?[c]") == r"a\*b\?\[c\]:fifolock:*"


def test_the_rules_are_in_the_package_namespace_as_the_readme_says() -> None:
    import redis_fifo_lock

    assert redis_fifo_lock.acl_rules is acl_rules


def test_the_docs_quote_the_rule_set() -> None:
    doc = SECURITY_DOC.read_text()
    section = doc.split("## Running with least privilege", 1)[1].split("\n## ", 1)[0]
    assert " ".join(acl_rules()) in section
    assert " ".join(acl_rules(replicas=True, database=True, config=True)[-3:]) in section
    for rule in ("~<namespace>:fifolock:*", "&<namespace>:fifolock:*", "resetchannels"):
        assert rule in section
