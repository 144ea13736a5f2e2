"""Where a session's transcript came from: the forks and rewinds that made it
(``SessionState.lineage``), and what the world saw on the paths they left.

Going back never un-happens anything (docs/design.md, rule 15). A fork or a rewind keeps, with the
session, every call made after its point that took effect or may have — succeeded, in doubt, or
still in progress when the branch was made — so that it can be listed (``Run.effects_after_fork``,
``toolledger history``, ``toolledger show``) and told to the model once, in a note placed in the
transcript right after the point (``toolledger.branches._branching``).

A lineage is stored as one JSON text beside the session's state; ``lineage_json`` and
``lineage_from_json`` are its two directions. An empty lineage is stored as nothing (``NULL``),
which is also what every session written before branches existed holds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = [
    "Branch",
    "BranchKind",
    "ForkedEffect",
    "effects_of",
    "lineage_from_json",
    "lineage_json",
    "made_by_fork",
]


class BranchKind(StrEnum):
    FORK = "fork"
    """A new session made of another one's transcript through a turn."""
    REWIND = "rewind"
    """The same session taken back to a turn; the later turns kept as an abandoned branch."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ForkedEffect:
    """A call made after a fork or rewind point that took effect, or may have.

    ``state`` is what its ledger record said when the branch was made: ``succeeded``,
    ``in_doubt`` (started, its attempt over with no outcome) or ``in_progress`` (started, its
    attempt possibly still running). ``session_id`` is the session whose id keys the call
    (``EffectRecord.key_session``): where it was made — the parent of a fork, or a session
    further up — or its lineage's first session, whose key a key-forwarding call made first on
    a branch forwards. ``result`` is the recorded result's JSON text, whole
    (``None``: none recorded)."""

    session_id: str
    tool_use_id: str
    tool: str
    input: Any
    state: str
    result: str | None
    at: float

    @property
    def key(self) -> tuple[str, str]:
        return (self.session_id, self.tool_use_id)

    def as_json(self) -> dict[str, Any]:
        return {
            "session": self.session_id,
            "id": self.tool_use_id,
            "tool": self.tool,
            "input": self.input,
            "state": self.state,
            "result": self.result,
            "at": self.at,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ForkedEffect:
        return cls(
            session_id=str(raw["session"]),
            tool_use_id=str(raw["id"]),
            tool=str(raw["tool"]),
            input=raw["input"],
            state=str(raw["state"]),
            result=None if raw["result"] is None else str(raw["result"]),
            at=float(raw["at"]),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Branch:
    """One fork or rewind in a session's making.

    ``source`` is the session branched from (a rewind's is the session itself), ``turn`` the
    turn kept last, ``cut`` the first ``seq`` not kept (every message before it is the source's,
    unchanged). ``note_seq`` is the seq of the note telling the model of ``effects`` (``None``:
    not told — ``effects_after_fork="ignore"``, nothing to tell, or the note was itself on a
    later rewind's abandoned branch). A rewind's abandoned messages are branch number ``branch``
    of the session (``Store.abandoned``), and ``abandoned_calls`` are the call ids they hold (their
    records stay in the session's ledger). ``by`` names who made it. ``told``: a note was
    written — it stays true when a later rewind abandons the note (``note_seq`` is then
    ``None``); lineages written before it was kept read it from ``note_seq``. ``root`` (a
    fork's): the first session of the lineage, whose ledger claims every call a branch makes
    (``toolledger.engine._claims``); ``None`` in forks written before it was kept."""

    kind: BranchKind
    source: str
    turn: int
    at: float
    cut: int
    note_seq: int | None
    effects: tuple[ForkedEffect, ...] = ()
    branch: int | None = None
    abandoned_calls: tuple[str, ...] = ()
    by: str | None = None
    told: bool = False
    root: str | None = None

    def __post_init__(self) -> None:
        if self.note_seq is not None and not self.told:
            object.__setattr__(self, "told", True)  # a note in the transcript was told

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind.value,
            "source": self.source,
            "turn": self.turn,
            "at": self.at,
            "cut": self.cut,
            "note_seq": self.note_seq,
            "effects": [e.as_json() for e in self.effects],
        }
        if self.branch is not None:
            out["branch"] = self.branch
            out["abandoned_calls"] = list(self.abandoned_calls)
        if self.by is not None:
            out["by"] = self.by
        if self.told:
            out["told"] = True
        if self.root is not None:
            out["root"] = self.root
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Branch:
        note = raw["note_seq"]
        branch = raw.get("branch")
        return cls(
            kind=BranchKind(raw["kind"]),
            source=str(raw["source"]),
            turn=int(raw["turn"]),
            at=float(raw["at"]),
            cut=int(raw["cut"]),
            note_seq=None if note is None else int(note),
            effects=tuple(ForkedEffect.from_json(e) for e in raw["effects"]),
            branch=None if branch is None else int(branch),
            abandoned_calls=tuple(str(i) for i in raw.get("abandoned_calls", ())),
            by=raw.get("by"),
            told=bool(raw.get("told", False)),
            root=None if raw.get("root") is None else str(raw["root"]),
        )


def lineage_json(lineage: tuple[Branch, ...]) -> str | None:
    """The stored text of a lineage; ``None`` for an empty one."""
    if not lineage:
        return None
    return json.dumps([b.as_json() for b in lineage], ensure_ascii=False, separators=(",", ":"))


def lineage_from_json(text: str | None) -> tuple[Branch, ...]:
    """A lineage read back. Raises ``ValueError`` (or ``KeyError``/``TypeError``) for damaged
    text: the caller reports the store as corrupt."""
    if text is None or text == "":
        return ()
    raw = json.loads(text)
    if not isinstance(raw, list):
        raise ValueError("a session's lineage must be a list")
    return tuple(Branch.from_json(b) for b in raw)


def made_by_fork(lineage: tuple[Branch, ...]) -> Branch | None:
    """The fork that made a session (the last fork of its lineage: a fork's own entry comes
    after every one it inherits, and a rewind adds none), or ``None``: no fork made it."""
    for b in reversed(lineage):
        if b.kind is BranchKind.FORK:
            return b
    return None


def effects_of(lineage: tuple[Branch, ...]) -> tuple[ForkedEffect, ...]:
    """Every effect a lineage lists, each once, oldest branch first."""
    seen: set[tuple[str, str]] = set()
    out: list[ForkedEffect] = []
    for b in lineage:
        for e in b.effects:
            if e.key not in seen:
                seen.add(e.key)
                out.append(e)
    return tuple(out)
