"""The loop's pure functions of a session (``toolledger.agent._state``)."""

from __future__ import annotations

import dataclasses

from toolledger.agent._state import advance
from toolledger.records import Branch, RunStatus, SessionState


def test_advance_keeps_every_field_it_does_not_move() -> None:
    """``advance`` builds the next state field by field: a field added to ``SessionState`` and
    not named there would silently fall back to its default. Every field is set to something
    other than its default, and the result must be what ``dataclasses.replace`` gives."""
    state = SessionState(
        session_id="s",
        status=RunStatus.AWAITING_APPROVAL,
        reason="asked",
        version=7,
        turns=3,
        input_tokens=30,
        output_tokens=9,
        messages=6,
        created_at=1.5,
        updated_at=2.5,
        lineage=(Branch(kind="fork", source="t", turn=1, at=1.0, cut=2, note_seq=None),),
    )
    names = {f.name for f in dataclasses.fields(SessionState)}
    assert all(getattr(state, f.name) != f.default for f in dataclasses.fields(SessionState)), (
        "every field differs from its default"
    )
    moved = advance(
        state,
        9.0,
        status=RunStatus.RUNNING,
        reason=None,
        messages=2,
        turns=1,
        input_tokens=10,
        output_tokens=5,
    )
    expected = dataclasses.replace(
        state,
        status=RunStatus.RUNNING,
        reason=None,
        version=8,
        messages=8,
        turns=4,
        input_tokens=40,
        output_tokens=14,
        updated_at=9.0,
    )
    assert moved == expected
    assert {n for n in names if getattr(moved, n) == getattr(state, n)} == {
        "session_id",
        "created_at",
        "lineage",
    }
