"""``verify(store)``: is the store sound, and does every transcript agree with its ledger?

Checks, per store: the engine's own integrity check (SQLite ``PRAGMA integrity_check``; every JSON
file parsed and its digests checked). Per agent session: the transcript has as many messages as
its state says; it obeys its API's call/result pairing rule — the Messages API's
tool_use/tool_result, or OpenAI's tool_calls/tool messages and function_call/function_call_output,
picked by the transcript's shape (a pending last turn is allowed while the session is
unfinished); every result that reports success has a ``succeeded`` record in the ledger; every
ledger record belongs to a call of the transcript. Started calls are reported as warnings — in
progress, or in doubt: legitimate, and the latter need a person —, and as errors in a completed
session. A record whose replaced attempt reported success afterwards (both may have taken effect)
is an error; an approver's or a forced re-run of an in-doubt call is a warning.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ._invisible import shown_id
from ._liveness import Running
from ._shell import command
from .adapters import transcript_reader
from .errors import ToolLedgerError
from .records import EffectRecord, Lease, RunStatus, SessionState, Status
from .stores import DEFAULT_STORE_URL
from .stores.store import Store

__all__ = ["Problem", "Severity", "verify"]


class Severity(StrEnum):
    """How bad a ``Problem`` is: an ``ERROR`` needs a person; a ``WARNING`` is worth a look."""

    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing ``verify`` found: in a session (``session_id``), or in the store (``None``)."""

    severity: Severity
    session_id: str | None
    message: str


def verify(store: Store) -> list[Problem]:
    """Every problem found; an empty list means the store is sound."""
    problems: list[Problem] = []
    problems += [Problem(Severity.ERROR, None, p) for p in store.integrity() or []]
    try:
        session_ids = store.sessions()
    except ToolLedgerError as exc:
        return [*problems, Problem(Severity.ERROR, None, _finding(exc))]
    for sid in session_ids:
        try:
            problems += _session(store, sid)
        except ToolLedgerError as exc:
            problems.append(Problem(Severity.ERROR, sid, _finding(exc)))
    return problems


def _finding(exc: ToolLedgerError) -> str:
    """An error met while verifying, as verify's finding: without the advice to run verify
    that the other commands give with it."""
    return str(exc).replace(_RUN_VERIFY, ".")


_RUN_VERIFY = ", or run `toolledger verify` to see what is readable."


def _session(store: Store, sid: str) -> list[Problem]:
    out: list[Problem] = []
    records = store.ledger(sid).records()
    state = store.session(sid)
    lease = store.lease(sid) if any(r.in_doubt for r in records) else None
    for r in records:
        out += _attempts(store, sid, r, lease)
    if state is None:
        return out  # a ledger used through run_tool_uses alone: no transcript to compare
    messages = store.messages(sid)
    if len(messages) != state.messages or [m.seq for m in messages] != list(range(len(messages))):
        out.append(
            Problem(
                Severity.ERROR,
                sid,
                f"the state counts {state.messages} messages, the transcript holds {len(messages)}",
            )
        )
    reader = transcript_reader(messages)
    last_calls = [c.tool_use_id for c in reader.tool_calls(messages[-1])] if messages else []
    pending = last_calls if messages and messages[-1].role == "assistant" else []
    pairing = reader.transcript_errors(messages)  # a pending last turn allowed
    out += [Problem(Severity.ERROR, sid, f"transcript: {p}") for p in pairing]
    if pending and state.status is RunStatus.COMPLETED:
        out.append(
            Problem(
                Severity.ERROR,
                sid,
                "completed, but its last turn's calls have no results: "
                + ", ".join(map(shown_id, pending)),
            )
        )
    by_id = {r.tool_use_id: r for r in records}
    called: set[str] = set()
    for m in messages:
        if m.role == "assistant":
            called.update(c.tool_use_id for c in reader.tool_calls(m))
            continue
        # The ids of the results this message reports as succeeded.
        for tid in (tid for tid, _, is_error in reader.read_message(m).results if not is_error):
            record = by_id.get(tid)
            if record is None or record.status is not Status.SUCCEEDED:
                found = "no record" if record is None else f"a {record.status.value} record"
                out.append(
                    Problem(
                        Severity.ERROR,
                        sid,
                        f"the transcript reports {shown_id(tid)} succeeded but the "
                        f"ledger has {found}: an effect the ledger cannot vouch for",
                    )
                )
    if state.status is RunStatus.COMPLETED:
        for r in records:
            # A copy of its lineage's call stands for the record it was copied from, which
            # settles it, and is checked there.
            if (
                r.status is Status.STARTED
                and r.tool_use_id in called
                and not store.listed_elsewhere(r)
            ):
                out.append(
                    Problem(
                        Severity.ERROR,
                        sid,
                        f"the session is completed but {r.tool!r} "
                        f"({shown_id(r.tool_use_id)}) is still started (attempt {r.attempt} "
                        f"by {_worker(r)}): its transcript has an answer the ledger does not "
                        "back. Check the world, then resolve it.",
                    )
                )
    out += _branches(store, sid, state)
    for tid in sorted(set(by_id) - called - state.abandoned_calls()):
        if by_id[tid].copied:
            continue  # a call its lineage made elsewhere, copied by a fork: accounted for there
        out.append(
            Problem(
                Severity.ERROR,
                sid,
                f"ledger record {shown_id(tid)} ({shown_id(by_id[tid].tool)}) matches no tool_use "
                "in the transcript",
            )
        )
    return out


def _branches(store: Store, sid: str, state: SessionState) -> list[Problem]:
    """A rewound session's abandoned branches are where its lineage says, holding the calls it
    says: their records stay in its ledger, and only this accounts for them."""
    own = [b for b in state.lineage if b.branch is not None and b.source == sid]
    if not own:
        return []
    stored = store.abandoned(sid)
    out: list[Problem] = []
    for b in own:
        messages = stored.get(b.branch or 0)
        if messages is None:
            out.append(
                Problem(
                    Severity.ERROR,
                    sid,
                    f"abandoned branch {b.branch} (rewind to turn {b.turn}) is missing",
                )
            )
            continue
        reader = transcript_reader(messages)
        held = {i for m in messages for i in reader.call_ids(m)}
        missing = sorted(set(b.abandoned_calls) - held)
        if missing:
            out.append(
                Problem(
                    Severity.ERROR,
                    sid,
                    f"abandoned branch {b.branch} does not hold the calls its rewind listed: "
                    + ", ".join(map(shown_id, missing)),
                )
            )
    return out


def _worker(r: EffectRecord) -> str:
    """Who wrote ``r``'s attempt, as an id is shown."""
    return shown_id(r.worker) if r.worker else "an unknown worker"


def _attempts(store: Store, sid: str, r: EffectRecord, lease: Lease | None) -> list[Problem]:
    """What a record's attempts say: one still running or in doubt, two that both took effect."""
    out: list[Problem] = []
    call = f"{r.tool!r} ({shown_id(r.tool_use_id)})"

    def settle(how: str) -> str:
        return command(
            "resolve",
            sid,
            r.tool_use_id,
            options=[how],
            url=store.url,
            default_url=DEFAULT_STORE_URL,
        )

    verdict = None
    if r.status is Status.STARTED and not store.listed_elsewhere(r):
        # Judged over, it is read again first: what it is now is what is reported.
        r, verdict = store.current(r, lease)
    if verdict is not None:
        who = f"attempt {r.attempt} by {_worker(r)}"
        if isinstance(verdict, Running):
            out.append(
                Problem(Severity.WARNING, sid, f"{call} is in progress: {who} ({verdict.why})")
            )
        else:
            out.append(
                Problem(
                    Severity.WARNING,
                    sid,
                    f"{call} is in doubt since {who} ({verdict.why}): resolve it with "
                    f"`{settle('--happened')}` if it took effect, or "
                    f"`{settle('--not-happened')}` if it did not",
                )
            )
    for past in r.history:
        if past.took_effect_late:
            out.append(
                Problem(
                    Severity.ERROR,
                    sid,
                    f"{call}: attempt {past.attempt} by {past.worker or 'an unknown worker'} "
                    f"reported success after it was replaced ({past.settled}); the current "
                    f"record is {r.status.value} (attempt {r.attempt}). Both may have taken "
                    "effect: check the world.",
                )
            )
        elif past.settled.startswith(("an approver", "forced")) or "forced while" in past.settled:
            out.append(
                Problem(
                    Severity.WARNING,
                    sid,
                    f"{call}: attempt {past.attempt} may have taken effect before attempt "
                    f"{past.attempt + 1} ran ({past.settled})",
                )
            )
    return out
