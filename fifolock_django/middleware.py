"""``LockHolderMiddleware``: locks taken while a request runs say which request took them.

Add it to ``MIDDLEWARE`` (anywhere; first is best, so that locks taken by other
middleware are described too)::

    MIDDLEWARE = ["fifolock_django.middleware.LockHolderMiddleware", ...]

Every FIFO lock acquired while the request is handled - by the view, sync or
async, under WSGI or ASGI - then records ``request <METHOD> <path>`` in its
holder description, which ``fifolock status`` and ``LockStatus.holder`` show.
The query string is left out (it may carry secrets); the description is
bounded and stripped of control characters like every holder description.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponseBase

from redis_fifo_lock import describing


def request_caller(request: HttpRequest) -> str:
    """The holder description of locks taken for ``request``: ``"request GET /path/"``."""
    return f"request {request.method} {request.path}"


class LockHolderMiddleware:
    """Describe the request to the FIFO locks its handling takes (sync and async).

    Args:
        get_response: the next middleware or the view (Django passes it).
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> HttpResponseBase | Awaitable[HttpResponseBase]:
        """Handle ``request`` with its description set for the locks it takes."""
        if self.is_async:
            return self._acall(request)
        with describing(request_caller(request)):
            response: HttpResponseBase = self.get_response(request)
            return response

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        with describing(request_caller(request)):
            response: HttpResponseBase = await self.get_response(request)
            return response
