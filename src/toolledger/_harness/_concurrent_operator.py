"""The people of the concurrency torture: the operator who, at random moments and from the
harness's own process (this host), approves queued calls and settles in-doubt ones from the
world's evidence — and, once the chaos is over, drives every session to its end. Every action is
recorded with the moments it began and ended, for the checks. Also the pool of sessions on offer.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import traceback
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..adapters.anthropic import read_tool_uses
from ..agent._agent import Agent
from ..approvals._queue import decide, pending, queue
from ..errors import EffectInProgressError, StoreError, ToolLedgerError
from ..records import EffectRecord, RunStatus
from ..stores import Store, open_store
from ._concurrent_evidence import Action
from ._concurrent_worker import NORMAL, Shared, alert_hook
from ._concurrent_world import KINDS, Call, ScriptServer, SharedWorld, prompt_of

if TYPE_CHECKING:
    import random

    from ._concurrent_report import ConcurrentReport

__all__ = ["Operator", "Pool"]


class Pool:
    """The sessions on offer: ``target`` at a time while ``open``; a completed one is retired
    and, during the chaos, replaced by a new one with a script of its own."""

    def __init__(
        self, world: SharedWorld, model: ScriptServer, rng: random.Random, *, target: int
    ) -> None:
        self.world = world
        self.model = model
        self.rng = rng
        self.target = target
        self.open = True
        self.scripts: dict[str, list[list[Call]]] = {}
        self.completed: set[str] = set()

    def _new(self) -> None:
        name = f"c{len(self.scripts):05d}"
        script = [
            [
                Call(kind=self.rng.choice(KINDS), title=f"{name}/t{turn}c{i}")
                for i in range(self.rng.randint(1, 2))
            ]
            for turn in range(self.rng.randint(2, 3))
        ]
        self.scripts[name] = script
        self.model.scripts[prompt_of(name)] = (name, script)
        self.world.activate(name)

    def fill(self, store: Store) -> None:
        for name in self.world.active():
            state = store.session(name)
            if state is not None and state.status is RunStatus.COMPLETED:
                self.world.retire(name)
                self.completed.add(name)
        while self.open and len(self.world.active()) < self.target:
            self._new()
        self.model.forget_requests()


class Operator:
    """A person on this host, with the store open, acting on what the world shows."""

    def __init__(
        self, shared: Shared, pool: Pool, rng: random.Random, report: ConcurrentReport
    ) -> None:
        self.shared = shared
        self.world = shared.world
        self.pool = pool
        self.rng = rng
        self.report = report
        self.store = open_store(shared.store_url)
        self.actions: list[Action] = []
        self._titles: dict[str, str] = {}
        self._lock = threading.Lock()
        self.forking = threading.Lock()  # held while acting; the harness forks only without it

    # -- during the chaos --------------------------------------------------------------------------

    def loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.rng.uniform(0.05, 0.25)):
            try:
                with self.forking:  # no worker is forked while this process holds a lock
                    self.pool.fill(self.store)
                    if self.rng.random() < 0.7:
                        self.approve(self.world.active(), quiet=False)
                    if self.rng.random() < 0.7:
                        self.resolve(self.store.in_doubt(), quiet=False)
            except StoreError:
                self.report.store_errors += 1  # a paused worker held the store's lock
            except Exception:
                self.report.violations.append(f"the operator raised {traceback.format_exc()}")
                return

    def approve(self, sessions: Iterable[str], *, quiet: bool) -> None:
        """Approve what waits — except re-running an in-doubt call whose ticket exists: that
        one happened, and a resolve settles it."""
        for sid in sessions:
            for request in pending(self.store, sid):
                if not quiet and self.rng.random() < 0.3:
                    continue
                title = str(request.input.get("title"))
                if request.in_doubt and self.world.has_ticket(sid, title):
                    continue
                t0 = time.time()
                try:
                    decide(self.store, sid, request.tool_use_id, approved=True, by="operator")
                    ok, error = True, None
                except ToolLedgerError as exc:
                    ok, error = False, type(exc).__name__
                self._act(
                    Action(
                        kind="approve",
                        sid=sid,
                        tid=request.tool_use_id,
                        t0=t0,
                        t1=time.time(),
                        ok=ok,
                        in_doubt=request.in_doubt,
                        error=error,
                        quiet=quiet,
                    )
                )
                self.report.approvals += ok

    def resolve(self, records: list[EffectRecord], *, quiet: bool) -> None:
        """Settle in-doubt calls from the world's evidence: is there a ticket for the call?"""
        for record in records:
            if not quiet and self.rng.random() < 0.3:
                continue
            sid, tid = record.session_id, record.tool_use_id
            title = self._title(sid, tid)
            t0 = time.time()
            happened = self.world.has_ticket(sid, title)
            attempt = record.attempt
            try:
                new = self.store.ledger(sid).resolve(
                    tid,
                    happened=happened,
                    result={"title": title, "found": True} if happened else None,
                    by="operator",
                )
                ok, error, attempt = True, None, new.attempt
            except EffectInProgressError:
                ok, error = False, "in progress"
            except ToolLedgerError as exc:
                ok, error = False, type(exc).__name__
            self._act(
                Action(
                    kind="resolve",
                    sid=sid,
                    tid=tid,
                    t0=t0,
                    t1=time.time(),
                    ok=ok,
                    attempt=attempt,
                    happened=happened,
                    error=error,
                    quiet=quiet,
                )
            )
            outcome = ("happened" if happened else "not happened") if ok else f"refused ({error})"
            self.report.resolves[outcome] += 1

    def _act(self, action: Action) -> None:
        with self._lock:
            self.actions.append(action)
            with open(self.world.path / "operator.jsonl", "a") as fh:  # for a person, later
                fh.write(json.dumps(dataclasses.asdict(action)) + "\n")

    def _title(self, sid: str, tid: str) -> str:
        if tid not in self._titles:
            for m in self.store.messages(sid):
                if m.role == "assistant":
                    for use in read_tool_uses(m.content):
                        self._titles[use.tool_use_id] = str(use.input.get("title"))
        return self._titles.get(tid, "")

    # -- after the chaos ---------------------------------------------------------------------------

    def finish(self, limit: float) -> None:
        """Drive every session to its end from this process: resume it; settle its in-doubt
        calls from the world's evidence; approve what it waits for."""
        import anthropic

        self.pool.open = False
        self.world.join("parent", 0)
        client = anthropic.Anthropic(
            base_url=self.shared.model_url, api_key="scripted", max_retries=0, timeout=60
        )
        agent = Agent(
            client=client,
            model="claude-scripted",
            tools=self.shared.tools,
            store=self.store,
            approve=queue,
            lease_ttl=self.shared.lease_ttl,
            on_alert=alert_hook(self.world),
        )
        left = set(self.pool.scripts) - self.pool.completed
        deadline = time.monotonic() + limit
        while left and time.monotonic() < deadline:
            for sid in sorted(left):
                what = self._run(agent, sid)
                if what == RunStatus.COMPLETED.value:
                    left.discard(sid)
                    self.world.retire(sid)
                elif what == "crash":
                    left.discard(sid)
                elif what in (RunStatus.NEEDS_ATTENTION.value, RunStatus.AWAITING_APPROVAL.value):
                    self.resolve(self.store.ledger(sid).in_doubt(), quiet=True)
                    self.approve([sid], quiet=True)
            if left:
                time.sleep(0.05)

    def _run(self, agent: Agent, sid: str) -> str:
        what: Any
        try:
            what = agent.run(session=sid, prompt=prompt_of(sid)).status.value
        except NORMAL as exc:
            what = type(exc).__name__
        except Exception as exc:
            what = "crash"
            self.world.log("crash", type=type(exc).__name__, msg=traceback.format_exc()[-3000:])
        self.world.log("run", sid=sid, what=what, again=False, quiet=True)
        return str(what)
