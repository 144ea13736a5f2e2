"""What ``toolledger sessions`` and the console's front page show of a store (reads only)."""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from .._liveness import Running, Verdict
from .._shell import SETTLING, STORE_ENV, command_label, command_parts, commands_in
from ..records import ApprovalStatus, Lease, RunStatus, SessionState, Status
from ..stores import DEFAULT_STORE_URL, Store
from .format import when

__all__ = [
    "SETTLED_SINCE",
    "Overview",
    "known_session",
    "lease_text",
    "lineage_of",
    "lineage_sessions",
    "overview",
    "reason_parts",
    "settled_since",
    "stopped_reason",
]


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


SETTLED_SINCE = (
    "settled since: that was so when the run stopped, and nothing in it waits for a person now. "
    "Run the session again to go on (not the commands it names)."
)
"""What follows a stored stop reason that ``settled_since`` finds settled (the command line,
the console)."""


def stopped_reason(
    s: SessionState,
    settled: bool | None,
    *,
    url: str | None = None,
    sessions: Collection[str] = (),
) -> str:
    """Why the session's last run stopped, as stored — followed, when it has been settled since
    (``settled_since``), by a plain word that it is history: its commands were right for that
    moment and the store then (an approve now refused, a call no longer in doubt, a store named
    by the URL that run was given). ``url``: each command for a call in one of ``sessions``
    (``lineage_sessions``) on the store at ``url`` named by what it does (``reason_parts``),
    for a caller that shows them on lines of their own."""
    reason = s.reason or ""
    if url is not None:
        reason = reason_parts(reason, sessions, url)[0]
    return f"{reason} — {SETTLED_SINCE}" if reason and settled else reason


def reason_parts(reason: str, sessions: Collection[str], url: str) -> tuple[str, tuple[str, ...]]:
    """A stop reason as a person reads it: its words, each command in them named by what it
    does (`` `approve` ``, `` `resolve --happened` ``), and the commands themselves, whole, in
    the order named — each to be shown on a line of its own (docs/design.md, rule 21).

    A reason holds data (a call's id, an alert's text from a tool), so a command is taken for
    one only when it is one toolledger prints for it: ``approve``, ``deny`` or ``resolve`` of a
    call in one of ``sessions`` (the session's, and its lineage's: ``lineage_sessions``), on the
    store at ``url`` (named, or the one the command opens without ``--store`` here). Anything
    else stays in the words."""
    bare = os.environ.get(STORE_ENV) or DEFAULT_STORE_URL
    words, commands, at = [], [], 0
    for start, end, argv in commands_in(reason):
        store, verb, _, ids = command_parts(argv)
        if not (
            verb in SETTLING
            and len(ids) == 2
            and ids[0] in sessions
            and (bare if store is None else store) == url
        ):
            continue
        words += [reason[at:start], f"`{command_label(argv)}`"]
        commands.append(reason[start + 1 : end - 1])
        at = end
    words.append(reason[at:])
    return "".join(words), tuple(commands)


def lineage_of(state: SessionState) -> set[str]:
    """``state``'s session and the sessions of its lineage it was branched from."""
    sessions = {state.session_id}
    for b in state.lineage:
        sessions.update(x for x in (b.source, b.root) if x)
    return sessions


def lineage_sessions(store: Store, state: SessionState) -> set[str]:
    """``lineage_of(state)``, and each session a command of ``state``'s stop reason names that
    shares its lineage's first session (``Store.lineage_root``): a sibling branch that makes a
    call for the whole lineage, where the call is settled (``toolledger.engine._claims``).
    Reads the store: call it while it is open."""
    sessions = lineage_of(state)
    root = store.lineage_root(state.session_id) or state.session_id
    for _, _, argv in commands_in(state.reason or ""):
        _, verb, _, ids = command_parts(argv)
        if verb not in SETTLING or len(ids) != 2 or ids[0] in sessions:
            continue
        if (store.lineage_root(ids[0]) or ids[0]) == root:
            sessions.add(ids[0])
    return sessions


def settled_since(store: Store, state: SessionState) -> bool | None:
    """Whether what stopped the session's last run for a person has been settled since, so that
    its stored reason (and the commands in it) describes the store as it was then, not now.
    ``None`` for a session that did not stop for a person (it is neither ``awaiting_approval``
    nor ``needs_attention``): only those two are looked into, so a listing stays cheap.

    Settled means nothing waits for a person any more — no approval request of the session is
    pending, no call of it is started without an outcome — *and* something was decided since the
    run stopped (a request decided, a record settled after the session's last write). The
    second half keeps a stop that never waited on a call (a late outcome the ledger cannot vouch
    for, a record that moved on while the run ran it) from being called settled: its reason is
    still what a person must look at."""
    sid, stopped = state.session_id, state.updated_at
    if state.status is RunStatus.AWAITING_APPROVAL:
        requests = store.approvals(sid)
        if any(a.status is ApprovalStatus.PENDING for a in requests):
            return False
        # A request about running a call in doubt again, denied, leaves that call in doubt:
        # its resolve is what a person does next, not a run.
        if _started_since(store, sid, stopped) is None:
            return False
        return any((a.decided_at or 0.0) > stopped for a in requests)
    if state.status is RunStatus.NEEDS_ATTENTION:
        moved = _started_since(store, sid, stopped)
        return False if moved is None else moved
    return None


def _started_since(store: Store, session_id: str, stopped: float) -> bool | None:
    """``None`` when a call of the session is started without an outcome (in doubt, or in
    progress: nothing is settled); else whether a record was settled after ``stopped``."""
    moved = False
    for record in store.ledger(session_id).records():
        r = record
        if r.status is Status.STARTED and r.copied and r.origin is not None:
            # A branch's copy stands for its lineage's record: it is settled there, and this
            # session takes that outcome at its next run.
            there = store.ledger(r.origin).get(r.tool_use_id)
            if there is not None and (there.tool, there.input_hash) == (r.tool, r.input_hash):
                r = there
        if r.status is Status.STARTED:
            return None
        moved = moved or r.updated_at > stopped
    return moved


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
