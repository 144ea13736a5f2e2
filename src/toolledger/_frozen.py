"""A quicker ``__init__`` for the frozen, slotted dataclasses every call builds.

A frozen dataclass's ``__init__`` sets each field with ``object.__setattr__(self, name, value)``,
since its own ``__setattr__`` refuses: a generic call that slices its arguments and looks the
attribute up again, for every field of every record, op and request — about a fifth of what
a call's Python runs. ``quick_init`` gives such a class an ``__init__`` with the very same
signature (parameters, defaults, ``__post_init__``) that sets each field through its slot's
own descriptor instead: the same value in the same slot, the instance as frozen as before,
in about half the time. It is built as ``dataclass`` builds its own — in the class's module's
globals (its string annotations resolve as before), its setters closed over — and takes only
what it can copy exactly: every field an argument held in a slot, no default factory, no
``InitVar``, the generated ``__init__``'s parameters exactly the fields. Any other class is
refused when it is defined.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import types
from typing import Any, TypeVar

__all__ = ["quick_init"]

C = TypeVar("C", bound=type)


def _slot(cls: type, name: str) -> Any:
    """The slot descriptor that holds field ``name`` of ``cls`` (its own or a base's), or
    ``None`` if the field is not held in a slot."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            found = klass.__dict__[name]
            return found if isinstance(found, types.MemberDescriptorType) else None
    return None


def quick_init(cls: C) -> C:
    """``cls`` (a frozen dataclass with ``slots=True``) with its ``__init__`` made quicker."""
    params = dataclasses.fields(cls)  # raises for anything but a dataclass
    how = cls.__dataclass_params__  # type: ignore[attr-defined]
    generated: Any = cls.__dict__.get("__init__")  # the one ``dataclass`` wrote
    names = [f.name for f in params]
    positional = [f.name for f in params if not f.kw_only]
    keywords = [f.name for f in params if f.kw_only]
    problem = None
    if not how.init or generated is None:
        problem = "its __init__ is not the one dataclass writes"
    elif not how.frozen:
        problem = "it is not frozen"
    elif "__slots__" not in cls.__dict__:
        problem = "it has no slots"
    elif any(not f.init or f.default_factory is not dataclasses.MISSING for f in params):
        problem = "a field is not an argument or has a default factory"
    elif any(_slot(cls, n) is None for n in names):
        problem = "a field is not held in a slot"
    elif any(n.startswith("__quick_") for n in names):
        problem = "a field's name collides with quick_init's own"
    else:
        # The generated __init__'s own parameters (InitVars included), in order, with kinds:
        # ours must be exactly these, or we are not a copy.
        theirs = [
            (p.name, p.kind) for p in list(inspect.signature(generated).parameters.values())[1:]
        ]
        ours = [(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in positional] + [
            (n, inspect.Parameter.KEYWORD_ONLY) for n in keywords
        ]
        if theirs != ours:
            problem = "its __init__ takes more than its fields (InitVars?)"
    post_init = getattr(cls, "__post_init__", None)
    if (
        problem is None
        and post_init is not None
        and len(inspect.signature(post_init).parameters) != 1
    ):
        problem = "its __post_init__ takes InitVars"
    if problem is not None:
        raise TypeError(f"quick_init({cls.__qualname__}): {problem}")
    me = "__dataclass_self__" if "self" in names else "self"
    signature = ", ".join([me, *positional, *(["*", *keywords] if keywords else [])])
    setters = [f"__quick_set_{i}" for i in range(len(names))]
    body = [f"        {s}({me}, {n})" for s, n in zip(setters, names, strict=True)]
    if post_init is not None:
        body.append(f"        {me}.__post_init__()")
    source = (
        f"def __quick_init_factory__({', '.join(setters)}):\n"
        f"    def __init__({signature}):\n"
        + "\n".join(body or ["        pass"])
        + "\n    return __init__\n"
    )
    # The module's globals, as dataclass uses: typing.get_type_hints(cls.__init__) and
    # inspect.signature(cls, eval_str=True) resolve string annotations in __init__.__globals__.
    module = sys.modules.get(cls.__module__)
    scope: dict[str, Any] = {}
    exec(source, module.__dict__ if module is not None else {}, scope)  # noqa: S102
    init = scope["__quick_init_factory__"](*(_slot(cls, n).__set__ for n in names))
    init.__defaults__ = generated.__defaults__
    init.__kwdefaults__ = generated.__kwdefaults__
    init.__annotations__ = generated.__annotations__
    init.__qualname__ = generated.__qualname__
    init.__module__ = cls.__module__
    init.__doc__ = generated.__doc__
    type.__setattr__(cls, "__init__", init)
    return cls
