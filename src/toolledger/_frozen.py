"""A quicker ``__init__`` for the frozen, slotted dataclasses every call builds.

A frozen dataclass's ``__init__`` sets each field with ``object.__setattr__(self, name, value)``,
since its own ``__setattr__`` refuses: a generic call that slices its arguments and looks the
attribute up again, for every field of every record, op and request — about a fifth of what
a call's Python runs. ``quick_init`` gives such a class an ``__init__`` with the very same
signature (parameters, defaults, ``__post_init__``) that sets each field through its slot's
own descriptor instead: the same value in the same slot, the instance as frozen as before,
in about half the time. It takes only what it can copy exactly — every field in ``__init__``,
no default factory, no ``InitVar`` — and refuses any other class when it is defined.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, TypeVar

__all__ = ["quick_init"]

C = TypeVar("C", bound=type)


def quick_init(cls: C) -> C:
    """``cls`` (a frozen dataclass with ``slots=True``) with its ``__init__`` made quicker."""
    params = dataclasses.fields(cls)  # raises for anything but a dataclass
    how = cls.__dataclass_params__  # type: ignore[attr-defined]
    problem = (
        "its __init__ is not the one dataclass writes"
        if not how.init or "__init__" not in cls.__dict__
        else "it is not frozen"
        if not how.frozen
        else "it has no slots"
        if "__slots__" not in cls.__dict__
        else next(
            (
                f"its field {f.name!r} is not an argument or has a default factory"
                for f in params
                if not f.init or f.default_factory is not dataclasses.MISSING
            ),
            None,
        )
    )
    post_init = getattr(cls, "__post_init__", None)
    if (
        problem is None
        and post_init is not None
        and len(inspect.signature(post_init).parameters) != 1
    ):
        problem = "its __post_init__ takes InitVars"
    if problem is not None:
        raise TypeError(f"quick_init({cls.__qualname__}): {problem}")
    generated = cls.__dict__["__init__"]  # the one ``dataclass`` wrote
    positional = [f.name for f in params if not f.kw_only]
    keywords = [f.name for f in params if f.kw_only]
    signature = ", ".join(["self", *positional, *(["*", *keywords] if keywords else [])])
    body = [f"    _set_{f.name}(self, {f.name})" for f in params]
    if post_init is not None:
        body.append("    self.__post_init__()")
    source = f"def __init__({signature}):\n" + "\n".join(body or ["    pass"]) + "\n"
    scope: dict[str, Any] = {f"_set_{f.name}": cls.__dict__[f.name].__set__ for f in params}
    exec(source, scope)  # noqa: S102 - our own source, made of the class's field names
    init = scope["__init__"]
    init.__defaults__ = generated.__defaults__
    init.__kwdefaults__ = generated.__kwdefaults__
    init.__annotations__ = generated.__annotations__
    init.__qualname__ = generated.__qualname__
    init.__module__ = cls.__module__
    init.__doc__ = generated.__doc__
    type.__setattr__(cls, "__init__", init)
    return cls
