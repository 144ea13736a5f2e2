"""Which part of a long session a reading command shows: the latest turns by default, ``--all``,
or ``--turns A-B``; and the line that says what was left out.

A 5,000-turn session is read whole (one query) but printed in part: rendering every turn is
what made ``show`` slow, and nobody reads 25,000 lines on a screen. JSON output shows the same
window, and says which (``"window"``), so a script asks for ``--all`` knowingly.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["LAST_RECORDS", "LAST_TURNS", "Window", "add_window", "window_of"]

LAST_TURNS = 20
LAST_RECORDS = 50

_RANGE = re.compile(r"(\d*)(-?)(\d*)")


@dataclass(frozen=True, slots=True)
class Window:
    """Items ``first``..``last`` (1-based, inclusive) of ``total``."""

    first: int
    last: int
    total: int
    unit: str

    @property
    def whole(self) -> bool:
        return self.first <= 1 and self.last >= self.total

    def holds(self, n: int) -> bool:
        return self.first <= n <= self.last

    def note(self) -> str:
        """What is shown, and how to see the rest ("" when all is shown)."""
        if self.whole:
            return ""
        if self.first > self.last:
            shown = f"no {self.unit}s (the range is past the {self.total} there are)"
        else:
            shown = f"{self.unit}s {self.first}-{self.last} of {self.total}"
        return f"showing {shown}: --all shows every {self.unit}, --{self.unit}s A-B a range"

    def as_json(self) -> dict[str, Any]:
        return {"unit": self.unit, "first": self.first, "last": self.last, "total": self.total}


def _range(text: str) -> tuple[int | None, int | None]:
    m = _RANGE.fullmatch(text.strip())
    if m is None or not (m[1] or m[3]) or (not m[2] and m[3]):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a range: N, A-B, A- (from A on) or -B (up to B)"
        )
    lo = int(m[1]) if m[1] else None
    hi = int(m[3]) if m[3] else (lo if not m[2] else None)
    if lo == 0 or hi == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the first is 1 (the range is 1-based)")
    if lo is not None and hi is not None and lo > hi:
        raise argparse.ArgumentTypeError(f"{text!r} runs backwards: write {hi}-{lo}")
    return lo, hi


def _count(text: str) -> int:
    """``--last N``: a number of at least 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: show at least 1 (or --all)")
    return n


def add_window(p: argparse.ArgumentParser, unit: str, last: int) -> None:
    """``--all``, ``--last N`` and ``--{unit}s A-B`` for a command that shows a session."""
    group = p.add_mutually_exclusive_group()
    group.add_argument("--all", dest="every", action="store_true", help=f"every {unit}")
    group.add_argument(
        "--last",
        type=_count,
        default=last,
        metavar="N",
        help=f"the latest N {unit}s (default {last})",
    )
    group.add_argument(
        f"--{unit}s",
        dest="span",
        type=_range,
        metavar="A-B",
        help=f"{unit}s A to B (1-based; A- or -B leave one end open)",
    )


def window_of(args: argparse.Namespace, total: int, unit: str) -> Window:
    if getattr(args, "every", False):
        return Window(1, total, total, unit)
    span = getattr(args, "span", None)
    if span is not None:
        lo, hi = span
        return Window(max(1, lo or 1), min(total, hi if hi is not None else total), total, unit)
    last = max(0, int(getattr(args, "last", LAST_TURNS)))
    return Window(max(1, total - last + 1), total, total, unit)
