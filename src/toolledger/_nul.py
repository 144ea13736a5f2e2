"""A NUL in text a store keeps as text, written ``\\x00`` on every backend.

PostgreSQL's ``text`` cannot hold a NUL (U+0000): a write holding one is refused whole. The
free text of a record comes from outside — an exception's or a model API error's message, an
approver's name or reason, a person's ``by=`` — and a NUL in it would fail the write on
PostgreSQL only: a session's failure never recorded (left ``running``), a person's decision or
resolution refused. ``Store.apply`` passes every batch through ``nul_free_ops`` before any
backend sees it, so every backend keeps the same text. JSON columns (results, inputs,
transcripts, histories, lineages) need nothing: JSON writes a NUL ``\\u0000``.

Text that is compared after it is read back — ids, a tool's name, a worker's id — is never
rewritten here: a NUL in it must be refused where it is given. Ids are
(``check_session_id``, the adapters' ``check_call_id``); a tool's name
(``tools.checked_name``) and ``open_store``'s ``worker_id`` are not yet.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, get_args

from .codec import nul_free
from .ops import (
    AbandonMessages,
    AppendMessages,
    DropLease,
    DropSession,
    HoldLease,
    InsertEffect,
    Op,
    PutApproval,
    PutSession,
    TakeLease,
    UpdateEffect,
)

__all__ = ["nul_free", "nul_free_ops"]

NUL = "\x00"


def _effect(op: InsertEffect | UpdateEffect) -> Op:
    r = op.record
    error, by = r.error, r.approved_by
    if (error is None or NUL not in error) and (by is None or NUL not in by):
        return op
    fixed = replace(
        r,
        error=None if error is None else nul_free(error),
        approved_by=None if by is None else nul_free(by),
    )
    return replace(op, record=fixed)


def _session(op: PutSession) -> Op:
    reason = op.state.reason
    if reason is None or NUL not in reason:
        return op
    return replace(op, state=replace(op.state, reason=nul_free(reason)))


def _approval(op: PutApproval) -> Op:
    a = op.record
    if NUL not in a.reason and (a.decided_by is None or NUL not in a.decided_by):
        return op
    by = None if a.decided_by is None else nul_free(a.decided_by)
    return replace(op, record=replace(a, reason=nul_free(a.reason), decided_by=by))


# Each op's rewrite, by its exact type (one lookup an op: this runs for every write); ``None``:
# it keeps no free text as text (JSON, seqs, leases). Every member of ``Op`` is listed: a new
# op must be placed here, or the import fails.
_FIXES: dict[type, Callable[[Any], Op] | None] = {
    InsertEffect: _effect,
    UpdateEffect: _effect,
    PutSession: _session,
    PutApproval: _approval,
    AppendMessages: None,
    AbandonMessages: None,
    TakeLease: None,
    HoldLease: None,
    DropLease: None,
    DropSession: None,
}
if set(_FIXES) != set(get_args(Op)):  # pragma: no cover - a new op not placed above
    raise TypeError(f"toolledger._nul places {sorted(map(str, _FIXES))}, not every Op")


def nul_free_ops(ops: Sequence[Op]) -> list[Op]:
    """``ops`` with every NUL of their free text written ``\\x00``: an effect's ``error`` and
    ``approved_by``, a session's ``reason``, an approval's ``reason`` and ``decided_by``. An op
    without one is kept as it is. This runs for every write: an op costs a lookup by its type
    and, if it may keep free text, a look at that text (about 0.2 µs)."""
    out = list(ops)
    fixes = _FIXES
    for i, op in enumerate(out):
        fix = fixes[type(op)]
        if fix is not None:
            out[i] = fix(op)
    return out
