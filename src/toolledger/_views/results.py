"""The result a person gives for a call that happened (``toolledger resolve --result``, the
console's form)."""

from __future__ import annotations

import json
from typing import Any

from ..codec import MAX_NESTING, nesting

__all__ = ["parse_result"]


def parse_result(text: str) -> Any:
    """The result a person gives for a call that happened: JSON the model can be told (no
    ``NaN``, not nested too deep). Raises ``ValueError`` saying what is wrong."""
    try:
        result = json.loads(text, parse_constant=_not_json)
    except RecursionError:
        raise ValueError("nested too deep") from None
    if nesting(result) > MAX_NESTING:
        raise ValueError(f"nested more than {MAX_NESTING} levels deep")
    return result


def _not_json(word: str) -> Any:
    raise ValueError(f"{word} is not JSON (Python writes it; JSON has no such number)")
