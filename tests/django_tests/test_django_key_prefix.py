"""A cache's locks live under its ``KEY_PREFIX``: a tenant confined by an ACL to
``~tenantA:*`` (and ``&tenantA:*``) takes and releases locks, waits on the doorbell,
and every lock key matches the pattern."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from django.core.cache import caches
from django.test import override_settings
from django_app import settings as project
from redis import Redis

from fifolock_django.lock import SupportsFifoLock
from redis_fifo_lock.testing import PrivateRedisFactory
from tests.support.polling import until_sync


@pytest.fixture
def tenant_url(fresh_redis_server: PrivateRedisFactory) -> Iterator[tuple[str, Redis]]:
    """A URL for user tenantA, confined to keys and channels ``tenantA:*``, and an
    admin client of the same server."""
    server = fresh_redis_server()
    admin = Redis.from_url(server.url, decode_responses=True)
    admin.acl_setuser(
        "tenantA",
        enabled=True,
        passwords=["+tenant-pw"],
        keys=["tenantA:*"],
        channels=["tenantA:*"],
        commands=["+@all"],
    )
    yield f"redis://tenantA:tenant-pw@{server.host}:{server.port}/0", admin
    admin.close()


@pytest.mark.parametrize("backend", list(project.BACKENDS))
def test_a_tenant_confined_to_its_prefix_takes_and_hands_over_locks(
    tenant_url: tuple[str, Redis], backend: str
) -> None:
    url, admin = tenant_url
    entry = {"BACKEND": project.BACKENDS[backend], "LOCATION": url, "KEY_PREFIX": "tenantA"}
    with override_settings(CACHES={"default": entry}):
        cache = caches["default"]
        assert isinstance(cache, SupportsFifoLock)
        cache.set("greeting", "hello")  # the cache's own keys are allowed
        granted = threading.Event()

        def second() -> None:
            with cache.fifo_lock("invoices", timeout=30):
                granted.set()

        with cache.fifo_lock("invoices", timeout=20):
            keys = set(admin.keys("*"))
            waiter = threading.Thread(target=second)
            waiter.start()
            until_sync(lambda: admin.pubsub_channels("*"), "the waiter listens on its doorbell")
            channels = admin.pubsub_channels("*")
        waiter.join(30)
        assert granted.is_set()
    lock_keys = {key for key in keys if "fifolock" in key}
    assert "tenantA:fifolock:{tenantA:1:invoices}:lease" in lock_keys
    assert all(key.startswith("tenantA:") for key in keys | set(channels))
    assert all(ch.startswith("tenantA:fifolock:{tenantA:1:invoices}:doorbell:") for ch in channels)
    assert all(key.count("{") == 1 and key.count("}") == 1 for key in lock_keys | set(channels))
