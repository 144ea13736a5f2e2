"""``quick_init``: the same class as ``dataclass`` wrote it, built faster.

Each case defines a class twice, once as ``dataclass`` leaves it and once with ``quick_init``,
and compares everything a caller can see: the signature, the instance built from the same
arguments (fields, equality, hash, repr), that it stays frozen, ``__post_init__``, and the
``TypeError`` a wrong call gets, word for word.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from dataclasses import KW_ONLY, FrozenInstanceError, InitVar, dataclass, field
from typing import Any

import pytest

from toolledger._frozen import quick_init
from toolledger.ops import UpdateEffect
from toolledger.records import EffectRecord, PastAttempt, Status, ToolCall
from toolledger.tools import ToolContext


def _twins(define: Callable[[], type]) -> tuple[type, type]:
    return define(), quick_init(define())


def _positional() -> type:
    @dataclass(frozen=True, slots=True)
    class Op:
        a: int
        b: str = "b"
        c: tuple[int, ...] = ()

    return Op


def _keywords() -> type:
    @dataclass(frozen=True, slots=True, kw_only=True)
    class Record:
        a: int
        b: str | None = None
        c: float
        d: float | None = field(default=None, compare=False)

    return Record


def _mixed() -> type:
    @dataclass(frozen=True, slots=True)
    class Mixed:
        a: int
        b: int = 2
        _: KW_ONLY
        c: str
        d: str = "d"

    return Mixed


_POSTED: list[Any] = []


def _post_init() -> type:
    @dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            _POSTED.append(self.a)
            if self.a < 0:
                raise ValueError("a must not be negative")

    return Checked


CASES: list[tuple[Callable[[], type], list[tuple[tuple[Any, ...], dict[str, Any]]]]] = [
    (_positional, [((1,), {}), ((1, "x"), {}), ((1,), {"c": (2,)}), ((), {"a": 3, "b": "y"})]),
    (_keywords, [((), {"a": 1, "c": 2.0}), ((), {"a": 1, "b": "x", "c": 2.0, "d": 9.0})]),
    (_mixed, [((1,), {"c": "c"}), ((1, 5), {"c": "c", "d": "e"})]),
    (_post_init, [((1,), {}), ((5,), {})]),
]

WRONG: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((), {}),
    ((1, 2, 3, 4, 5), {}),
    ((), {"nope": 1}),
    ((1,), {"a": 1}),
]


@pytest.mark.parametrize(("define", "calls"), CASES, ids=[c[0].__name__ for c in CASES])
def test_a_quick_class_is_the_class_dataclass_wrote(
    define: Callable[[], type], calls: list[tuple[tuple[Any, ...], dict[str, Any]]]
) -> None:
    plain, quick = _twins(define)
    assert inspect.signature(quick) == inspect.signature(plain)
    assert quick.__init__.__qualname__ == plain.__init__.__qualname__  # type: ignore[misc]
    for args, kwargs in calls:
        _POSTED.clear()
        a, b = plain(*args, **kwargs), quick(*args, **kwargs)
        posted = list(_POSTED)
        assert dataclasses.astuple(a) == dataclasses.astuple(b)
        assert repr(a) == repr(b)
        assert hash(a) == hash(b)
        assert b == quick(*args, **kwargs)
        assert posted == ([posted[0], posted[0]] if posted else [])  # __post_init__ ran on both
        first = dataclasses.fields(b)[0].name
        with pytest.raises(FrozenInstanceError):
            setattr(b, first, 0)
        with pytest.raises(FrozenInstanceError):
            delattr(b, first)
    for args, kwargs in WRONG:
        with pytest.raises(TypeError) as expected:
            plain(*args, **kwargs)
        with pytest.raises(TypeError) as got:
            quick(*args, **kwargs)
        assert str(got.value) == str(expected.value)


def test_post_init_errors_are_raised_as_before() -> None:
    plain, quick = _twins(_post_init)
    for cls in (plain, quick):
        with pytest.raises(ValueError, match="must not be negative"):
            cls(-1)


def _not_frozen() -> type:
    @dataclass(slots=True)
    class Loose:
        a: int

    return Loose


def _no_slots() -> type:
    @dataclass(frozen=True)
    class Roomy:
        a: int

    return Roomy


def _factory() -> type:
    @dataclass(frozen=True, slots=True)
    class Made:
        a: list[int] = field(default_factory=list)

    return Made


def _not_an_argument() -> type:
    @dataclass(frozen=True, slots=True)
    class Derived:
        a: int
        b: int = field(init=False, default=0)

    return Derived


def _init_var() -> type:
    @dataclass(frozen=True, slots=True)
    class Given:
        a: int
        scale: InitVar[int] = 1

        def __post_init__(self, scale: int) -> None:
            object.__setattr__(self, "a", self.a * scale)

    return Given


@pytest.mark.parametrize(
    ("define", "why"),
    [
        (_not_frozen, "not frozen"),
        (_no_slots, "no slots"),
        (_factory, "default factory"),
        (_not_an_argument, "not an argument"),
        (_init_var, "InitVars"),
    ],
)
def test_what_it_cannot_copy_exactly_is_refused_when_the_class_is_defined(
    define: Callable[[], type], why: str
) -> None:
    with pytest.raises(TypeError, match=why):
        quick_init(define())


def test_the_records_a_call_writes_are_built_by_it_and_unchanged() -> None:
    record = EffectRecord(
        session_id="s",
        tool_use_id="toolu_1",
        tool="t",
        input_hash="h",
        status=Status.STARTED,
        created_at=1.0,
        updated_at=2.0,
    )
    assert EffectRecord.__init__.__code__.co_filename == "<string>"
    assert record.attempt == 0 and record.history == () and record.origin is None
    assert dataclasses.replace(record, attempt=2).attempt == 2
    with pytest.raises(FrozenInstanceError):
        record.attempt = 3  # type: ignore[misc]
    op = UpdateEffect(record, Status.STARTED, 0)
    assert (op.expect_at, op.guard) == (None, False)


@pytest.mark.parametrize("cls", [EffectRecord, ToolCall, PastAttempt, UpdateEffect, ToolContext])
def test_its_string_annotations_resolve_as_they_did(cls: type) -> None:
    """``typing.get_type_hints`` and ``inspect.signature(eval_str=True)`` read ``__init__``'s
    annotations in its globals: the class's module's, as for the ``__init__`` dataclass wrote."""
    hints = typing.get_type_hints(cls.__init__)  # type: ignore[misc]
    assert set(hints) >= {f.name for f in dataclasses.fields(cls)}
    inspect.signature(cls, eval_str=True)


def test_an_init_var_without_post_init_is_refused() -> None:
    @dataclass(frozen=True, slots=True)
    class Scaled:
        a: int = 0
        scale: InitVar[int] = 5

    with pytest.raises(TypeError, match="InitVars"):
        quick_init(Scaled)


def test_field_names_like_its_own_names_are_plain_fields() -> None:
    @dataclass(frozen=True, slots=True)
    class Named:
        x: int
        _set_x: object = None
        __post_init__x: int = 0

    assert quick_init(Named)(1).x == 1

    @dataclass(frozen=True, slots=True)
    class Itself:
        self: int
        other: int = 2

    plain = Itself(1)
    assert dataclasses.astuple(quick_init(Itself)(1)) == dataclasses.astuple(plain) == (1, 2)


def test_a_subclass_sets_the_fields_it_inherits() -> None:
    @dataclass(frozen=True, slots=True)
    class Base:
        a: int

    @dataclass(frozen=True, slots=True)
    class Sub(Base):
        b: int = 1

    plain = Sub(5)
    quick = quick_init(Sub)(5, 2)
    assert (plain.a, plain.b, quick.a, quick.b) == (5, 1, 5, 2)
