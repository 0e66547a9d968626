"""Lock names that depend on a task's arguments: ``"invoice-{invoice_id}"``.

A template is ``str.format`` syntax whose fields name parameters of the task
function (attribute and index access allowed: ``"{order.id}"``,
``"{kwargs[region]}"``). Arguments are bound with ``inspect.signature`` and
their defaults applied, so ``f(1)``, ``f(invoice_id=1)`` and a default value all
give the same name. A name without fields is used as it is.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator, Mapping
from string import Formatter
from typing import Any

from redis_fifo_lock.settings import check_name


def _root(field: str) -> str:
    """The parameter a field starts from: ``"order"`` for ``"order.id"``."""
    return re.split(r"[.\[]", field, maxsplit=1)[0]


def _fields(template: str) -> Iterator[tuple[str, str | None]]:
    """Yield ``(literal_text, field_name or None)`` pairs, nested specs included."""
    for literal, field, spec, _conversion in Formatter().parse(template):
        yield literal, field
        if field is not None and spec:
            yield from _fields(spec)


class NameTemplate:
    """A lock name, possibly with ``{parameter}`` fields, checked against a function.

    Args:
        template: the name or template (str).
        func: the task function whose parameters the fields name.

    Raises:
        ValueError: when the template is malformed, has a positional field
            (``{}``, ``{0}``), names a parameter ``func`` does not take, or its
            fixed text could never make a valid lock name (for example it
            contains ``{{`` or a control character).
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
        missing = sorted(self.fields - self.signature.parameters.keys())
        if missing:
            raise ValueError(
                f"{where} names {', '.join(missing)}, which the function does not take; "
                f"its parameters are: {', '.join(self.signature.parameters) or '(none)'}"
            )
        # Check the fixed text now, with every field standing in as "x"; the
        # formatted name is checked again at run time.
        try:
            check_name("".join(text + ("" if field is None else "x") for text, field in parts))
        except ValueError as exc:
            raise ValueError(f"{where} can never make a valid lock name: {exc}") from None

    def __repr__(self) -> str:
        return f"<NameTemplate {self.template!r}>"

    def format(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
        """The lock name for one call of the function.

        Args:
            args, kwargs: the call's positional and keyword arguments.

        Raises:
            TypeError: the arguments do not fit the function's signature (as
                calling the function would).
        """
        if not self.fields:
            return self.template
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return self.template.format_map(bound.arguments)
