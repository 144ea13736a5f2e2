"""The constructors written out by hand (``toolledger._constructors``) must be the ones their
dataclasses generate: the same parameters, kinds and defaults, the same value in every field,
and the same refusals — for every class that has one."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

import toolledger as tl
from toolledger import _constructors
from toolledger.engine._batch import Env
from toolledger.ops import HoldLease, InsertEffect, PutSession, UpdateEffect
from toolledger.records import EffectRecord, SessionState, StoredMessage, ToolCall
from toolledger.stores.store import Ledger
from toolledger.tools import ToolContext

WRITTEN_OUT = [
    EffectRecord,
    SessionState,
    StoredMessage,
    ToolCall,
    ToolContext,
    Env,
    InsertEffect,
    UpdateEffect,
    PutSession,
    HoldLease,
]


def test_these_and_only_these_classes_have_one() -> None:
    assert set(_constructors.GENERATED) == set(WRITTEN_OUT)


def _ledger() -> Ledger:
    return tl.open_store("memory://").ledger("s")


def _values(cls: type, *, required_only: bool = False) -> dict[str, Any]:
    """An argument for every parameter of ``cls``'s constructor (the required ones only, with
    ``required_only``): each one an object of its own, so one set into another field's slot
    shows; what a constructor reads from needs to be real (``Env``'s ledger)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        has_default = f.default is not dataclasses.MISSING or (
            f.default_factory is not dataclasses.MISSING
        )
        if not f.init or (required_only and has_default):
            continue
        out[f.name] = object()
    if cls is Env:
        out["ledger"] = _ledger()
    return out


def _built(init: Any, cls: type, values: dict[str, Any]) -> Any:
    made = object.__new__(cls)
    init(made, **values)
    return made


def _fields(made: Any) -> dict[str, Any]:
    return {f.name: getattr(made, f.name) for f in dataclasses.fields(made)}


@pytest.mark.parametrize("cls", WRITTEN_OUT, ids=lambda c: c.__name__)
def test_its_signature_is_the_generated_one(cls: type) -> None:
    ours = inspect.signature(cls.__init__)
    generated = inspect.signature(_constructors.GENERATED[cls])
    shape = [(p.name, p.kind, p.default) for p in ours.parameters.values()]
    assert shape == [(p.name, p.kind, p.default) for p in generated.parameters.values()]
    assert (cls.__init__.__name__, cls.__init__.__qualname__) == (
        "__init__",
        f"{cls.__qualname__}.__init__",
    )


@pytest.mark.parametrize("required_only", [False, True], ids=["every", "required"])
@pytest.mark.parametrize("cls", WRITTEN_OUT, ids=lambda c: c.__name__)
def test_every_field_holds_its_own_argument(cls: type, required_only: bool) -> None:
    values = _values(cls, required_only=required_only)
    ours = _fields(cls(**values))
    generated = _built(_constructors.GENERATED[cls], cls, values)
    for name, value in values.items():
        assert ours[name] is value, name
    for f in dataclasses.fields(cls):
        if f.init:  # a default, or the argument: as the generated one sets it
            assert ours[f.name] is getattr(generated, f.name) or (
                ours[f.name] == getattr(generated, f.name) == ()
            ), f.name


def test_a_batch_reads_what_it_keeps_off_its_ledger() -> None:
    """``Env``'s fields that are no arguments (the generated constructor leaves them unset)."""
    ledger = _ledger()
    env = Env(tools=tl.ToolSet([]), ledger=ledger, can_ask=False)
    store = ledger.store
    assert (env.session_id, env.worker, env.url) == ("s", store.worker_id, store.url)
    assert (env.clock, env.now) == (store.clock, store.now)
    assert (env.wait, env.lease_token, env.can_ask) == (0.0, None, False)


@pytest.mark.parametrize("cls", WRITTEN_OUT, ids=lambda c: c.__name__)
def test_it_refuses_what_the_generated_one_refuses(cls: type) -> None:
    values = _values(cls)
    with pytest.raises(TypeError, match="colour"):
        cls(**values, colour="blue")
    first = next(iter(_values(cls, required_only=True)))
    with pytest.raises(TypeError, match=first):
        cls(**{k: v for k, v in values.items() if k != first})
    kw_only = all(
        p.kind is inspect.Parameter.KEYWORD_ONLY
        for p in list(inspect.signature(cls.__init__).parameters.values())[1:]
    )
    if kw_only:
        with pytest.raises(TypeError):
            cls(*values.values())
    else:  # by position, in field order, as the generated one takes them
        by_position = _fields(cls(*values.values()))
        assert all(by_position[name] is value for name, value in values.items())
        with pytest.raises(TypeError):
            cls(*values.values(), object())


@pytest.mark.parametrize("cls", WRITTEN_OUT, ids=lambda c: c.__name__)
def test_it_stays_frozen_and_replace_goes_through_it(cls: type) -> None:
    made = cls(**_values(cls))
    name = dataclasses.fields(cls)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, name, "other")
    other = object()
    moved = dataclasses.replace(made, **{name: other})
    assert getattr(moved, name) is other
    assert getattr(made, name) is not other
