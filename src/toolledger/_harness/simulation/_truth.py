"""What every write of a simulated run is checked against, at the instant it applies: nothing is
settled while its attempt can still take effect, every checkpoint carries its writer's fence, and
no call takes effect twice (bar a person's ``--force`` and the documented limit)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ...ops import HoldLease, InsertEffect, Op, PutSession, TakeLease, UpdateEffect
from ...records import Status
from ._cluster import SimProcess, Worker
from ._state import Attempt, SimState

__all__ = ["Truth"]


class Truth(SimState):
    """The simulation's own record of every attempt, and the checks made against it."""

    def _effect_made(self, effect: Any, session: str = "") -> None:
        self.note(
            f"EFFECT {effect.kind} {effect.title} by {effect.process} attempt {effect.attempt}"
        )
        self.made_in[id(effect)] = session
        same = self.world.effects_of(effect.title)
        if len(same) < 2:
            return
        sid, tid = effect.title.split("/")[0], effect.tool_use_id
        if effect.kind == "keyed" and len({e.key for e in same}) > 1:
            # Every session of a lineage forwards one key for a call: wherever it runs, the
            # receiver takes it once (docs/concepts/branches.md) — no limit case excuses two.
            self.violation(f"{effect.title}: {len(same)} effects of a keyed call under two keys")
        elif self.rerun_across_branches(same):
            # The documented limit of docs/design.md, rule 19: a call no turn of its origin
            # asked for any more, run by a branch as its own, and asked for again by a rewound
            # origin.
            self.limit_cases.add((sid, tid))
            self.stats["branch_limit_cases"] += 1
        elif effect.kind in ("keyed", "idempotent"):
            self.violation(f"{effect.title}: {len(same)} effects of a {effect.kind} call")
        elif any(e.past_deadline for e in same):
            self.limit_cases.add((sid, tid))
            self.stats["limit_cases"] += 1
        elif (sid, tid) in self.limit_cases:
            self.stats["limit_cases"] += 1  # settled as a documented limit case (``_settled``)
        elif self._clock_limit(sid, same):
            self.limit_cases.add((sid, tid))
            self.stats["limit_cases"] += 1
            self.stats["clock_limit_cases"] += 1
        elif not self.forced_on(sid, same):
            self.violation(
                f"{effect.title}: took effect {len(same)} times "
                f"({', '.join(f'attempt {e.attempt} by {e.process}' for e in same)})"
            )

    def forced_on(self, sid: str, same: list[Any]) -> bool:
        """A person forced a resolution of this call (``--force``) while an attempt could
        still take effect: in session ``sid`` (the call's title), or in a session where one of
        its attempts ran — a branch's copy of its lineage's call is resolved on the branch."""
        tids = {e.tool_use_id for e in same}
        sessions = {sid} | {self.made_in.get(id(e), sid) for e in same}
        return any(k[0] in sessions and k[1] in tids for k in self.forced)

    def _clock_limit(self, sid: str, same: list[Any]) -> bool:
        """Rule 14 on a file store whose clock stepped forward: an earlier attempt's process
        stopped (paused past its lease) and woke within its time, while the one that ran the
        call again judged its deadline on a wall clock — there was no boot clock to read on one
        side (no /proc there). Counted and documented (docs/concepts/liveness.md), not silent."""
        if not self.local_clock:
            return False
        by_attempt = {e.attempt: self.attempts.get((sid, e.tool_use_id, e.attempt)) for e in same}
        found = [a for a in by_attempt.values() if a is not None]
        stalled = [a for a in found if a.stalled]
        no_boot_clock = any(a.process.runtime.boot is None for a in found)
        return bool(stalled) and no_boot_clock

    def observe_commit(
        self,
        process: SimProcess,
        session_id: str,
        ops: Sequence[Op],
        apply: Callable[[str, Sequence[Op]], list[bool]],
    ) -> list[bool]:
        """Apply ``ops`` for ``process``; check, against the truth, every change it makes to a
        ``started`` record (nothing is settled while its attempt can still take effect) and that
        every checkpoint carries its writer's fence."""
        before = {
            op.record.tool_use_id: self.backend.read_effects(
                session_id, [op.record.tool_use_id]
            ).get(op.record.tool_use_id)
            for op in ops
            if isinstance(op, (InsertEffect, UpdateEffect))
        }
        flags = apply(session_id, ops)
        writes_transcript = any(type(op).__name__ in ("AppendMessages", "PutSession") for op in ops)
        # A rewind's fence is the lease it takes; a fork writes a session nobody else can have.
        unfenced = not any(
            isinstance(op, HoldLease | TakeLease)
            or (isinstance(op, PutSession) and op.expect_version is None)
            for op in ops
        )
        if (
            writes_transcript
            and unfenced
            and any(type(op).__name__ == "AppendMessages" for op in ops)
        ):
            self.violation(f"{session_id}: a transcript written without its lease's fence")
        worker = self._current
        for op, ok in zip(ops, flags, strict=True):
            if not ok or not isinstance(op, (InsertEffect, UpdateEffect)):
                continue
            new, old = op.record, before.get(op.record.tool_use_id)
            fresh = new.status is Status.STARTED and (old is None or old.attempt != new.attempt)
            if fresh and worker is not None:
                # When its time is up, in true time: what its context counts down to (the
                # store's clock read now, at its intent, is the clock its deadline is on).
                deadline = new.deadline
                ends = None if deadline is None else self.t + (deadline - process.store.now())
                self._attempt_numbers.setdefault((session_id, new.tool_use_id), []).append(
                    new.attempt
                )
                self.attempts[(session_id, new.tool_use_id, new.attempt)] = Attempt(
                    worker, worker.gen, process, ends
                )
            if old is not None and old.status is Status.STARTED:
                self._settled(process, worker, old, new)
        return flags

    def let_go(self, process: SimProcess, session_id: str, tool_use_id: str) -> None:
        """``process`` no longer holds the call in flight. An attempt of it that none of its
        workers is invoking will never be invoked now: its outcome is written, or its worker
        gave it up (an intent whose commit went unconfirmed, one read back as not landed) —
        it is over. (A worker that invoked it all the same would make a second effect, which
        the effect count catches.)"""
        for n in self._attempt_numbers.get((session_id, tool_use_id), ()):
            key = (session_id, tool_use_id, n)
            attempt = self.attempts[key]
            if attempt.process is process and not any(w.invoking == key for w in process.workers):
                attempt.over = True

    def _settled(self, process: SimProcess, worker: Worker | None, old: Any, new: Any) -> None:
        if (new.status, new.attempt, new.holder is None) == (
            old.status,
            old.attempt,
            old.holder is None,
        ):
            return
        truth = self.attempts.get((old.session_id, old.tool_use_id, old.attempt))
        if truth is None or (worker is not None and truth.worker is worker):
            return  # its own worker's outcome, or an attempt this run never saw start
        may = (
            truth.process.alive
            and not truth.over
            and not truth.effect_done
            and truth.worker.gen is truth.gen
        )
        if may and not truth.process.sloppy and truth.deadline is not None:
            may = self.t < truth.deadline
        if not may:
            return
        key = (old.session_id, old.tool_use_id)
        if self._acting_forced:
            return
        if truth.process.sloppy:
            self.limit_cases.add(key)
            return
        no_boot_clock = old.boot_deadline is None or process.runtime.boot is None
        stopped = truth.process.state == "paused" or truth.stalled
        if stopped and self.local_clock and no_boot_clock:
            # Rule 14 again: its worker stopped renewing (paused, or cut off from the store,
            # past its lease), and with no
            # boot clock to judge its deadline on (no /proc on one side: macOS, a masked /proc)
            # the settler read it on a wall clock that stepped forward. Counted and documented
            # (docs/concepts/liveness.md), not excused silently.
            self.limit_cases.add(key)
            self.stats["clock_limit_cases"] += 1
            return
        self.violation(
            f"{old.session_id}/{old.tool_use_id}: attempt {old.attempt} (by {truth.process.name}, "
            f"{truth.process.state}) was settled by {process.name} as {new.status.value} "
            f"(attempt {new.attempt}) while it could still take effect"
        )

    def violation(self, text: str) -> None:
        self.note(f"VIOLATION {text}")
        if text not in self.violations:
            self.violations.append(text)
