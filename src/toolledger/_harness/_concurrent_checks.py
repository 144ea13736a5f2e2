"""What the concurrency torture (``toolledger._harness.concurrent_torture``) checks once every
worker
is gone and every session has finished.

The evidence is the world — ticket files, each process's execution log, the harness's own record
of which process ran on which host and when it was killed, and of what its operator did when —
and the store as any reader sees it. The ledger is read for what a person reads it for (which
attempt a record is at, what its history says, its deadline), never trusted to say what
happened in the world.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from ..adapters.anthropic import merged, pairing_errors
from ..records import PastAttempt, RunStatus, Status
from ._concurrent_evidence import Evidence, Findings, WorkerInfo
from ._concurrent_world import TOOL_OF_KIND, UNSAFE_TOOLS
from ._invariants import calls_and_results

__all__ = ["LOST_LATE", "check_run"]


MARGIN_S = 0.25
"""Slack when comparing a moment seen in the world with a deadline on the store's clock."""

LOST_LATE = (
    "its late success was alerted (LateOutcomeError) but is missing from the record's history"
)

TICKET_TOOLS = frozenset(t for k, t in TOOL_OF_KIND.items() if k != "read_only")


@dataclass(slots=True, kw_only=True)
class _Exec:
    x: str
    worker: str
    host: str
    tid: str
    tool: str
    attempt: int
    start: float
    end: float  # its "end" event, or when its process was killed; inf if neither


@dataclass(frozen=True, slots=True, kw_only=True)
class _Settle:
    """A moment an attempt was treated as over: a resolve, a check, a worker's judgement that it
    was over, the next attempt's start (where its worker logged no judgement before it)."""

    what: str
    host: str
    t0: float
    t1: float
    judged: bool = False  # a worker's own judgement: t0 is when it began to look


def _process_ended(why: str) -> bool:
    """A judgement by the process table: "its process (pid … on this host) has ended"."""
    return "its process (" in why and "has ended" in why


class _Run:
    def __init__(self, e: Evidence, f: Findings) -> None:
        self.e = e
        self.f = f
        self.c = f.checks
        self.execs: dict[tuple[str, int], list[_Exec]] = defaultdict(list)
        starts = {ev["x"]: ev for ev in e.events if ev["ev"] == "start"}
        ends = {ev["x"]: ev for ev in e.events if ev["ev"] == "end"}
        for x, s in starts.items():
            end = ends.get(x)
            died = e.workers[s["w"]].ended if s["w"] in e.workers else None
            stop = end["t"] if end else (died if died is not None else float("inf"))
            ex = _Exec(
                x=x,
                worker=s["w"],
                host=s["host"],
                tid=s["tid"],
                tool=s["tool"],
                attempt=s["attempt"],
                start=s["t"],
                end=stop,
            )
            self.execs[(ex.tid, ex.attempt)].append(ex)
        f.executions = len(starts)
        self.checks = [ev for ev in e.events if ev["ev"] == "check"]
        self.judged: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
        for ev in e.events:
            if ev["ev"] == "judged":
                self.judged[(ev["tid"], ev["attempt"])].append(ev)
        # Alerted through a run's hook, or — by the background writer, whose run has returned —
        # through the toolledger logger alone.
        self.late_alerts = {
            (ev["tid"], ev["attempt"])
            for ev in e.events
            if ev["ev"] in ("alert", "alert_logged") and ev["type"] == "LateOutcomeError"
        }
        self.tickets: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for t in e.tickets:
            self.tickets[str(t.get("tool_use_id"))].append(t)
        self.records = {tid: r for s in e.sessions.values() for tid, r in s.records.items()}
        self.late_ok: set[tuple[str, int]] = set()

    # -- the moments an attempt was treated as over ------------------------------------------------

    def settles(self, tid: str, attempt: int) -> list[_Settle]:
        """Who treated ``attempt`` as over, and when: a person's resolve, a check, a worker's
        judgement, or — unless a person had said it did not happen, which needs no judgement
        after it — the worker that started the next attempt, when it logged no judgement of its
        own before (a judgement it logged says better when it looked)."""
        out = [
            _Settle(what="a person resolved it", host=self.e.this_host, t0=a.t0, t1=a.t1)
            for a in self.e.actions
            if a.kind == "resolve" and a.ok and a.tid == tid and a.attempt == attempt
        ]
        said = min((s.t0 for s in out), default=float("inf"))
        out += [
            _Settle(what=f"{ev['w']} checked it", host=ev["host"], t0=ev["t"], t1=ev["t"])
            for ev in self.checks
            if ev["tid"] == tid and ev["attempt"] == attempt
        ]
        judged = self.judged.get((tid, attempt), [])
        out += [
            _Settle(
                what=f"{ev['w']} judged it over ({ev['why']})",
                host=ev["host"],
                t0=ev["t0"],
                t1=ev["t"],
                judged=True,
            )
            for ev in judged
        ]
        out += [
            _Settle(
                what=f"{ex.worker} ran attempt {attempt + 1}",
                host=ex.host,
                t0=ex.start,
                t1=ex.start,
            )
            for ex in self.execs.get((tid, attempt + 1), [])
            if ex.start < said
            and not any(ev["w"] == ex.worker and ev["t"] <= ex.start for ev in judged)
        ]
        return out

    def died(self, ex: _Exec) -> float:
        """When the process that ran ``ex`` was killed (``inf``: never)."""
        w = self.e.workers.get(ex.worker)
        return w.ended if w is not None and w.killed and w.ended is not None else float("inf")

    def judgements(self) -> None:
        """Rule 12 as the workers applied it: a worker that judged an attempt over because its
        process, on the same host, had ended looked once that process was killed — never while
        it lived (paused or not), whatever tool it ran."""
        by_pid: dict[int, list[WorkerInfo]] = defaultdict(list)
        for w in self.e.workers.values():
            by_pid[w.pid].append(w)
        for (tid, attempt), evs in self.judged.items():
            # The process that ran the attempt, when the world saw it run; else the last one
            # started with that pid (a pid is reused only after its process was reaped).
            ran = {
                self.e.workers[x.worker].pid: self.e.workers[x.worker]
                for x in self.execs.get((tid, attempt), [])
                if x.worker in self.e.workers
            }
            for ev in evs:
                # Only what the process table said: "its process (pid … on this host) has
                # ended" — not a worker's word on its own attempt, nor a lease or a deadline.
                if ev["host"] != ev["of_host"] or ev["of_pid"] in (None, ev["pid"]):
                    continue
                if not _process_ended(ev["why"]):
                    continue
                lived = [w for w in by_pid.get(ev["of_pid"], []) if w.started <= ev["t"]]
                proc = ran.get(ev["of_pid"]) or (
                    max(lived, key=lambda w: w.started) if lived else None
                )
                if proc is None:
                    continue  # not a worker's pid (its identity is judged apart)
                if proc.ended is not None and not proc.killed:
                    continue  # it exited by itself: the harness saw that only when it reaped it
                self.f.judged_ended += 1
                self.c.expect(
                    proc.ended is not None and proc.ended <= ev["t"],
                    f"{ev['w']} judged {ev['tid']} attempt {ev['attempt']} over ({ev['why']}) "
                    f"at {ev['t']:.3f}, while {proc.serial} (pid {proc.pid}, the same host) "
                    f"lived until {proc.ended if proc.ended is not None else 'the end'}",
                )

    def deadline(self, tid: str, attempt: int) -> float | None:
        record = self.records.get(tid)
        if record is None:
            return None
        if record.attempt == attempt:
            return record.deadline
        past = [p for p in record.history if p.attempt == attempt]
        return past[0].deadline if past else None

    def overlaps(self) -> None:
        """Invariant 4 (and its generalisation to workers): no attempt was treated as over while
        it ran in a live process of the same host; elsewhere, only once its deadline passed."""
        for (tid, attempt), execs in self.execs.items():
            for ex in execs:
                if ex.tool not in UNSAFE_TOOLS:
                    continue
                for s in self.settles(tid, attempt):
                    if not ex.start < s.t0 or not s.t1 < ex.end:
                        continue  # not while it ran
                    self.c.expect(
                        s.host != ex.host,
                        f"{ex.tool} {tid} attempt {attempt}: {s.what} at {s.t0:.3f} while "
                        f"{ex.worker}, alive on the same host, ran it "
                        f"({ex.start:.3f}-{ex.end:.3f})",
                    )
                    deadline = self.deadline(tid, attempt)
                    if s.host == ex.host or deadline is None:
                        continue
                    past = s.t1 >= deadline - MARGIN_S
                    self.c.expect(
                        past,
                        f"{ex.tool} {tid} attempt {attempt}: {s.what} at {s.t1:.3f}, before its "
                        f"deadline {deadline:.3f}, while {ex.worker} (another host) ran it",
                    )
                    if past:
                        self.f.settled_elsewhere_past_deadline += 1

    def limit(self, tid: str, attempt: int, past: PastAttempt) -> str | None:
        """Why a late effect of ``attempt`` is *not* rule 14's paused process, or ``None``."""
        if self.e.other_hosts == 0:
            return "no worker ran as another host, so no attempt may ever be judged over alive"
        execs = self.execs.get((tid, attempt), [])
        if len(execs) != 1:
            return f"the world shows {len(execs)} executions of attempt {attempt}"
        ex = execs[0]
        # Every settle of this attempt, whenever it came: its intent was durable before, and a
        # pause may have fallen between the intent and the tool's "start".
        settles = self.settles(tid, attempt)
        if not settles:
            return f"nothing settled attempt {attempt} while it ran"
        # A worker of its own host that looked only once its process was gone judged right; it
        # is no reason, and no excuse either: another host must have settled it past deadline.
        # One that read the process table as it died (began before, ended after) and found it
        # ended read it after: ``judgements`` holds every such reading against the kill.
        died = self.died(ex)
        settles = [
            s
            for s in settles
            if not (
                s.host == ex.host
                and s.judged
                and (s.t0 >= died or (s.t1 >= died and _process_ended(s.what)))
            )
        ]
        if not settles:
            return f"only workers of its own host judged attempt {attempt} over, once it was gone"
        for s in settles:
            if s.host == ex.host:
                return f"{s.what}, on the host of {ex.worker}"
            if past.deadline is not None and s.t1 < past.deadline - MARGIN_S:
                return f"{s.what} at {s.t1:.3f}, before its deadline {past.deadline:.3f}"
        return None

    # -- per call ----------------------------------------------------------------------------------

    def call(self, sid: str, tid: str, tool: str, title: str, answered_ok: bool) -> None:
        tickets = self.tickets.get(tid, [])
        self.f.effects += len(tickets)
        before = len(self.c.failed)
        n = len(tickets)
        where = f"{tool} {title!r} ({tid})"
        if tool not in UNSAFE_TOOLS:  # invariant 1: key-forwarding and idempotent
            self.c.expect(n == 1, f"{where} left {n} tickets, not 1")
            return
        record = self.records.get(tid)
        history = record.history if record is not None else ()
        late = {p.attempt: p for p in history if p.late == "succeeded"}
        for a, p in late.items():  # the documented limit, and nothing else, may report late
            why = self.limit(tid, a, p)
            alerted = (tid, a) in self.late_alerts
            self.c.expect(why is None, f"{where}: attempt {a} reported success late: {why}")
            self.c.expect(alerted, f"{where}: attempt {a} reported success late, unalerted")
            if why is None and alerted:
                self.late_ok.add((tid, a))
        attempts = Counter(int(t["attempt"]) for t in tickets)
        twice = [a for a, k in attempts.items() if k > 1]
        self.c.expect(not twice, f"{where}: attempt(s) {twice} made more than one ticket")
        succeeded = record is not None and record.status is Status.SUCCEEDED
        unrecorded = [
            t
            for t in tickets
            if int(t["attempt"]) not in late
            and not (succeeded and record is not None and int(t["attempt"]) == record.attempt)
        ]
        cut_off = 0
        for t in unrecorded:
            a = int(t["attempt"])
            past = [p for p in history if p.attempt == a]
            ex = self.execs.get((tid, a), [])
            w = self.e.workers.get(ex[0].worker) if ex else None
            # Killed after it began (before or after its "end"), it may have had no time to say
            # so; one that did say so (the alert) must be in the history.
            reported = (tid, a) in self.late_alerts
            cut = bool(past and ex and w is not None and w.killed and not reported)
            why = self.limit(tid, a, past[0]) if cut and past else None
            if not cut:
                why = (
                    LOST_LATE
                    if reported
                    else "no late outcome was written, and its worker was not killed before it "
                    "could report"
                )
            self.c.expect(
                why is None,
                f"{where}: the ticket of attempt {a} is neither recorded nor reported late: {why}",
            )
            if why is None:
                cut_off += 1
        extra = n - len([t for t in tickets if int(t["attempt"]) in late]) - len(unrecorded)
        if answered_ok:
            self.c.expect(n >= 1, f"{where} left no ticket: an effect was lost")
            self.c.expect(succeeded, f"{where} was answered as done; its record is not succeeded")
            self.c.expect(extra <= 1, f"{where} left {n} tickets: done twice")
        else:
            self.c.expect(extra == 0, f"{where} was answered 'not executed' yet left {n} tickets")
        if len(self.c.failed) == before:
            duplicates = max(0, n - 1 - cut_off)  # beyond the first, each one reported late
            self.f.cut_off += cut_off
            self.f.late_effects += duplicates
            self.f.late_outcomes += len(late) - duplicates

    def permissions(self, sid: str, tid: str, tool: str) -> None:
        """Invariant 6 (and its kin for plain and checked calls): every execution after the
        first — every one, for a high-impact call — had a permission of its own, given before it
        started: an approval, a "did not happen", a check that found nothing."""
        execs = sorted(
            (ex for (t, _), xs in self.execs.items() if t == tid for ex in xs),
            key=lambda ex: ex.start,
        )
        if tool == "open_incident":
            grants = [a.t0 for a in self.e.actions if a.tid == tid and a.kind == "approve" and a.ok]
            free = 0
        else:
            grants = [
                a.t0
                for a in self.e.actions
                if a.tid == tid
                and a.ok
                and ((a.kind == "resolve" and a.happened is False) or a.kind == "approve")
            ]
            grants += [ev["t"] for ev in self.checks if ev["tid"] == tid and not ev["found"]]
            free = 1
        for k, ex in enumerate(execs):
            given = free + sum(1 for t in grants if t < ex.start)
            self.c.expect(
                given >= k + 1,
                f"{tool} {tid}: execution {k + 1} (attempt {ex.attempt}, {ex.worker}) had "
                f"{given} permission(s) to run",
            )


def check_run(e: Evidence) -> Findings:
    """Every invariant of a finished run; the failures are in ``findings.checks.failed``."""
    f = Findings()
    run = _Run(e, f)
    c = f.checks
    known: dict[str, tuple[str, str]] = {}  # tid -> session, title
    for sid, s in sorted(e.sessions.items()):
        status = s.status.value if s.status else "missing"
        c.expect(s.status is RunStatus.COMPLETED, f"session {sid} ended {status}")
        pairing = pairing_errors(merged(s.messages))
        c.expect(not pairing, f"session {sid}: pairing rule: {'; '.join(pairing)}")
        uses, results = calls_and_results(s.messages)
        answered = Counter(str(b.get("tool_use_id")) for b in results)
        once = [u.tool_use_id for u in uses if answered[u.tool_use_id] != 1]
        c.expect(
            not once and len(results) == len(uses),
            f"session {sid}: tool_uses not answered exactly once: {once}",
        )
        errors = {
            str(b.get("tool_use_id")): str(b.get("content")) for b in results if b.get("is_error")
        }
        script = [
            c2.title for turn in e.scripts.get(sid, []) for c2 in turn if c2.kind != "read_only"
        ]
        asked = [str(u.input.get("title")) for u in uses if u.name in TICKET_TOOLS]
        c.expect(
            sorted(asked) == sorted(script),
            f"session {sid}: the transcript's calls {asked} are not the script's {script}",
        )
        for u in uses:
            f.tool_calls += 1
            if u.name not in TICKET_TOOLS:
                continue
            title = str(u.input.get("title"))
            known[u.tool_use_id] = (sid, title)
            if u.tool_use_id in errors:
                f.not_executed.append(f"{sid} {u.name} {u.tool_use_id}: {errors[u.tool_use_id]}")
            run.call(sid, u.tool_use_id, u.name, title, u.tool_use_id not in errors)
            if u.name in UNSAFE_TOOLS:
                run.permissions(sid, u.tool_use_id, u.name)
    for t in e.tickets:  # invariant 3: no effect that no call of a final transcript asked for
        tid = str(t.get("tool_use_id"))
        c.expect(
            known.get(tid) == (t.get("session"), t.get("title")),
            f"ticket {t.get('id')} ({t.get('title')!r}, {tid}) belongs to no call of a transcript",
        )
    run.overlaps()
    run.judgements()
    for problem in e.verify_errors:  # invariant 5: verify finds only the late effects above
        c.expect(
            "Both may have taken effect" in problem
            and any(f"({tid})" in problem for tid, _ in run.late_ok),
            f"verify: {problem}",
        )
    for problem in e.rejected:
        c.expect(False, f"the model rejected a request: {problem}")
    for ev in e.events:
        if ev["ev"] == "crash":
            c.expect(False, f"{ev['w']} raised {ev['type']}: {ev['msg'][-600:]}")
    for w in e.workers.values():
        c.expect(
            w.killed or w.exit_code in (0, None),
            f"{w.serial} (pid {w.pid}) exited with code {w.exit_code}",
        )
    return f
