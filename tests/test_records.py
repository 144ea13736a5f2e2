"""``EffectRecord``'s constructor is written out (``toolledger.records``): it must be the one the
dataclass generates, in signature and in effect, field by field."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

from toolledger import records
from toolledger.records import EffectRecord, Holder, PastAttempt, Status


def _distinct_values() -> dict[str, Any]:
    """A value for every field, each one of its own (no two equal), so a value set into
    another field's slot shows."""
    return {
        "session_id": "s-1",
        "tool_use_id": "toolu_2",
        "tool": "send_email",
        "input_hash": "sha256:3",
        "status": Status.SUCCEEDED,
        "attempt": 5,
        "result": '"r6"',
        "error": "e7",
        "created_at": 8.5,
        "updated_at": 9.5,
        "approved_by": "a10",
        "worker": "w11",
        "holder": Holder(host="h12", pidns="p", pid=12, start=12),
        "lease_token": 13,
        "deadline": 14.5,
        "history": (
            PastAttempt(attempt=15, worker="w", holder=None, at=15.5, deadline=None, settled="x"),
        ),
        "boot_deadline": "b16/1.000",
        "made_in": "m17",
        "origin": "o18",
    }


def test_every_field_is_set_to_its_own_value() -> None:
    values = _distinct_values()
    assert list(values) == [f.name for f in dataclasses.fields(EffectRecord)]
    built = EffectRecord(**values)
    assert {f.name: getattr(built, f.name) for f in dataclasses.fields(EffectRecord)} == values


def test_it_builds_what_the_generated_constructor_builds() -> None:
    generated = object.__new__(EffectRecord)
    records._GENERATED_EFFECT_INIT(generated, **_distinct_values())
    assert EffectRecord(**_distinct_values()) == generated
    required = {
        "session_id": "s",
        "tool_use_id": "t",
        "tool": "x",
        "input_hash": "h",
        "status": Status.STARTED,
        "created_at": 1.0,
        "updated_at": 2.0,
    }
    with_defaults = object.__new__(EffectRecord)
    records._GENERATED_EFFECT_INIT(with_defaults, **required)
    assert EffectRecord(**required) == with_defaults


def test_its_signature_is_the_generated_one() -> None:
    ours = inspect.signature(records._effect_record_init)
    generated = inspect.signature(records._GENERATED_EFFECT_INIT)
    shape = [(p.name, p.kind, p.default) for p in ours.parameters.values()]
    assert shape == [(p.name, p.kind, p.default) for p in generated.parameters.values()]
    assert EffectRecord.__init__ is records._effect_record_init
    assert (EffectRecord.__init__.__name__, EffectRecord.__init__.__qualname__) == (
        "__init__",
        "EffectRecord.__init__",
    )


def test_it_refuses_what_the_generated_one_refuses() -> None:
    with pytest.raises(TypeError, match="tool_use_id"):
        EffectRecord(  # type: ignore[call-arg]
            session_id="s",
            tool="x",
            input_hash="h",
            status=Status.STARTED,
            created_at=1.0,
            updated_at=1.0,
        )
    with pytest.raises(TypeError, match="colour"):
        EffectRecord(**{**_distinct_values(), "colour": "blue"})
    with pytest.raises(TypeError):
        EffectRecord("s", "t")  # type: ignore[misc]


def test_it_stays_frozen_and_replace_goes_through_it() -> None:
    built = EffectRecord(**_distinct_values())
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.tool = "other"  # type: ignore[misc]
    moved = dataclasses.replace(built, status=Status.FAILED, attempt=6)
    assert (moved.status, moved.attempt, moved.tool) == (Status.FAILED, 6, "send_email")
    assert built.status is Status.SUCCEEDED


def test_a_holders_text_is_its_own_whichever_was_made_last() -> None:
    """``Holder.text`` keeps the last holder's text (this process's, on every intent)."""
    v2 = Holder(host="b", pidns="4026531836", pid=7, start=99, boot="b", timens="")
    named = Holder(host="h", pidns="4026531836", pid=7, start=99, boot="b", timens="t")
    old = Holder(host="h", pidns="p", pid=8, start=1)
    unknown = Holder.unknown(9)
    expected = {
        id(v2): "v2;b;;/4026531836/7/99",
        id(named): "v2;b;t;h/4026531836/7/99",
        id(old): "h/p/8/1",
        id(unknown): "//9/0",
    }
    for holder in [v2, named, v2, old, unknown, unknown, named, old]:
        assert holder.text() == expected[id(holder)]
        assert Holder.parse(holder.text()) == holder
