"""Constructors written out, for the frozen records built on every call and every turn.

A frozen dataclass's generated ``__init__`` sets each field with ``object.__setattr__``: the
method looked up on ``object``, its arguments sliced into a new tuple, and the slot looked up
again by name — about 650 instructions a field on CPython 3.11. A constructor that sets each
slot through its descriptor (``slot_setters``) stores the very same value in about 60% of the
time (an ``EffectRecord``: 1.4 µs against 2.3). A call builds two ``EffectRecord``s of 19
fields, its batch's ``Env``, its tool's context and its ops; a turn two ``SessionState``s and
two ``StoredMessage``s besides; every ledger or transcript read one record per row. For those
classes alone the constructor is written out by hand, beside the class, with the generated
one's signature; ``install`` puts it in place and keeps the generated one (``GENERATED``),
against which ``tests/test_constructors.py`` checks every such class: the same parameters,
kinds and defaults, the same value in every field, the same refusals — a field added to one of
these classes and not to its constructor fails there. (Generated for every class instead, it
would be source run through ``exec``, which the code allows nowhere.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

__all__ = ["GENERATED", "install", "slot_setters"]

Setter = Callable[[Any, Any], None]

GENERATED: dict[type, Callable[..., None]] = {}
"""Each class whose constructor is written out, and the constructor its dataclass generated."""


def slot_setters(cls: type) -> tuple[Setter, ...]:
    """``cls``'s fields' slot setters (their descriptors' ``__set__``), in field order."""
    return tuple(getattr(cls, f.name).__set__ for f in fields(cls))


def install(cls: type, init: Callable[..., None]) -> None:
    """Make ``init`` ``cls``'s constructor, named as its own, the generated one kept."""
    generated: Callable[..., None] = vars(cls)["__init__"]  # the one its dataclass made
    GENERATED[cls] = generated
    init.__name__ = "__init__"
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    setattr(cls, "__init__", init)  # noqa: B010 (a method: mypy refuses an assignment)
