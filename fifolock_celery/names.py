"""Lock names that depend on a task's arguments: ``"invoice-{invoice_id}"``.

A template is ``str.format`` syntax whose fields name parameters of the task
function (attribute and index access allowed: ``"{order.id}"``,
``"{kwargs[region]}"``). Arguments are bound with ``inspect.signature`` and
their defaults applied, so ``f(1)``, ``f(invoice_id=1)`` and a default value all
give the same name. A name without fields is used as it is.

A field's value is formatted as a worker receives it, whatever the serializer,
so a direct call, ``.apply()`` and a worker lock the same name: a tuple or
namedtuple shows as a list (``batch-[1, 2]``), a ``str``, ``int`` or ``float``
subclass as its plain value (``class Kind(str, Enum)`` gives ``batch-a``, as do
Django's ``TextChoices``), a datetime with its zone as a UTC offset. Attribute
and index access happen on the arguments as given, so ``{point.x}`` on a
namedtuple works in a direct call but fails in a JSON worker, which receives a
list.

Checked when the task is decorated: fields naming a parameter the function
lacks. Checked when the task runs (the error names the task): a field that a
function taking ``**kwargs`` did not receive, attribute or index access that
fails, and a value whose text could differ in a worker or another process (a
``set``, a ``dict``, a time zone, an object with ``__json__``, a lazy text, an
object shown by its memory address), which would give the same call two
different locks.
"""

from __future__ import annotations

import datetime
import decimal
import inspect
import re
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from string import Formatter
from typing import Any

from redis_fifo_lock import LockUsageError
from redis_fifo_lock.settings import check_name, shown_value


def _root(field: str) -> str:
    """The parameter a field starts from: ``"order"`` for ``"order.id"``."""
    return re.split(r"[.\[]", field, maxsplit=1)[0]


def _fields(template: str) -> Iterator[tuple[str, str | None]]:
    """Yield ``(literal_text, field_name or None)`` pairs, nested specs included."""
    for literal, field, spec, _conversion in Formatter().parse(template):
        yield literal, field
        if field is not None and spec:
            yield from _fields(spec)


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
"""How ``object.__repr__`` shows an object: by an address private to one process."""


_AS_SENT = (str, int, float, bool, type(None), bytes, datetime.date, decimal.Decimal, uuid.UUID)
"""Exact types that every Celery serializer able to carry them brings back as they were.

Kombu's JSON carries ``bytes``, dates, ``Decimal`` and ``UUID`` as tagged
values; pickle keeps every type; msgpack and YAML refuse what they cannot carry.
"""

_TAGGED = (bytes, decimal.Decimal, uuid.UUID)
"""Types kombu's JSON sends tagged and brings back as the base type, losing a subclass."""


def _as_received(value: Any, field: str) -> Any:
    """``value`` as a worker receives it, whatever the serializer, so that a
    direct or eager call formats the same text as the worker does.

    JSON (Celery's default, and msgpack and YAML alike) turns a tuple (a
    namedtuple too) into a list and a ``str``, ``int`` or ``float`` subclass (a
    ``class Kind(str, Enum)`` member) into the plain value, and kombu's JSON
    brings a datetime or time back with a fixed UTC offset for its zone. Pickle
    keeps them all, so both paths are brought to the JSON form.

    Raises:
        _Unstable: the value's text could differ in the worker: a set or a
            frozenset, a dict (JSON turns its keys into strings), a time zone, a
            subclass of a type kombu's JSON brings back as its base type, an
            object with a ``__json__`` method (JSON sends what it returns), a
            Django lazy text (``gettext_lazy``), or an object shown by its
            memory address.
    """
    kind = type(value)
    if kind in _AS_SENT:
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, (list, tuple)):
        return [_as_received(item, field) for item in value]
    if hasattr(value, "__json__"):
        raise _Unstable(field, f"is a {kind.__name__}, which JSON sends as its __json__()")
    # The base classes' isoformat, as kombu's JSON calls it: a subclass's own
    # (one that drops the microseconds, say) is not what a worker receives.
    if isinstance(value, datetime.datetime):
        return datetime.datetime.fromisoformat(datetime.datetime.isoformat(value))
    if isinstance(value, datetime.time):
        return datetime.time.fromisoformat(datetime.time.isoformat(value))
    if isinstance(value, datetime.date):
        return datetime.date.fromisoformat(datetime.date.isoformat(value))
    if isinstance(value, (set, frozenset)):
        raise _Unstable(field, f"is a {kind.__name__}, whose order is not fixed")
    if isinstance(value, dict):
        raise _Unstable(field, f"is a {kind.__name__}, whose keys JSON turns into strings")
    if isinstance(value, datetime.tzinfo):
        raise _Unstable(field, f"is a time zone ({kind.__name__}), which JSON sends as an offset")
    if isinstance(value, _TAGGED):
        base = next(t for t in _TAGGED if isinstance(value, t))
        raise _Unstable(field, f"is a {kind.__name__}, which JSON brings back as a {base.__name__}")
    functional = sys.modules.get("django.utils.functional")
    if functional is not None and isinstance(value, functional.Promise):
        raise _Unstable(
            field,
            "is a lazy text, which JSON sends as the publisher's text and pickle as the worker's",
        )
    for text in (str(value), repr(value)):
        if _ADDRESS.search(text):
            raise _Unstable(field, f"shows as {shown_value(text)}, with a memory address")
    return value


class _StableFormatter(Formatter):
    """``str.format`` on the values a worker receives, refusing values whose
    text depends on the process or on the serializer (see ``_as_received``)."""

    def get_field(self, field_name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        value, root = super().get_field(field_name, args, kwargs)
        return _as_received(value, field_name), root


class _Unstable(Exception):
    """A field's value could format differently in a worker or another process."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(field, why)
        self.field = field
        self.why = why


class NameTemplate:
    """A lock name, possibly with ``{parameter}`` fields, checked against a function.

    Args:
        template: the name or template (str).
        func: the task function whose parameters the fields name. When it takes
            ``**kwargs``, a field may also name a keyword argument that only
            ``**kwargs`` receives; that one is checked at run time.

    Raises:
        ValueError: when the template is malformed, has a positional field
            (``{}``, ``{0}``), names a parameter ``func`` does not take (and
            ``func`` has no ``**kwargs``), or its fixed text could never make a
            valid lock name (for example it contains ``{{`` or a control
            character).
    """

    def __init__(self, template: str, func: Callable[..., Any]) -> None:
        if not isinstance(template, str):
            raise ValueError(f"lock name must be a str, got {type(template).__name__}")
        self.template = template
        self.signature = inspect.signature(func)
        where = f"lock name {template!r} of {func.__qualname__}"
        try:
            parts = list(_fields(template))
        except ValueError as exc:
            raise ValueError(f"{where} is not a valid format string: {exc}") from None
        roots = [_root(field) for _, field in parts if field is not None]
        if any(root == "" or root.isdigit() for root in roots):
            raise ValueError(f"{where} has a positional field ({{}} or {{0}}); name the parameter")
        self.fields = frozenset(roots)
        parameters = self.signature.parameters
        self.var_keyword: str | None = next(
            (p.name for p in parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD),
            None,
        )
        missing = sorted(self.fields - parameters.keys())
        if missing and self.var_keyword is None:
            raise ValueError(
                f"{where} names {', '.join(missing)}, which the function does not take; "
                f"its parameters are: {', '.join(parameters) or '(none)'}"
            )
        self.from_var_keyword = frozenset(missing)
        # Check the fixed text now, with every field standing in as "x"; the
        # formatted name is checked again at run time.
        try:
            check_name("".join(text + ("" if field is None else "x") for text, field in parts))
        except ValueError as exc:
            raise ValueError(f"{where} can never make a valid lock name: {exc}") from None

    def __repr__(self) -> str:
        return f"<NameTemplate {self.template!r}>"

    def format(self, args: tuple[Any, ...], kwargs: Mapping[str, Any], task: str = "") -> str:
        """The lock name for one call of the function.

        Args:
            args, kwargs: the call's positional and keyword arguments.
            task: the task's name (str), put in error messages; default "".

        Raises:
            TypeError: the arguments do not fit the function's signature (as
                calling the function would); the message names the task.
            LockUsageError: a field cannot be filled from this call (a keyword
                that ``**kwargs`` did not receive, a failing ``.attribute`` or
                ``[index]``), its value could format differently in a worker
                or another process (a set, a dict, a time zone, an object with
                ``__json__``, a lazy text, an object shown by address: see the
                module's docstring), or the name it
                makes is refused (a brace, an invisible character, too long:
                see ``redis_fifo_lock.settings.check_name``). The error's
                ``name`` is the template; the message names the task and shows
                at most a short excerpt of any value.
        """
        if not self.fields:
            return self.template
        who = f"task {task}" if task else "the task"
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{who}: cannot fill lock name {self.template!r}: {exc}") from None
        bound.apply_defaults()
        values = dict(bound.arguments)
        extra: Mapping[str, Any] = values.get(self.var_keyword, {}) if self.var_keyword else {}
        for field in self.from_var_keyword:
            if field not in extra:
                raise LockUsageError(
                    self.template,
                    f"{who} was called without {field!r}, which the lock name needs; pass "
                    f"{field}=... to every call (it reaches the function through "
                    f"**{self.var_keyword}), or name a parameter of the function instead",
                )
            values[field] = extra[field]
        try:
            name = _StableFormatter().vformat(self.template, (), values)
        except _Unstable as exc:
            raise LockUsageError(
                self.template,
                f"in {who}, field {{{exc.field}}} {exc.why}: the same call could get another "
                "lock name in a worker or another process; name something with a stable text "
                "instead, such as an id attribute ({order.id}), a str, or a sorted list",
            ) from None
        except (AttributeError, KeyError, IndexError, TypeError, ValueError) as exc:
            raise LockUsageError(
                self.template,
                f"{who}: cannot fill the lock name from this call's arguments: "
                f"{type(exc).__name__}: {shown_value(str(exc))}",
            ) from None
        try:
            return check_name(name)
        except ValueError as exc:
            raise LockUsageError(
                self.template,
                f"{who}: this call's arguments make a lock name the lock refuses ({exc}); "
                "pass values without braces or invisible characters, or name a field that "
                "holds a plain id",
            ) from None
