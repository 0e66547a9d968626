"""Moving one hash slot between masters of a running cluster, step by step.

``SlotMover`` does what ``redis-cli --cluster reshard`` does for one slot, but
lets a test stop between the steps to act while the slot is half moved:

1. ``begin(target)``: ``CLUSTER SETSLOT <slot> IMPORTING <source>`` on the
   target, then ``MIGRATING <target>`` on the source. From now on a command
   on the source whose keys are not all there gets ``ASK`` (none there) or
   ``TRYAGAIN`` (some there); on the target only ``ASKING`` commands whose
   keys are all there run, the others get ``TRYAGAIN``.
2. ``move(limit)``: ``MIGRATE host port "" 0 timeout KEYS k1 k2 ...`` of up to
   ``limit`` keys the source still has in the slot (``CLUSTER GETKEYSINSLOT``),
   in one batch; the keys keep their TTLs.
3. ``finish()``: moves what is left, then ``CLUSTER SETSLOT <slot> NODE
   <target>`` on the target, the source and every other master, in that order.

The mover talks to each node directly (plain ``redis.asyncio.Redis``, no
redirection), never through a cluster client.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType

from redis.asyncio import Redis

from tests.cluster_tests.conftest import LocalCluster

MIGRATE_TIMEOUT_MS = 5000


@dataclass(frozen=True)
class Master:
    """One master of the cluster: its address, its node id and a direct client."""

    host: str
    port: int
    node_id: str
    client: Redis

    @property
    def address(self) -> str:
        """``host:port``."""
        return f"{self.host}:{self.port}"


async def slot_owner(client: Redis, slot: int) -> str:
    """Node id of the master serving ``slot``, as ``client``'s node sees it
    (``CLUSTER SLOTS``)."""
    for span in await client.execute_command("CLUSTER", "SLOTS"):
        low, high, master = int(span[0]), int(span[1]), span[2]
        if low <= slot <= high:
            return str(master[2])
    raise AssertionError(f"slot {slot} is not served according to {client}")


class SlotMover:
    """Moves slots of ``cluster`` between its masters; an async context manager
    that holds one direct connection per master."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.masters: list[Master] = []
        self.slot: int | None = None
        self.source: Master | None = None
        self.target: Master | None = None

    async def __aenter__(self) -> SlotMover:
        for node in self.cluster.nodes:
            client = Redis(host=node.host, port=node.port, decode_responses=True)
            node_id = str(await client.execute_command("CLUSTER", "MYID"))
            self.masters.append(Master(node.host, node.port, node_id, client))
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.slot is not None:
            # A test failed mid-migration: complete it, so the session's cluster
            # is left with every slot served by one master.
            await self.finish()
        for master in self.masters:
            await master.client.aclose()

    async def owner(self, slot: int) -> Master:
        """The master serving ``slot`` now (asked of the first master)."""
        node_id = await slot_owner(self.masters[0].client, slot)
        return next(master for master in self.masters if master.node_id == node_id)

    async def keyslot(self, key: str) -> int:
        """``CLUSTER KEYSLOT key``."""
        return int(await self.masters[0].client.execute_command("CLUSTER", "KEYSLOT", key))

    async def begin(self, slot: int, target: Master | None = None) -> Master:
        """Open the migration of ``slot`` to ``target`` (default: the next master
        after its owner); returns the target."""
        source = await self.owner(slot)
        if target is None:
            target = self.masters[(self.masters.index(source) + 1) % len(self.masters)]
        assert target is not source, "a slot cannot move to its own master"
        self.slot, self.source, self.target = slot, source, target
        await target.client.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
        await source.client.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
        return target

    async def move(self, limit: int) -> int:
        """MIGRATE up to ``limit`` of the keys the source still has in the slot, in
        one batch; returns how many it found to move."""
        source, target = self._open()
        keys = await source.client.execute_command("CLUSTER", "GETKEYSINSLOT", self.slot, limit)
        if keys:
            # A key that expired since GETKEYSINSLOT makes MIGRATE reply NOKEY.
            await source.client.execute_command(
                "MIGRATE", target.host, target.port, "", 0, MIGRATE_TIMEOUT_MS, "KEYS", *keys
            )
        return len(keys)

    async def finish(self) -> None:
        """Move every key left, then assign the slot to the target on all masters."""
        source, target = self._open()
        while await self.move(100):
            pass
        for master in [target, source, *(m for m in self.masters if m not in (source, target))]:
            await master.client.execute_command(
                "CLUSTER", "SETSLOT", self.slot, "NODE", target.node_id
            )
        self.slot = self.source = self.target = None

    def _open(self) -> tuple[Master, Master]:
        if self.slot is None or self.source is None or self.target is None:
            raise AssertionError("no migration open: call begin() first")
        return self.source, self.target
