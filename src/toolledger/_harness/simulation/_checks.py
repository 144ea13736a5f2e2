"""What is checked once a simulated run is over, against the world (the checks made during the
run — nothing settled while its attempt can still take effect, no effect twice, every
checkpoint fenced, no broken transcript sent — live in the engine, at the instant they apply)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from ..._verify import Severity, verify
from ...adapters.anthropic import merged, pairing_errors, read_tool_uses
from ...records import RunStatus, Status

if TYPE_CHECKING:
    from ._engine import Simulation
    from ._world import Effect

__all__ = ["final_checks"]


def final_checks(sim: Simulation) -> None:
    """Every session ended, every call answered exactly once, every effect recorded or alerted,
    an approval used at most once, and nothing verify calls an error that the run did not
    excuse."""
    backend = sim.backend
    alerted = {(sid, tid) for _, sid, tid in sim.alerts}
    for sid in sim.scripts:
        state = backend.read_session(sid)
        if state is None or state.status is not RunStatus.COMPLETED:
            status = state.status.value if state else "never started"
            sim.violation(f"{sid}: ended {status} ({state.reason if state else ''})")
            continue
        messages = backend.read_messages(sid)
        problems = pairing_errors(merged(messages))
        if problems:
            sim.violation(f"{sid}: transcript breaks the pairing rule: {problems}")
        uses = [c for m in messages if m.role == "assistant" for c in read_tool_uses(m.content)]
        answered: Counter[str] = Counter(
            b.get("tool_use_id")
            for m in messages
            if m.role == "user" and isinstance(m.content, list)
            for b in m.content
            if b.get("type") == "tool_result"
        )
        for call in uses:
            if answered[call.tool_use_id] != 1:
                sim.violation(
                    f"{sid}: {call.tool_use_id} answered {answered[call.tool_use_id]} times"
                )
    records = {
        (sid, r.tool_use_id): r for sid in sim.scripts for r in backend.read_effects(sid).values()
    }
    failed_answers = {
        (sid, b.get("tool_use_id")): bool(b.get("is_error"))
        for sid in sim.scripts
        for m in backend.read_messages(sid)
        if m.role == "user" and isinstance(m.content, list)
        for b in m.content
        if b.get("type") == "tool_result"
    }
    for effect in sim.world.effects:
        sid = effect.title.split("/")[0]
        # A branch that replayed its lineage's call records it in its own ledger.
        record = records.get((sim.made_in.get(id(effect), sid), effect.tool_use_id))
        kept = record is not None and (
            (record.status is Status.SUCCEEDED and record.attempt in (effect.attempt, 0))
            or any(
                past.attempt == effect.attempt and past.late == "succeeded"
                for past in record.history
            )
            or (record.status is Status.SUCCEEDED and bool(record.error))  # settled by evidence
        )
        # The record says what was overridden: a person's --force on the call.
        forced = sim.forced_on(sid, [effect])
        # Rule 14's limit twice over: sent past its deadline by a process that then died before
        # it could say so. Nobody can know of it; it is counted, not excused silently.
        unknowable = effect.past_deadline and sim.crashed(effect.process)
        # A safe call writes no intent (docs/concepts/ledger.md): its outcome lost with its
        # process, or with a commit the store refused, is recorded by its re-run — unless that
        # re-run failed on its own (its deadline passed) and the call was answered as failed.
        # Counted, not excused silently; a success answered with no record is still caught.
        where = sim.made_in.get(id(effect), sid)
        lost_safe = (
            effect.kind in ("idempotent", "keyed")
            and record is None
            and failed_answers.get((where, effect.tool_use_id), False)
        )
        if unknowable and not kept:
            sim.stats["late_effects_lost_with_their_process"] += 1
        elif lost_safe and not kept:
            sim.stats["safe_effects_lost_rerun_failed"] += 1
        elif not kept and not forced and (sid, effect.tool_use_id) not in alerted:
            found = "no record" if record is None else f"{record.status.value} #{record.attempt}"
            sim.violation(
                f"{effect.title}: attempt {effect.attempt}'s effect is neither recorded nor "
                f"alerted ({found})"
            )
    high_impact: dict[tuple[str, str], list[Effect]] = {}
    for e in sim.world.effects:
        if e.kind == "high_impact":
            high_impact.setdefault((e.title.split("/")[0], e.tool_use_id), []).append(e)
    for key, made in high_impact.items():
        # A branch's copy of its lineage's call is resolved on the branch where its attempts
        # ran: a force there (or a limit case) excuses a second run as one on the call's first
        # session does (``Truth.forced_on``). Approvals still count on the first session only:
        # two branches' approvals are not two runs' worth for one lineage's call.
        tid = key[1]
        sessions = {key[0]} | {sim.made_in.get(id(e), key[0]) for e in made}
        overridden = any((where, tid) in sim.limit_cases | sim.forced for where in sessions)
        if len(made) > max(1, sim.approved[key]) and not overridden:
            sim.violation(
                f"{key[0]}/{tid}: ran {len(made)} times on {sim.approved[key]} approval(s)"
            )
    store = sim.operator.store
    excused = {k[1] for k in sim.limit_cases | sim.forced}
    for problem in verify(store):
        if problem.severity is not Severity.ERROR:
            continue
        if any(tid in problem.message for tid in excused):
            continue
        sim.violation(f"verify: session {problem.session_id!r}: {problem.message}")
