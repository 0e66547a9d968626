"""The ``fifolock_django`` app: add it to ``INSTALLED_APPS`` for its system checks."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core.signals import request_finished, request_started

from redis_fifo_lock.holder import set_caller


def describe_request(
    sender: object,
    environ: dict[str, Any] | None = None,
    scope: dict[str, Any] | None = None,
    **kwargs: Any,
) -> None:
    """``request_started`` receiver: locks taken while the request runs record its
    method and path (``"request GET /invoices/"``) in their holder description
    (WSGI passes ``environ``, ASGI ``scope``). The query string is left out: it
    may carry secrets."""
    if environ is not None:
        method, path = environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", "")
    elif scope is not None:
        method, path = scope.get("method", ""), scope.get("path", "")
    else:
        return
    set_caller(f"request {method} {path}")


def forget_request(sender: object, **kwargs: Any) -> None:
    """``request_finished`` receiver: the request no longer describes the caller."""
    set_caller("")


class FifoLockAppConfig(AppConfig):
    """Registers the ``fifolock.*`` system checks (see ``fifolock_django.checks``)
    and the request signals that describe lock holders."""

    name = "fifolock_django"
    label = "fifolock"
    verbose_name = "Redis FIFO lock"

    def ready(self) -> None:
        """Import the checks module, whose functions register themselves, and
        connect ``describe_request``/``forget_request`` to the request signals."""
        from . import checks  # noqa: F401

        request_started.connect(describe_request, dispatch_uid="fifolock_describe_request")
        request_finished.connect(forget_request, dispatch_uid="fifolock_forget_request")
