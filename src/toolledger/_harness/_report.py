"""How the harnesses print their reports: a verdict line, then aligned rows, then the violations."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["summary_lines", "violation_lines"]


def summary_lines(harness: str, ok: bool, rows: Sequence[tuple[str, str]]) -> list[str]:
    """``toolledger <harness>: OK`` (or ``VIOLATIONS FOUND``), then each row, its names aligned."""
    width = max(len(k) for k, _ in rows)
    lines = [f"toolledger {harness}: {'OK' if ok else 'VIOLATIONS FOUND'}"]
    lines += [f"  {k.ljust(width)}  {v}" for k, v in rows]
    return lines


def violation_lines(violations: Sequence[str], shown: int = 50) -> list[str]:
    """The first ``shown`` violations, and how many more there are."""
    lines = [f"  ! {v}" for v in violations[:shown]]
    if len(violations) > shown:
        lines.append(f"  ! … and {len(violations) - shown} more")
    return lines
