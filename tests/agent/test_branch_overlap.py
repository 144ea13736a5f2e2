"""A rewind while the session is being run: a worker paused (``SIGSTOP``) inside a tool on this
host keeps its session; one on another host, past its lease, is taken over by the rewind and
fenced out when it wakes; two rewinds at once; a person settling a call of an abandoned branch.
Effects are counted in the world — ticket files — never in the ledger."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import toolledger as tl
from toolledger._verify import Severity, verify
from toolledger.testing import elsewhere
from toolledger.testing.scripted import Reply, ScriptedModel

from .test_takeover import (
    LEASE_TTL,
    SESSION,
    SHORT_TIMEOUT,
    Tickets,
    _resume,
    _script,
    _start_paused_worker,
    agent,
    past_lease_and_deadline,
)


def test_a_paused_worker_on_this_host_keeps_its_session_from_a_rewind(
    shared_url: str, tmp_path: Path
) -> None:
    tl.open_store(shared_url).close()
    world = Tickets(tmp_path / "world")
    with ScriptedModel(_script()) as model:
        pid = _start_paused_worker(shared_url, model, world, "checked", timeout=SHORT_TIMEOUT)
        try:
            past_lease_and_deadline(shared_url)
            with tl.open_store(shared_url) as store:
                before = (store.session(SESSION), store.messages(SESSION))
                with pytest.raises(tl.SessionBusyError, match="is alive"):
                    tl.rewind(store, SESSION, to_turn=0)
                assert (store.session(SESSION), store.messages(SESSION)) == before
                assert store.abandoned(SESSION) == {}
        finally:
            first = _resume(pid, world)
    assert first == {"status": "completed", "alerts": []}
    assert len(world.all()) == 1


def test_a_rewind_from_another_host_fences_the_paused_worker_out(
    shared_url: str, tmp_path: Path
) -> None:
    """The paused worker's call is in progress (its deadline is far): the rewind lists it as
    such and tells the model so. When the worker wakes, its effect lands — the world has one
    ticket — but its checkpoint is refused: the session is the rewound one."""
    tl.open_store(shared_url).close()
    world = Tickets(tmp_path / "world")
    with ScriptedModel(_script()) as model:
        pid = _start_paused_worker(shared_url, model, world, "checked", timeout=300)
        try:
            time.sleep(LEASE_TTL + 0.3)
            with tl.open_store(shared_url) as store:
                far = elsewhere(store, "host-b")
                entry = tl.rewind(far, SESSION, to_turn=0, by="ops")
                (effect,) = entry.effects
                assert effect.tool == "create_ticket" and effect.state == "in_progress"
                assert "it was still running" in str(store.messages(SESSION)[-1].content)
        finally:
            first = _resume(pid, world)
    assert first == {"error": "LeaseLostError", "alerts": []}
    assert len(world.all()) == 1
    # The model, told of the ticket, does not open another; the session completes.
    already = ScriptedModel([Reply(text="The ticket was already opened.")])
    with already as model, tl.open_store(shared_url) as store:
        far = elsewhere(store, "host-b")
        run = agent(far, model, world, "checked", 300).run(session=SESSION)
        assert run.status is tl.RunStatus.COMPLETED
        assert [e.state for e in run.effects_after_fork] == ["in_progress"]
        sent = model.requests[0]["messages"]
        assert sent[-1]["role"] == "user" and effect.tool_use_id in str(sent[-1]["content"])
        # The abandoned call's record is the worker's outcome, kept in the ledger.
        record = store.ledger(SESSION).get(effect.tool_use_id)
        assert record is not None and record.status is tl.Status.SUCCEEDED
        (branch,) = store.branches(SESSION)
        (turn,) = branch.abandoned
        assert [c.disposition for c in turn.calls] == [tl.CallState.SUCCEEDED]
        assert [p for p in verify(store) if p.severity is Severity.ERROR] == []
    assert len(world.all()) == 1


def test_two_rewinds_at_once_one_lands(shared_url: str) -> None:
    from toolledger.testing import Counter

    from ..test_history import run_four_turns

    with tl.open_store(shared_url) as store:
        run_four_turns(store, SESSION, Counter())
    outcomes: list[object] = []
    barrier = threading.Barrier(4)

    def rewind(turn: int) -> None:
        with tl.open_store(shared_url) as store:
            barrier.wait()
            try:
                outcomes.append(tl.rewind(store, SESSION, to_turn=turn))
            except (tl.SessionConflictError, tl.BranchPointError) as exc:
                outcomes.append(exc)

    threads = [threading.Thread(target=rewind, args=(t,)) for t in (0, 1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    landed = [o for o in outcomes if isinstance(o, tl.Branch)]
    assert len(outcomes) == 4 and len(landed) >= 1
    with tl.open_store(shared_url) as store:
        state = store.session(SESSION)
        assert state is not None
        # Each rewind that landed read the session as the one before it left it.
        assert [b.branch for b in state.lineage] == list(range(1, len(landed) + 1))
        assert sorted(store.abandoned(SESSION)) == [b.branch for b in state.lineage]
        assert len(store.messages(SESSION)) == state.messages
        assert [p for p in verify(store) if p.severity is Severity.ERROR] == []


def test_a_person_settles_a_call_of_an_abandoned_branch(shared_url: str) -> None:
    """A call left in doubt, then rewound past: it stays in doubt in the ledger (the world may
    hold its effect), is told to the model as such, and a person can still settle it."""
    tl.open_store(shared_url).close()
    with ScriptedModel(_script()) as model, tl.open_store(shared_url) as store:
        doomed = tl.Agent(client=model.client(), model="x", tools=[_doubtful()], store=store)
        run = doomed.run(session=SESSION, prompt="open a ticket")
        assert run.status is tl.RunStatus.NEEDS_ATTENTION
        (doubt,) = store.in_doubt()
        # Turn 1 has no result for the call: the only point before it is turn 0.
        with pytest.raises(tl.BranchPointError, match="not over"):
            tl.rewind(store, SESSION, to_turn=1)
        entry = tl.rewind(store, SESSION, to_turn=0)
        assert [(e.tool_use_id, e.state) for e in entry.effects] == [
            (doubt.tool_use_id, "in_doubt")
        ]
        assert [r.tool_use_id for r in store.in_doubt()] == [doubt.tool_use_id]
        store.ledger(SESSION).resolve(doubt.tool_use_id, happened=False, by="ana")
        (branch,) = store.branches(SESSION)
        assert [c.disposition for c in branch.abandoned[0].calls] == [tl.CallState.NOT_HAPPENED]
        assert [p for p in verify(store) if p.severity is Severity.ERROR] == []


def _doubtful() -> tl.Tool:
    @tl.tool(effect="non_idempotent", name="create_ticket")
    def create_ticket(title: str) -> str:
        """Open a ticket; the answer is lost."""
        raise tl.OutcomeUnknown("the ticket API timed out after sending")

    return create_ticket


def test_a_fork_of_a_session_whose_worker_is_inside_a_tool(shared_url: str, tmp_path: Path) -> None:
    """The fork reads the parent as it stands, without stopping its worker: the call being run
    is listed as in progress and the fork's model told so; the worker then finishes the parent
    undisturbed, and the world holds one ticket."""
    tl.open_store(shared_url).close()
    world = Tickets(tmp_path / "world")
    with ScriptedModel(_script()) as model:
        pid = _start_paused_worker(shared_url, model, world, "checked", timeout=300)
        try:
            with tl.open_store(shared_url) as store:
                before = (store.session(SESSION), store.messages(SESSION))
                new = tl.fork(store, SESSION, at_turn=0, new_session="fork")
                state = store.session(new)
                assert state is not None
                (effect,) = state.lineage[-1].effects
                assert (effect.tool, effect.state) == ("create_ticket", "in_progress")
                assert "it was still running" in str(store.messages(new)[-1].content)
                assert (store.session(SESSION), store.messages(SESSION)) == before
        finally:
            first = _resume(pid, world)
    assert first == {"status": "completed", "alerts": []}
    assert len(world.all()) == 1
