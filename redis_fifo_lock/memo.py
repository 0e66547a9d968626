"""``cached_attribute``: ``functools.cached_property`` without its lock.

On Python 3.10 and 3.11, ``functools.cached_property`` computes each value
under one lock per property, shared by every instance of the class (3.12
dropped it). A process forked while another of its threads held that lock
(the sync facade's portal thread hashing new ``LockSettings``, say) leaves
the child a lock that nobody will release: its first access to the property
on any instance not yet cached hangs for good (an outside attack: 90 forked
children of 300 on 3.10 and 3.11). The values cached here are pure functions
of an object's fields, which never change, so two threads working one out at
once is harmless: both store the same value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class cached_attribute(Generic[T]):
    """Decorate a method of one argument (``self``) so that its value is worked
    out on first access and stored in the instance's ``__dict__`` under the
    method's name, where later lookups find it (also on a frozen dataclass,
    whose ``__setattr__`` it does not go through). Takes no lock.

    Args:
        func: the method; it must depend only on fields that never change.
    """

    def __init__(self, func: Callable[[Any], T]) -> None:
        self.func = func
        self.name = func.__name__
        self.__doc__ = func.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> cached_attribute[T]: ...

    @overload
    def __get__(self, instance: object, owner: type | None = None) -> T: ...

    def __get__(
        self, instance: object | None, owner: type | None = None
    ) -> T | cached_attribute[T]:
        if instance is None:
            return self
        value = self.func(instance)
        instance.__dict__[self.name] = value
        return value
