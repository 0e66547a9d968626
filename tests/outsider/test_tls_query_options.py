"""Found by an outside attack: TLS asked for in the URL's query (``redis://...?ssl_cert_reqs=required``,
``?ssl=true``) or as ``ssl="true"`` is neither used nor refused when the
``LoopClients`` is built; the first ``acquire`` then fails with a bare
``TypeError`` from redis-py (not a ``LockError``).

README (TLS and Configuration): "``ssl_*`` options redis.asyncio does not take
are refused when it is built", "Bad values raise ``ValueError`` naming the
setting when the lock is built". Issue 12 names ``?ssl_cert_reqs=CERT_REQUIRED``
as the spelling users are told to use. No password went out in clear in any
form tried (a plain listener saw only TLS ClientHellos or nothing).
"""

from __future__ import annotations

import pytest

from redis_fifo_lock import FifoLock, LockError, LoopClients


@pytest.mark.parametrize(
    ("url", "kwargs"),
    [
        ("redis://:pw@127.0.0.1:1/0?ssl_cert_reqs=required", {}),
        ("redis://:pw@127.0.0.1:1/0?ssl=true", {}),
        ("redis://:pw@127.0.0.1:1/0", {"ssl": "true"}),
    ],
)
async def test_tls_asked_for_in_other_spellings_is_used_or_refused_at_build(
    url: str, kwargs: dict[str, object]
) -> None:
    try:
        clients = LoopClients(url, **kwargs)
    except (TypeError, ValueError):
        return  # refused when built: what the README promises
    lock = FifoLock(clients, "tls-spelling", lease_ms=1000, poll_ms=500)
    with pytest.raises(LockError):  # a refused connection (port 1), as any LockError
        await lock.acquire(timeout=0.5)
