"""What ``toolledger sessions`` and the console's front page show of a store (reads only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._liveness import Running, Verdict
from ..records import Lease, SessionState
from ..stores import Store
from .format import when

__all__ = ["Overview", "known_session", "lease_text", "overview"]


@dataclass(frozen=True, slots=True)
class Overview:
    """What ``sessions`` shows of a store: agent sessions, ledgers used on their own, who holds
    each held session (owner, token, until, why, and a line for people), and the kinds of each
    session's started calls (``in progress`` / ``in doubt``)."""

    states: list[SessionState]
    ledger_only: list[str]
    held: dict[str, dict[str, Any]]
    calls: dict[str, list[str]]

    def started_summary(self) -> dict[str, str]:
        """Each session's started calls counted by kind: ``1 in doubt, 2 in progress``."""
        return {
            sid: ", ".join(f"{kinds.count(k)} {k}" for k in sorted(set(kinds)))
            for sid, kinds in self.calls.items()
        }


def overview(store: Store) -> Overview:
    """The sessions of ``store``, their leases and their started calls (reads only)."""
    states = store.session_states()
    with_state = {s.session_id for s in states}
    ledger_only = [sid for sid in store.sessions() if sid not in with_state]
    held: dict[str, dict[str, Any]] = {}
    for s in states:
        lease = store.lease(s.session_id)
        state = store.lease_state(lease)
        if lease is not None and isinstance(state, Running):
            held[s.session_id] = {
                "owner": lease.owner,
                "token": lease.token,
                "until": state.until,
                "why": state.why,
                "text": lease_text(lease, state),
            }
    calls: dict[str, list[str]] = {}
    for record, verdict in store.started():
        kind = "in progress" if isinstance(verdict, Running) else "in doubt"
        calls.setdefault(record.session_id, []).append(kind)
    return Overview(states, ledger_only, held, calls)


def known_session(store: Store, session_id: str) -> bool:
    """Whether ``session_id`` is in ``store`` (a state or a ledger); an unknown one is an error
    for every command that names a session."""
    return store.holds(session_id)


def lease_text(lease: Lease | None, verdict: Verdict | None) -> str:
    """Who holds a session, for people: the owner and until when (or that nobody does)."""
    if lease is None or verdict is None or not isinstance(verdict, Running):
        return ""
    until = f" until {when(verdict.until)}" if verdict.until is not None else " (alive)"
    return f"{lease.owner}{until}"
