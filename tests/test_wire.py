"""How the lock's keys, arguments and channels reach Redis, and its text comes back.

The lock encodes a script call's keys and arguments itself, in UTF-8, since
redis-py's general encoder costs several times as much per argument
(``protocol.wired``); it subscribes, publishes and lists keys in UTF-8 too, and
reads back what redis-py decoded with the client's own ``encoding``
(``decode_responses``) as the UTF-8 it was (``protocol.as_text``). So a name is
one set of keys and channels whatever encoding a client uses for its other
commands: clients of different encodings exclude each other, and a ring or a
hand-over reaches its waiter on any of them, rather than leaving it to a poll
(30 s apart by default; these tests wait 10 s at most). The scripts on a
grant's path answer in one RESP value each (``reply`` in lib.lua).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis._parsers.encoders import Encoder
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from redis_fifo_lock import FifoLock, LeaseLost, LoopClients, SyncFifoLock
from redis_fifo_lock.inventory import lock_names
from redis_fifo_lock.protocol import PROTOCOL, LockKeys, Script
from tests.support.polling import until

SERVED_WITHIN_S = 10.0
"""Longest wait for a grant a ring or a hand-over brings (no poll comes sooner)."""

CLIENTS: dict[str, dict[str, Any]] = {
    "utf-8": {},
    "latin-1": {"encoding": "latin-1"},
    "latin-1, decoded": {"encoding": "latin-1", "decode_responses": True},
    "utf-8, decoded": {"decode_responses": True},
}


@pytest.fixture
async def clients(redis_url: str) -> AsyncIterator[dict[str, Redis]]:
    made = {kind: Redis.from_url(redis_url, **options) for kind, options in CLIENTS.items()}
    try:
        yield made
    finally:
        for client in made.values():
            await client.aclose()


async def test_redis_py_gets_the_script_calls_already_encoded(
    aredis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = FifoLock(aredis, "invoices")
    await lock.release(await lock.acquire())  # scripts loaded, hub and doorbell set up
    encoded: list[Any] = []
    original = Encoder.encode

    def spy(self: Encoder, value: Any) -> Any:
        if not isinstance(value, bytes):
            encoded.append(value)
        return original(self, value)

    monkeypatch.setattr(Encoder, "encode", spy)
    await lock.release(await lock.acquire())

    # Two script calls, each with the script's SHA and its key count left to
    # redis-py; keys, tokens, call ids, floors and integers arrive as bytes.
    assert len(encoded) <= 4, encoded


@pytest.mark.parametrize("name", ["café", "lock😀", "锁名"])
@pytest.mark.parametrize(
    ("holder_kind", "waiter_kind"),
    [
        ("latin-1", "latin-1"),
        ("latin-1, decoded", "latin-1, decoded"),
        ("utf-8", "latin-1, decoded"),
        ("latin-1", "utf-8, decoded"),
    ],
)
async def test_clients_of_any_encoding_share_the_keys_and_get_their_rings(
    aredis: Redis, clients: dict[str, Redis], name: str, holder_kind: str, waiter_kind: str
) -> None:
    # Two clients, two hubs: the grant to the waiter is rung, not handed over
    # in the release's reply.
    holder = FifoLock(clients[holder_kind], name)
    waiter = FifoLock(clients[waiter_kind], name)
    lease = await holder.acquire(timeout=SERVED_WITHIN_S)
    assert await aredis.exists(f"fifolock:{{{name}}}:lease".encode()) == 1
    waiting = asyncio.create_task(waiter.acquire(token="tók-1"))
    queue = f"fifolock:{{{name}}}:queue".encode()
    await until(lambda: aredis.zcard(queue), "the waiter queued")
    assert (await waiter.status()).holder_fence == lease.fence
    await holder.release(lease)
    granted = await asyncio.wait_for(waiting, timeout=SERVED_WITHIN_S)
    assert granted.fence > lease.fence
    await waiter.release(granted)


@pytest.mark.parametrize("kind", ["latin-1", "latin-1, decoded"])
async def test_a_hand_over_in_a_release_s_reply_reaches_a_non_ascii_token(
    aredis: Redis, clients: dict[str, Redis], kind: str
) -> None:
    """In UTF-8, "à" ends with byte A0, which Latin-1 decodes as a no-break
    space: the reply's fields are split on spaces only."""
    lock = FifoLock(clients[kind], "café")
    lease = await lock.acquire(timeout=SERVED_WITHIN_S)
    waiting = asyncio.create_task(lock.acquire(token="tók-à"))
    await until(lambda: aredis.zcard("fifolock:{café}:queue".encode()), "the waiter queued")
    await lock.release(lease)
    granted = await asyncio.wait_for(waiting, timeout=SERVED_WITHIN_S)
    assert granted.token == "tók-à"
    await lock.release(granted)


@pytest.mark.parametrize("kind", list(CLIENTS))
async def test_the_scripts_on_a_grant_s_path_answer_in_one_value(
    clients: dict[str, Redis], kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 15: acquire (granted and queued), claim, release (with and
    without a hand-over) and renew each answer with a number or one string of
    fields, and every script takes its arguments in one value, so a client
    reads and sends one RESP value for them: in redis-py's pure-Python parser
    and packer a value costs about as much as the rest of a grant's handling
    of it."""
    replies: list[tuple[str, Any]] = []
    sent: list[tuple[str, list[bytes]]] = []
    run = Script.run

    async def recording(self: Script, client: Redis, keys: list[bytes], args: list[bytes]) -> Any:
        sent.append((self.filename, args))
        reply = await run(self, client, keys, args)
        replies.append((self.filename, reply))
        return reply

    monkeypatch.setattr(Script, "run", recording)
    lock = FifoLock(clients[kind], "one-value", lease_ms=900, poll_ms=300)
    lease = await lock.acquire(timeout=SERVED_WITHIN_S)
    await until(lambda: any(name == "renew.lua" for name, _ in replies), "a renewal")
    waiting = asyncio.create_task(lock.acquire())
    await until(lambda: len([n for n, _ in replies if n == "acquire.lua"]) == 2, "queued")
    await lock.release(lease)  # hands over in its reply
    granted = await asyncio.wait_for(waiting, timeout=SERVED_WITHIN_S)
    claimed = await PROTOCOL.claim(
        lock.client, lock.keys, granted.token, granted.ticket, lock.settings
    )
    assert claimed.grant is not None and claimed.grant.fence == granted.fence
    await lock.release(granted)  # nobody waits
    on_the_path = {"acquire.lua", "renew.lua", "release.lua", "claim.lua"}
    assert on_the_path <= {name for name, _ in replies}, replies
    arrays = [
        (name, reply)
        for name, reply in replies
        if name in on_the_path and not isinstance(reply, (int, bytes, str))
    ]
    assert not arrays, f"replies of more than one RESP value: {arrays}"
    assert all(len(args) == 1 for _, args in sent), [c for c in sent if len(c[1]) != 1]


class _Token(str, enum.Enum):
    JOB = "job-à"


@pytest.mark.parametrize("one_client", [True, False], ids=["handed over", "rung"])
async def test_a_str_enum_token_is_sent_as_its_value(
    clients: dict[str, Redis], one_client: bool
) -> None:
    """A token or a fence may be an Enum member of str or int (``str()`` of
    one gives its name, not its value): the lock sends its value, so that its
    grant comes back under the token the waiter knows, at once."""
    holder = FifoLock(clients["utf-8"], "enum-token", poll_ms=30_000)
    waiter = holder if one_client else FifoLock(clients["latin-1, decoded"], "enum-token")
    lease = await holder.acquire(timeout=SERVED_WITHIN_S)
    waiting = asyncio.create_task(waiter.acquire(token=_Token.JOB))
    await until(
        lambda: clients["utf-8"].zscore(holder.keys.key("queue").encode(), "job-à".encode()),
        "the waiter queued under its token's value",
    )
    await holder.release(lease)
    granted = await asyncio.wait_for(waiting, timeout=SERVED_WITHIN_S)
    assert granted.token == "job-à" and type(granted.token) is str
    fence = enum.Enum("Fence", {"HELD": granted.fence}, type=int).HELD  # str(): "Fence.HELD"
    assert await waiter.force_release(fence) == granted.fence
    with pytest.raises(LeaseLost):  # its holder learns, and its token is free again
        await waiter.release(granted)


async def test_a_name_with_spaces_rings_its_waiter(clients: dict[str, Redis]) -> None:
    """The doorbell's channels hold the lock's name, which may contain spaces:
    the scripts derive them from the keys rather than take them as an
    argument. Two clients, two hubs: the grant is rung, and reaches the
    waiter long before its poll."""
    name = "nightly billing run"
    holder = FifoLock(clients["utf-8"], name, poll_ms=30_000)
    waiter = FifoLock(clients["utf-8, decoded"], name, poll_ms=30_000)
    lease = await holder.acquire(timeout=SERVED_WITHIN_S)
    waiting = asyncio.create_task(waiter.acquire())
    await until(
        lambda: clients["utf-8"].zcard(holder.keys.key("queue").encode()), "the waiter queued"
    )
    await holder.release(lease)
    granted = await asyncio.wait_for(waiting, timeout=SERVED_WITHIN_S)
    await waiter.release(granted)


@pytest.mark.parametrize("kind", list(CLIENTS))
@pytest.mark.parametrize("namespace", ["", "café"])
async def test_every_client_lists_the_names_as_they_were_given(
    aredis: Redis, clients: dict[str, Redis], kind: str, namespace: str
) -> None:
    lock = FifoLock(clients["utf-8"], "锁é", namespace=namespace)
    lease = await lock.acquire(timeout=SERVED_WITHIN_S)
    try:
        assert await lock_names(clients[kind], namespace) == ["锁é"]
    finally:
        await lock.release(lease)


async def test_a_latin1_waiter_behind_a_long_hold_keeps_its_place(
    aredis: Redis, clients: dict[str, Redis], caplog: pytest.LogCaptureFixture
) -> None:
    # Its group first checks that Redis lets the lock ring (a PUBLISH, once per
    # server and namespace: a namespace of its own makes it this test's), then
    # polls, which keeps its process alive to Redis through the hold. A check
    # that failed on the name's encoding ended the poller: the waiter was
    # dropped once its liveness ran out, and never served.
    settings = {"lease_ms": 1000, "poll_ms": 400, "namespace": "wire-long-hold"}
    holder = FifoLock(clients["utf-8"], "lock😀", **settings)
    waiter = FifoLock(clients["latin-1"], "lock😀", **settings)
    lease = await holder.acquire(timeout=SERVED_WITHIN_S)
    waiting = asyncio.create_task(waiter.acquire(timeout=SERVED_WITHIN_S))
    await asyncio.sleep(3)  # the hold: three leases, renewed
    await holder.release(lease)
    granted = await asyncio.wait_for(waiting, timeout=SERVED_WITHIN_S)
    assert granted.fence > lease.fence
    await waiter.release(granted)
    assert not [record for record in caplog.records if record.levelname == "ERROR"]


REFUSED = [
    ({"encoding": "ascii", "decode_responses": True}, "decode_responses"),
    ({"encoding": "cp1252", "decode_responses": True}, "decode_responses"),
    ({"encoding_errors": "replace", "decode_responses": True}, "decode_responses"),
    ({"encoding": "latin-1", "encoding_errors": "ignore", "decode_responses": True}, "decode"),
    ({"encoding": "utf-8-sig"}, "ASCII as ASCII"),
    ({"encoding": "utf-16"}, "ASCII as ASCII"),
]


@pytest.mark.parametrize(("options", "says"), REFUSED)
async def test_a_client_that_cannot_carry_utf8_is_refused_when_the_lock_is_built(
    redis_url: str, options: dict[str, Any], says: str
) -> None:
    # A decoding client that garbles or refuses what other processes wrote
    # (their tokens, in any poll's reply) once ended the group's poller: its
    # waiters timed out on a free lock.
    client = Redis.from_url(redis_url, **options)
    try:
        with pytest.raises(ValueError, match=rf"FIFO lock 'café'.*{says}"):
            FifoLock(client, "café")
    finally:
        await client.aclose()
    with pytest.raises(ValueError, match=rf"FIFO lock 'café'.*{says}"):
        FifoLock(LoopClients(redis_url, **options), "café")


def test_a_url_s_encoding_options_are_checked_too(redis_url: str) -> None:
    with pytest.raises(ValueError, match=r"FIFO lock 'jobs'.*decode_responses"):
        SyncFifoLock(f"{redis_url}?encoding=cp1252&decode_responses=true", "jobs")


@pytest.mark.parametrize(
    "options",
    [
        {"encoding": "ascii"},
        {"encoding": "cp1252"},
        {"encoding": "latin-1", "decode_responses": True},
        {"encoding": "UTF8", "decode_responses": True},
    ],
)
async def test_a_client_that_carries_utf8_serves_a_waiter_behind_a_foreign_token(
    aredis: Redis, clients: dict[str, Redis], redis_url: str, options: dict[str, Any]
) -> None:
    client = Redis.from_url(redis_url, **options)
    try:
        holder = FifoLock(clients["utf-8"], "plain", lease_ms=1000, poll_ms=400)
        waiter = FifoLock(client, "plain", lease_ms=1000, poll_ms=400)
        lease = await holder.acquire(token="tók😀", timeout=SERVED_WITHIN_S)
        waiting = asyncio.create_task(waiter.acquire(timeout=SERVED_WITHIN_S))
        await asyncio.sleep(1.5)  # the hold: polls read the holder's token
        await holder.release(lease)
        granted = await asyncio.wait_for(waiting, timeout=SERVED_WITHIN_S)
        await waiter.release(granted)
    finally:
        await client.aclose()


def _lib_function(name: str) -> str:
    source = Script("acquire.lua").source
    start = source.index(f"local function {name}(")
    return source[start : source.index("\nend\n", start) + 5]


INT_MUTANTS = {
    "one %d": "local function int(n) return string.format('%d', n) end\n",
    "two parts, no range check": (
        "local function int(n) local high = math.floor(n / 1000000000) "
        "return string.format('%d%09d', high, n - high * 1000000000) end\n"
    ),
}
"""Ways int() in lib.lua could go wrong (the first is how it once was): each
must write some number differently from glibc's exact printer."""


async def _int_writes_like_glibc(aredis: Redis, int_source: str) -> bool:
    values = [0, 1, 999_999_999, 10**9, 10**9 + 1, 2**31 - 1, 2**31, 2**32 + 5]
    values += [k * 10**9 - 1 for k in range(1, 300)] + [2**53 - k for k in range(1, 300)]
    values += [1_733_370_000_000_000 + k * 7_919_113 for k in range(300)]
    values += [2**53, 2**53 + 2, 2**63, 2**64, -1, -(2**40), 2.5, 0.5, -0.3, 1e300]
    each = "local out = {} for i, v in ipairs(ARGV) do out[i] = int(tonumber(v)) end return out"
    printed = "local function exact(n) return string.format('%.0f', n) end\n"
    texts = [repr(value) for value in values]
    ours = await aredis.eval(int_source + each, 0, *texts)
    exact = await aredis.eval(printed + each.replace("int(", "exact("), 0, *texts)
    return bool(ours == exact)


async def test_the_scripts_write_every_number_as_glibc_s_exact_printer_would(
    aredis: Redis,
) -> None:
    # int() in lib.lua takes a fast path through '%d' (a C long, which may have
    # 32 bits) in two parts below 10^9; it must write what '%.0f' writes: every
    # ticket, fence and deadline goes through it.
    assert await _int_writes_like_glibc(aredis, _lib_function("int"))
    for name, mutant in INT_MUTANTS.items():
        assert not await _int_writes_like_glibc(aredis, mutant), name


async def test_a_fence_past_what_a_c_long_holds_never_turns_negative(aredis: Redis) -> None:
    # Only a hand-edited key can get there (fences follow the server clock in
    # microseconds); '%d' of such a number is undefined in C, and gave the
    # lowest long: the next grant's fence went negative, below every fence
    # before it.
    lock = FifoLock(aredis, "edge")
    await lock.release(await lock.acquire(timeout=10))
    await aredis.hset(lock.keys.key("counters"), "fence", str(2**63 - 1))
    lease = await lock.acquire(timeout=10)
    await lock.release(lease)
    assert lease.fence >= 2**63 - 1


@pytest.mark.parametrize("text", ["+300", "300.0", "0x12c", "3e2", "", "9" * 40])
@pytest.mark.parametrize("argument", ["lease_ms", "max_hold_ms", "keep_ms"])
async def test_a_script_called_with_a_malformed_number_changes_nothing(
    aredis: Redis, argument: str, text: str
) -> None:
    # The scripts pass a number's text on to Redis as it came (PEXPIRE, the
    # waiter's record); a form Redis would refuse, or the record would not
    # parse, must fail the script before its first write, not leave a grant
    # behind an error reply, or a request that is dropped while the reply
    # says queued. Only a caller of the scripts themselves can send one: the
    # lock writes digits.
    keys = LockKeys("raw")
    numbers = {"lease_ms": "5000", "max_hold_ms": "60000", "keep_ms": "5000", argument: text}
    lease_ms, max_hold_ms, keep_ms = numbers["lease_ms"], numbers["max_hold_ms"], numbers["keep_ms"]
    arguments = f"token1 proc1 {lease_ms} {max_hold_ms} 5000 {keep_ms} proc1/0 proc1/1 key1 me"
    with pytest.raises(ResponseError, match="not a whole number"):
        await aredis.eval(Script("acquire.lua").source, len(keys.all), *keys.all, arguments)
    assert await aredis.exists(*keys.all) == 0
