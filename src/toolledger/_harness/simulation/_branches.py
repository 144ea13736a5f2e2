"""Branches and people who say yes: an operator who forks and rewinds sessions while they run, a
model that replays what a lineage was already answered, and processes whose approver says yes
to everything.

* **Forks and rewinds** (``SimConfig.branch``, per step) — the operator forks a session at any
  turn, 0 included (forks of forks too), or rewinds one, through the real ``toolledger.fork`` and
  ``toolledger.rewind`` on the shared store, while workers run it. A fork is a new session the
  workers then run to completion like any other.
* **A model that replays** — a branch's model answers each turn its lineage already saw with
  that very answer, tool_use ids and inputs included (a cached model, a recorded session
  replayed); past what the lineage saw, it answers from the session's script. A replayed call
  has the same title as the lineage's, so an effect of it twice is a call run twice, which the
  world's count catches (docs/design.md, rule 19) — bar the documented limit, counted apart: a call
  no turn of its origin asked for any more, run by a branch as its own, then asked for again by
  the origin after a rewind (``rerun_across_branches``).
* **Blanket yes** (``SimConfig.blanket_yes``) — a share of processes ask an approver that
  answers a plain ``True`` to every question, in-doubt re-runs included. A plain yes approves a
  high-impact call; it never re-runs a call in doubt (rule 21), so the world's count catches a
  runner that takes it for one.
"""

from __future__ import annotations

from typing import Any

from ...approvals import _queue as approvals
from ...branches._branching import fork, rewind
from ...engine._gate import ApprovalRequest, Decision, normalise
from ...errors import StoreError, ToolLedgerError
from ._cluster import SimProcess
from ._state import SimState

__all__ = ["Branches", "blanket_yes"]

MAX_BRANCHES_PER_SESSION = 2  # the cast stays bounded: every branch must run to its end


def blanket_yes(request: ApprovalRequest) -> bool:
    """The approver people write first: yes to everything."""
    return True


class Branches(SimState):
    """The operator's forks and rewinds, the replaying model, and the blanket-yes approvers."""

    replays: dict[str, list[Any]]  # session -> its lineage's answers, by turn
    branched: dict[str, int]  # session -> branches made from it
    yes_men: set[str]  # processes whose approver says yes to everything

    def _setup_branches(self) -> None:
        self.replays = {}
        self.branched = {}
        self.yes_men = set()
        self.made_in = {}

    # -- approvers -------------------------------------------------------------------------------

    def _hire(self, process: SimProcess) -> None:
        """Choose a new process's approver: the queue, or (``blanket_yes``) yes to all."""
        if self.config.blanket_yes and self.rng.random() < self.config.blanket_yes:
            self.yes_men.add(process.name)

    def approver_of(self, process: SimProcess) -> Any:
        return blanket_yes if process.name in self.yes_men else approvals.queue

    def ask(self, process: SimProcess, request: ApprovalRequest) -> Decision:
        """What ``process``'s approver answers; a yes that allows a run is counted as an
        approval (the high-impact count checks effects against approvals)."""
        approver = self.approver_of(process)
        decision = normalise(approver(request), approver, in_doubt=request.in_doubt)
        if approver is blanket_yes:
            self.stats["blanket_yes"] += 1
            if not request.in_doubt:
                self.approved[(request.session_id, request.tool_use_id)] += 1
        return decision

    # -- the replaying model ---------------------------------------------------------------------

    def replayed(self, session: str, turn: int) -> dict[str, Any] | None:
        """The lineage's answer to turn ``turn`` (0-based) of ``session``, if it saw one."""
        answers = self.replays.get(session)
        if answers is None or turn >= len(answers):
            return None
        content = answers[turn]
        asks = any(b.get("type") == "tool_use" for b in content)
        self.stats["replayed_turns"] += 1
        return {
            "content": content,
            "stop_reason": "tool_use" if asks else "end_turn",
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }

    def _known(self, session: str) -> list[Any]:
        """Every answer the lineage of ``session`` saw, by turn: its transcript's, then what
        its own replay knows beyond them."""
        turns = [m.content for m in self.backend.read_messages(session) if m.role == "assistant"]
        return turns + self.replays.get(session, [])[len(turns) :]

    # -- the operator's branches -----------------------------------------------------------------

    def _branch(self) -> None:
        """The operator forks or rewinds a session that has turns to go back over."""
        candidates = [
            sid
            for sid in self.scripts
            if self.branched.get(sid, 0) < MAX_BRANCHES_PER_SESSION
            and self.backend.read_session(sid) is not None
        ]
        if not candidates:
            return
        sid = self.rng.choice(candidates)
        state = self.backend.read_session(sid)
        assert state is not None
        turn = self.rng.randint(0, state.turns)
        known = self._known(sid)
        store = self.operator.store
        try:
            if self.rng.random() < 0.6:
                new = fork(store, sid, at_turn=turn, new_session=f"{sid}~f{len(self.scripts)}")
                # Its own calls past what the lineage saw are new ones: titled by the branch.
                self.scripts[new] = [
                    [(name, f"{new}/{title.split('/', 1)[1]}") for name, title in turn_calls]
                    for turn_calls in self.scripts[sid]
                ]
                self.replays[new] = known
                self.stats["forks"] += 1
                self.note(f"operator forks {sid} at turn {turn} into {new}")
            else:
                rewind(store, sid, to_turn=turn, by="ana", watch=0)
                self.replays[sid] = known
                self.stats["rewinds"] += 1
                self.note(f"operator rewinds {sid} to turn {turn}")
        except (ToolLedgerError, StoreError) as exc:
            self.note(f"operator cannot branch {sid} at turn {turn}: {type(exc).__name__}")
            return
        self.branched[sid] = self.branched.get(sid, 0) + 1
        self._wake_idle()

    def rerun_across_branches(self, same: list[Any]) -> bool:
        """Effects of one call made in more than one session of a lineage, one of which a rewind
        took back past the call: the documented limit of docs/design.md, rule 19. A branch runs, as
        its own, a lineage call that no turn of its origin asks for any more; a rewound origin
        whose model replays its old answers asks for it again, and runs it too."""
        sessions = {self.made_in.get(id(e), "") for e in same}
        if len(sessions) < 2:
            return False
        tid = same[-1].tool_use_id
        for sid in sessions:
            state = self.backend.read_session(sid)
            if state is not None and tid in state.abandoned_calls():
                return True
        return False

    def _wake_idle(self) -> None:
        """A new branch, or a rewound session, is work: idle workers look for it."""
        for p in self.processes:
            for w in p.workers:
                if w.gen is None and p.alive:
                    self._at(0.001, self._starter(w))
