"""Faults and people: crashes, pauses and partitions of simulated processes, and the operator who
decides approvals and settles calls in doubt from the world's evidence."""

from __future__ import annotations

from collections.abc import Callable

from ..._liveness import Over
from ...approvals import _queue as approvals
from ...errors import StoreError, ToolLedgerError
from ._cluster import SimProcess, Table
from ._truth import Truth

__all__ = ["Faults"]


class Faults(Truth):
    """What goes wrong, and what people do about it, during a simulated run."""

    def _chaos(self) -> None:
        c, rng = self.config, self.rng
        workers = [p for p in self.processes if p is not self.operator and p.alive]
        if workers and rng.random() < c.crash:
            victim = rng.choice(workers)
            self._crash(victim)
        if workers and rng.random() < c.pause:
            victim = rng.choice(workers)
            if victim.runnable:
                span = rng.choice([0.2, c.lease_ttl * 1.5, c.tool_timeout * 2, c.lease_ttl * 5])
                victim.state, victim.paused_until = "paused", self.t + span
                self.stats["pauses"] += 1
                self.stats["pauses_past_lease"] += span > c.lease_ttl
                if span > c.lease_ttl:
                    for attempt in self.attempts.values():
                        if attempt.process is victim and not attempt.over:
                            attempt.stalled = True
                self.stats["pauses_past_deadline"] += span > c.tool_timeout
                self.note(f"pause {victim.name} for {span:.2f}s")
                self._at(span, self._waker(victim))
        if workers and rng.random() < c.partition:
            victim = rng.choice(workers)
            span = rng.uniform(0.1, 3.0)
            victim.partitioned_until = self.t + span
            self.stats["partitions"] += 1
            if span > c.lease_ttl:  # cut off from the store: it stops renewing, as if paused
                for attempt in self.attempts.values():
                    if attempt.process is victim and not attempt.over:
                        attempt.stalled = True
            self.note(f"partition {victim.name} for {span:.2f}s")
        if workers and c.lost_reply and rng.random() < c.lost_reply:
            victim = rng.choice(workers)
            victim.lose_replies_until = self.t + rng.uniform(0.001, 0.05)
        if c.clock_step and rng.random() < c.clock_step:
            host = rng.choice(self.tables).host
            if self.local_clock:
                host = ""  # the file store's one machine: every table steps
            step = rng.choice([40.0, 600.0, -40.0, -600.0])
            for table in self.tables:
                if host in ("", table.host):  # one kernel, one clock: its containers step too
                    table.offset += step
            self.stats["clock_steps"] += 1
            self.note(f"the clock of {host or 'the machine'} steps {step:+.0f}s")
        if rng.random() < c.operator:
            self._operate()
        if c.branch and rng.random() < c.branch:
            self._branch()

    def _waker(self, p: SimProcess) -> Callable[[], None]:
        return lambda: self._wake(p)

    def _wake(self, p: SimProcess) -> None:
        if p.state == "paused" and self.t >= p.paused_until - 1e-9:
            p.state = "running"
            self.note(f"wake {p.name}")

    def _crash(self, p: SimProcess) -> None:
        p.state = "crashed"
        if self.fooling:
            p.reaped = self.rng.random() < 0.8  # or left a zombie until its parent collects it
        self.stats["crashes"] += 1
        self.note(f"CRASH {p.name}")
        for w in p.workers:
            if w.gen is not None:
                self._graveyard.append(w.gen)
            w.gen, w.io = None, None
        self._at(self.rng.uniform(0.05, 2.0), lambda: self._respawn(p.table))

    def _respawn(self, table: Table) -> None:
        self._spawn(table)

    def _operate(self) -> None:
        """A person at the console: decides pending approvals, settles calls in doubt from the
        world's evidence, and (if configured) forces a running call."""
        store = self.operator.store
        self.stats["operator_looks"] += 1
        try:
            waiting = approvals.pending(store)
            started = store.started()
        except StoreError:
            return
        for request in waiting:
            # A first run is approved; running an in-doubt call again only when the world shows
            # it did not happen (approving it otherwise would be a person choosing a duplicate).
            approve = not (request.in_doubt and self._happened(request.tool_use_id))
            try:
                approvals.decide(
                    store, request.session_id, request.tool_use_id, approved=approve, by="ana"
                )
            except ToolLedgerError:
                continue
            if approve:
                self.approved[(request.session_id, request.tool_use_id)] += 1
            self.stats["approvals" if approve else "denials"] += 1
            self.note(
                f"operator {'approves' if approve else 'denies'} "
                f"{request.session_id}/{request.tool_use_id}"
            )
        for record, verdict in started:
            forced = not isinstance(verdict, Over)
            if forced and not (self.config.force and self.rng.random() < self.config.force):
                continue
            happened = self._happened(record.tool_use_id)
            self._acting_forced = forced
            try:
                store.ledger(record.session_id).resolve(
                    record.tool_use_id, happened=happened, by="ana", force=forced
                )
            except ToolLedgerError:
                continue
            finally:
                self._acting_forced = False
            if forced:
                self.forced.add((record.session_id, record.tool_use_id))
            self.stats["forced" if forced else "resolutions"] += 1
            self.note(
                f"operator resolves {record.session_id}/{record.tool_use_id} "
                f"{'happened' if happened else 'not happened'}{' (forced)' if forced else ''}"
            )
        self._wake_all_idle()

    def crashed(self, name: str) -> bool:
        return any(p.name == name and not p.alive for p in self.processes)

    def _happened(self, tool_use_id: str) -> bool:
        return any(e.tool_use_id == tool_use_id for e in self.world.effects)

    def _wake_all_idle(self) -> None:
        """After the chaos, keep sessions moving: an operator's word makes a stopped session
        worth running again."""
        if self.steps < self.config.chaos_steps:
            return
        for p in self.processes:
            for w in p.workers:
                if w.gen is None and p.alive:
                    self._at(0.001, self._starter(w))

    def quiet_operator(self) -> None:
        self._operate()
