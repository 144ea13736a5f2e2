"""A branch in words: what a rewind did, whether the model was told, and the style of each
state of a call a branch left behind."""

from __future__ import annotations

from .._lineage import Branch

__all__ = ["STATE_STYLE", "rewound", "told"]

STATE_STYLE = {"succeeded": "green", "in_doubt": "bold red", "in_progress": "bold yellow"}


def rewound(b: Branch) -> str:
    """What a rewind did, in words (a fork's words name its source: each display links it or
    quotes it)."""
    return f"rewound to turn {b.turn}: later turns kept as abandoned branch {b.branch}"


def told(b: Branch) -> str:
    """Whether the model was told of what the branch left behind."""
    if not b.effects:
        return "nothing left behind"
    if b.note_seq is not None:
        return "told to the model"
    return (
        "told to the model on a branch a later rewind abandoned"
        if b.told
        else ("not told to the model")
    )
