"""How the CLI writes a few values for people: status colours, instants, who ran an attempt."""

from __future__ import annotations

from datetime import UTC, datetime

from ..records import EffectRecord

__all__ = ["STATUS_STYLE", "owner", "when"]

STATUS_STYLE = {
    "succeeded": "green",
    "completed": "green",
    "approved": "green",
    "started": "bold red",
    "needs_attention": "bold red",
    "failed": "red",
    "denied": "yellow",
    "awaiting_approval": "yellow",
    "pending": "yellow",
    "running": "cyan",
    "not_happened": "magenta",
    "max_turns": "yellow",
    "ready": "cyan",
    "used": "dim",
}


def when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def owner(r: EffectRecord) -> str:
    """Who ran an attempt, for people: the worker, and its process when known."""
    who = r.worker or "?"
    if r.holder is not None:
        who += f" (pid {r.holder.pid})"
    if r.lease_token is not None:
        who += f", lease #{r.lease_token}"
    return who
