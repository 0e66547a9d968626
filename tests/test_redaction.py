"""No secret (a password, or a URL's password part) in any repr, log line or error."""

from __future__ import annotations

import pytest
from redis import Redis

from redis_fifo_lock import LoopClients, SyncFifoLock

SECRET = "s3cret-pw"


@pytest.mark.parametrize(
    "clients",
    [
        LoopClients(f"redis://:{SECRET}@cache.example:6379/0"),
        LoopClients(f"redis://cache.example/0?password={SECRET}"),
        LoopClients(host="cache.example", password=SECRET, ssl_password=SECRET),
        LoopClients.cluster(f"redis://user:{SECRET}@node.example:7000", password=SECRET),
        LoopClients.sentinel(
            [("s1.example", 26379)],
            "mymaster",
            sentinel_kwargs={"password": SECRET},
            password=SECRET,
        ),
    ],
    ids=["url", "url-query", "kwargs", "cluster", "sentinel"],
)
def test_the_repr_of_loop_clients_shows_where_but_never_the_password(
    clients: LoopClients,
) -> None:
    shown = repr(clients)

    assert SECRET not in shown
    assert "example" in shown or "mymaster" in shown


def test_a_lock_on_a_password_url_works_and_its_errors_hide_the_password(
    redis_url: str, redis: Redis
) -> None:
    redis.acl_setuser(
        "pwuser",
        enabled=True,
        passwords=[f"+{SECRET}"],
        commands=["+@all"],
        keys=["*"],
        channels=["*"],
    )
    try:
        host = redis_url.split("//", 1)[1]
        lock = SyncFifoLock(f"redis://pwuser:{SECRET}@{host}", "redaction")
        with lock.hold(timeout=5) as lease:
            assert lease.fence > 0
        assert SECRET not in repr(lock) and SECRET not in repr(lock.clients)

        with pytest.raises(ValueError) as caught:
            SyncFifoLock(f"http://pwuser:{SECRET}@{host}", "redaction")
        assert SECRET not in str(caught.value)
    finally:
        redis.acl_deluser("pwuser")
