"""Who holds a lock: the short description each request records in Redis.

A grant carries a description of its holder - the host, the process id and
what the integration knows of the caller (a Celery task's name and id, a
management command, a request path) - for onlookers: ``status()`` and the
operator command show it. It is never trusted for any decision: anyone who
can write to Redis can write anything there.

Integrations say what the caller is with ``describing()``; the core adds the
host and process id when a request is sent. Descriptions are bounded
(``MAX_HOLDER_BYTES``) and stripped of control characters and line
separators, so a request path or task name cannot bloat Redis or garble a
terminal or a log.
"""

from __future__ import annotations

import functools
import os
import socket
import unicodedata
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar

from .settings import shown_value

MAX_HOLDER_BYTES = 256
"""Longest description recorded for a holder, in bytes of UTF-8."""

_caller: ContextVar[str] = ContextVar("fifolock_holder", default="")


def _breaks_lines(ch: str) -> bool:
    """Whether ``ch`` may garble a line it is shown in: a control character
    (category C*), or a line or paragraph separator (Zl, Zp)."""
    category = unicodedata.category(ch)
    return category[0] == "C" or category in ("Zl", "Zp")


def bounded(text: str, limit: int = MAX_HOLDER_BYTES) -> str:
    """``text`` with control characters (line breaks, escapes...) and Unicode's
    line and paragraph separators (U+2028, U+2029: lines to ``splitlines`` and
    to many log viewers) replaced by a space, and cut to at most ``limit``
    bytes of UTF-8 (int, default ``MAX_HOLDER_BYTES``) on a character
    boundary; an ellipsis marks a cut."""
    if text.isascii() and text.isprintable() and len(text) <= limit:
        return text  # printable ASCII holds no control character: the common case
    clean = "".join(" " if _breaks_lines(ch) else ch for ch in text)
    data = clean.encode("utf-8")
    if len(data) <= limit:
        return clean
    return data[: limit - 3].decode("utf-8", "ignore") + "..."


def describing(caller: str) -> AbstractContextManager[None]:
    """Describe the caller as ``caller`` (str, e.g. ``"celery task bill[1f2e...]"``)
    to every lock acquired in this block (in this thread or task, and the tasks
    it starts); an inner block replaces an outer one's description.

    The description is shown to onlookers only (``LockStatus.holder``); it is
    bounded and cleaned like every description (see ``bounded``).

    Raises:
        TypeError: ``caller`` is not a ``str`` (when called, before the block).
    """
    if not isinstance(caller, str):
        raise TypeError(
            f"describing() takes a str describing the caller, got {type(caller).__name__}: "
            f"{shown_value(caller)}"
        )
    return _described(bounded(caller))


@contextmanager
def _described(description: str) -> Iterator[None]:
    token = _caller.set(description)
    try:
        yield
    finally:
        _caller.reset(token)


def current_caller() -> str:
    """What ``describing()`` says of the running context ("" outside any)."""
    return _caller.get()


def holder_description(caller: str | None = None) -> str:
    """The description recorded for a request made now: ``"<host> pid <pid>"``,
    then ``caller`` (default: ``current_caller()``) when there is one, bounded
    (see ``bounded``)."""
    caller = current_caller() if caller is None else caller
    where = _process(os.getpid())
    return bounded(f"{where}: {caller}" if caller else where)


@functools.lru_cache(maxsize=4)
def _process(pid: int) -> str:
    """``"<host> pid <pid>"``, worked out once per process (a forked child has
    its own pid, so its own entry)."""
    return f"{socket.gethostname()} pid {pid}"
