"""``SyncFifoLock``: the FIFO lock for threads and sync code.

There is no second implementation: every call runs the asyncio ``FifoLock`` on
a background event loop (the portal), one per process, in a daemon thread named
``fifolock-portal``. The portal's loop keeps renewing a lease while the sync
caller's critical section runs, and uses its own client (from ``LoopClients``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from . import metrics, reentry
from .clients import LoopClients
from .connection import check_url
from .holder import current_caller, describing, holder_description
from .holding import attach_release_error, keep_releasing
from .lease import Lease, LockStatus
from .lock import FifoLock, check_lease, check_text_options, check_timeout, lock_settings
from .portal import portal
from .protocol import AsyncClient, LockKeys
from .server import LockServer
from .settings import LockOptions, LockSettings, check_name, check_namespace

if TYPE_CHECKING:
    from typing_extensions import Unpack


class SyncFifoLock:
    """The FIFO lock for threads and synchronous code.

    Args:
        connection: a Redis URL (str) or a ``LoopClients`` to share connection
            settings; the portal loop builds its own client from it. Every lock
            of the process built from an equal URL shares one ``LoopClients``
            (``LockServer.server(url).clients()``), so making a lock per request
            opens no new connection; a URL with other query options (timeouts,
            TLS) gets its own. Pass a ``LoopClients`` for keyword-only options,
            and make it once per server, not once per lock.
        name: the lock name (str), as for ``FifoLock``.
        settings, namespace: as for ``FifoLock`` (see ``LockSettings``).
        **options: the lock options ``lease_ms``, ``poll_ms``, ``max_hold_ms``,
            ``replicas``, ``replica_wait_ms``: as for ``FifoLock``.
        name_template, integration: as for ``FifoLock``: the labels of the
            lock's OpenTelemetry metrics and spans (default None: "(untemplated)",
            and "core").

    Raises:
        ValueError: naming the setting, for a bad name, namespace, settings,
            ``name_template`` or ``integration``, or a URL that is not
            ``redis://``, ``rediss://`` or ``unix://``.
        TypeError: ``connection`` is neither a str nor a ``LoopClients``.

    Methods mirror ``FifoLock`` without ``await``; ``timeout`` is in seconds.
    Safe to share between threads: ownership is the returned ``Lease``.
    """

    def __init__(
        self,
        connection: str | LoopClients,
        name: str,
        *,
        settings: LockSettings | None = None,
        namespace: str = "",
        name_template: str | None = None,
        integration: str = "core",
        **options: Unpack[LockOptions],
    ) -> None:
        self.name = check_name(name)
        self.namespace = check_namespace(namespace)
        self.labels = metrics.lock_labels(name, name_template, integration)
        if isinstance(connection, LoopClients):
            self.clients = connection
        elif isinstance(connection, str):
            # The process's one LoopClients for this URL, not one per lock: the
            # portal loop never closes, so a client of each lock's own would
            # keep its connections open for good.
            self.clients = LockServer.server(check_url(connection, "connection")).clients()
        else:
            raise TypeError(
                f"FIFO lock {name!r}: connection must be a Redis URL (str) or a LoopClients, "
                f"got {type(connection).__name__}"
            )
        self.settings = lock_settings(name, self.clients, settings, options)
        check_text_options(name, self.clients)
        self._core: tuple[AsyncClient, FifoLock] | None = None

    def __repr__(self) -> str:
        return f"<SyncFifoLock {self.name!r} lease_ms={self.settings.lease_ms}>"

    def _lock(self) -> FifoLock:
        """The core lock on the running (portal) loop's client, built once per client."""
        client = self.clients.client()
        core = self._core
        if core is None or core[0] is not client:
            core = self._core = (
                client,
                FifoLock(
                    client,
                    self.name,
                    settings=self.settings,
                    namespace=self.namespace,
                    name_template=self.labels.name_template,
                    integration=self.labels.integration,
                ),
            )
        return core[1]

    def acquire(self, timeout: float | None = None, *, token: str | None = None) -> Lease:
        """Block until granted; see ``FifoLock.acquire`` (same arguments and errors).

        The check that this thread does not hold or wait for the lock already
        (``LockUsageError``, see ``reentry``), the caller's description
        (``describing()``) and its current span (the wait's parent) are taken
        in the calling thread.
        """
        caller = current_caller()
        claim = reentry.claim(
            LockKeys(self.name, self.namespace),
            holder_description(caller),
            token=token,
            timeout=check_timeout(timeout),
        )
        context = metrics.caller_context()

        async def run() -> Lease:
            with metrics.in_context(context), describing(caller):
                return await self._lock().acquire(timeout, token=token)

        async def give_back(lease: Lease) -> None:
            await self._lock().release(lease)

        try:
            lease = portal().call(self.name, run, undo=give_back)
        except BaseException:
            claim.failed()
            raise
        claim.granted(lease)
        return lease

    def release(self, lease: Lease) -> None:
        """Release ``lease``; see ``FifoLock.release`` (same errors).

        Raises:
            LockUsageError: also when ``lease`` was acquired by another process
                (this one was forked while it was held), before any portal
                thread or connection is started for it.
        """
        if isinstance(lease, Lease):
            lease.check_owner()

        async def run() -> None:
            await self._lock().release(lease)

        portal().call(self.name, run)

    def status(self) -> LockStatus:
        """A snapshot of the lock; see ``FifoLock.status``."""

        async def run() -> LockStatus:
            return await self._lock().status()

        return portal().call(self.name, run)

    def force_release(self, fence: int | None = None) -> int | None:
        """Free the lock whoever holds it; see ``FifoLock.force_release`` (same
        arguments, result and errors)."""

        async def run() -> int | None:
            return await self._lock().force_release(fence)

        return portal().call(self.name, run)

    @contextmanager
    def hold(self, timeout: float | None = None, *, token: str | None = None) -> Iterator[Lease]:
        """``with lock.hold(timeout=5) as lease:`` acquire, run the block, release.

        The lease is renewed by the portal while the block runs. Errors, and
        the retried release, as for ``FifoLock.hold``: an exception raised by
        the block always propagates, with a failed release attached to it as
        ``fifolock_release_error``.
        """
        lease = self.acquire(timeout, token=token)
        try:
            with metrics.current(lease):
                yield lease
        except BaseException as error:
            try:
                self.release_retrying(lease)
            except Exception as failure:
                attach_release_error(error, failure, self.name)
            raise
        self.release_retrying(lease)

    def release_retrying(self, lease: Lease) -> None:
        """Release ``lease`` as ``hold()`` does on the way out: a try that
        cannot reach Redis is made again after the pauses of
        ``holding.RELEASE_RETRY_PAUSES_S`` (0.1, 0.3 and 0.9 s), each try
        waiting at most ``holding.RELEASE_TRY_S`` (1 s) for its reply: about
        1.5 s in all when Redis refuses connections, up to about 5 s when it
        does not answer. So a short outage does not leave the lock held until
        ``lease_ms`` runs out. For code that holds a lease across a block of
        its own (a Celery task's body) instead of using ``hold()``.

        If the calling thread is interrupted meanwhile (a signal handler
        raising: Ctrl-C, Celery's soft time limit), the exception propagates at
        once and the release goes on in the background on the portal loop; a
        final failure is logged as a warning.

        Raises:
            RedisUnavailable: every try failed or went unanswered; the lease
                then expires by itself within ``lease_ms``.
            LeaseLost, LockUsageError: as ``release`` (never retried).
        """
        check_lease(self.name, lease).asked_to_release()  # now: the caller may be interrupted

        async def run() -> None:
            release = self._lock().release_owed(lease)
            try:
                await asyncio.shield(release)
            except asyncio.CancelledError:
                keep_releasing(self.name, release)
                raise

        portal().call(self.name, run)
