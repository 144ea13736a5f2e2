"""The agent loop with the real anthropic SDK against the scripted model, in-process.

What the model was sent is asserted from the scripted server's request log; what happened in the
world from the world's files.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger import _switches as switches
from toolledger._verify import verify
from toolledger.ops import AppendMessages, InsertEffect, Op, PutSession
from toolledger.records import Status
from toolledger.testing.scripted import Flaky, Reply, ScriptedModel, ToolUse
from toolledger.testing.world import World

from ..helpers import spy_store, writes_status

TICKET = ToolUse("create_ticket", {"title": "Outage"})
TICKET_BLOCK = {"type": "tool_use", "id": "toolu_1", "name": "create_ticket", "input": {}}


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path / "world")


def agent_for(model: ScriptedModel, store: tl.Store, world: World, **kwargs: Any) -> tl.Agent:
    return tl.Agent(
        client=model.client(), model="claude-test", tools=world.toolset(), store=store, **kwargs
    )


def test_a_session_runs_to_completion(store: tl.Store, world: World) -> None:
    with ScriptedModel([Reply(text="On it.", tool_uses=[TICKET]), Reply(text="Ticket open.")]) as m:
        run = agent_for(m, store, world, system="Be brief.").run(session="s", prompt="Outage!")
    assert run.status is tl.RunStatus.COMPLETED and run.reason is None
    assert run.final_text == "Ticket open." and run.turns == 2
    assert run.usage.input_tokens > 0 and run.usage.output_tokens > 0
    assert [m["role"] for m in run.messages] == ["user", "assistant", "user", "assistant"]
    assert len(world.tickets()) == 1
    first, second = m.requests
    assert first["system"] == "Be brief." and first["model"] == "claude-test"
    assert [t["name"] for t in first["tools"]] == world.toolset().names
    assert first["messages"] == [{"role": "user", "content": "Outage!"}]
    (result,) = second["messages"][-1]["content"]
    tool_use = second["messages"][1]["content"][1]
    assert result["type"] == "tool_result" and result["tool_use_id"] == tool_use["id"]
    assert m.rejected == []
    assert verify(store) == []


def test_durable_writes_per_turn(store: tl.Store, world: World) -> None:
    spied, spy = spy_store(store)
    script = [
        Reply(tool_uses=[TICKET]),
        Reply(tool_uses=[ToolUse("ensure_ticket", {"title": "x"})]),
        Reply(text="done"),
    ]
    with ScriptedModel(script) as m:
        agent_for(m, spied, world).run(session="s", prompt="go")
    kinds = [[type(op).__name__ for op in commit] for commit in spy.commits]
    # The turn's one call writes its intent in A's commit (``TOOLLEDGER_GENERAL_PATH=1``: A alone,
    # then the intent).
    a_with_intent = (
        [["HoldLease", "AppendMessages", "PutSession", "InsertEffect"]]
        if switches.STRAIGHT
        else [["HoldLease", "AppendMessages", "PutSession"], ["HoldLease", "InsertEffect"]]
    )
    assert kinds == [
        ["TakeLease"],  # the run takes the session
        ["HoldLease", "PutSession", "AppendMessages"],  # the prompt
        *a_with_intent,  # A of the non-idempotent turn, and its intent
        ["HoldLease", "UpdateEffect", "AppendMessages", "PutSession"],  # outcome + B
        ["HoldLease", "AppendMessages", "PutSession"],  # A: idempotent turn
        ["HoldLease", "InsertEffect", "AppendMessages", "PutSession"],  # outcome + B
        ["HoldLease", "AppendMessages", "PutSession"],  # A of the final turn
        ["DropLease"],  # and gives it back
    ], "every commit is fenced; a turn costs 2 writes (3 on the general path), 1 (final)"


def test_resume_never_appends_the_prompt_twice(store: tl.Store, world: World) -> None:
    with ScriptedModel([Flaky(Reply(text="hello"), status=500)]) as m:
        agent = agent_for(m, store, world)
        with pytest.raises(tl.ModelCallError) as info:
            agent.run(session="s", prompt="hi")
        assert info.value.status_code == 500 and info.value.session_id == "s"
        assert store.backend.read_session("s").status is tl.RunStatus.FAILED  # type: ignore[union-attr]
        run = agent.run(session="s", prompt="hi")  # the same call again: resumes
    assert run.status is tl.RunStatus.COMPLETED
    assert [msg["content"] for msg in run.messages] == ["hi", [{"type": "text", "text": "hello"}]]
    assert m.requests[-1]["messages"] == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("streamed", [False, True], ids=["create", "stream"])
def test_a_call_cut_off_by_max_tokens_is_neither_stored_nor_run(
    store: tl.Store, world: World, streamed: bool
) -> None:
    """A reply that hit ``max_tokens`` while it wrote a call: the call's input may be cut short
    (streamed, the SDK reads ``{"title": "Out`` as ``{"title": "Out"}``), so it never runs; the
    session keeps only its prompt, and the next run asks the model again."""
    cut = Reply(tool_uses=[ToolUse("create_ticket", {"title": "Out"})], stop_reason="max_tokens")
    on_text = (lambda text: None) if streamed else None
    with (
        ScriptedModel([cut]) as m,
        pytest.raises(tl.MalformedContentError, match="max_tokens") as info,
    ):
        agent_for(m, store, world).run(session="s", prompt="open a ticket", on_text=on_text)
    assert world.tickets() == [], "a call cut short never runs"
    assert info.value.tool_use_id is not None
    assert [msg.role for msg in store.messages("s")] == ["user"]
    state = store.session("s")
    assert state is not None and state.status is tl.RunStatus.FAILED, "not left running"
    assert "max_tokens" in (state.reason or ""), state.reason
    with ScriptedModel([Reply(tool_uses=[TICKET]), Reply(text="done")]) as m:
        agent = agent_for(m, store, world, max_tokens=8192)
        run = agent.run(session="s", prompt="open a ticket", on_text=on_text)
    assert run.status is tl.RunStatus.COMPLETED
    assert [t["title"] for t in world.tickets()] == ["Outage"]


@pytest.mark.parametrize("streamed", [False, True], ids=["create", "stream"])
def test_a_call_the_api_s_classifiers_stopped_is_neither_stored_nor_run(
    store: tl.Store, world: World, streamed: bool
) -> None:
    """A reply the API's safety classifiers stopped (``stop_reason`` ``refusal``) while it
    wrote a call: its input may be cut short just as at ``max_tokens``, so it never runs — and
    the error does not send the user to raise a limit that would change nothing."""
    cut = Reply(tool_uses=[ToolUse("create_ticket", {"title": "Out"})], stop_reason="refusal")
    on_text = (lambda text: None) if streamed else None
    with (
        ScriptedModel([cut]) as m,
        pytest.raises(tl.MalformedContentError, match="refused") as info,
    ):
        agent_for(m, store, world).run(session="s", prompt="open a ticket", on_text=on_text)
    assert "max_tokens" not in str(info.value)
    assert world.tickets() == [], "a call cut short never runs"
    assert [msg.role for msg in store.messages("s")] == ["user"]
    state = store.session("s")
    assert state is not None and state.status is tl.RunStatus.FAILED, "not left running"
    assert "refus" in (state.reason or ""), state.reason


def test_completed_session_with_its_own_prompt_is_returned_as_is(
    store: tl.Store, world: World
) -> None:
    with ScriptedModel([Reply(tool_uses=[TICKET]), Reply(text="done")]) as m:
        agent = agent_for(m, store, world)
        first = agent.run(session="s", prompt="open a ticket")
        again = agent.run(session="s", prompt="open a ticket")
        assert len(m.requests) == 2
    assert again.messages == first.messages and again.status is tl.RunStatus.COMPLETED
    assert len(world.tickets()) == 1


def test_a_finished_session_continues_with_a_new_prompt(store: tl.Store, world: World) -> None:
    script = [Reply(text="first answer"), Reply(text="second answer")]
    with ScriptedModel(script) as m:
        agent = agent_for(m, store, world)
        agent.run(session="s", prompt="one")
        run = agent.run(session="s", prompt="two")
    assert run.final_text == "second answer"
    assert [msg["content"] for msg in m.requests[-1]["messages"]] == [
        "one",
        [{"type": "text", "text": "first answer"}],
        "two",
    ]


def test_an_unfinished_session_refuses_a_different_prompt(store: tl.Store, world: World) -> None:
    with ScriptedModel([Reply(tool_uses=[ToolUse("create_ticket", {"title": "t"})])]) as m:
        agent = agent_for(m, store, world)
        with pytest.raises(tl.ModelCallError):  # the script has no second turn: a 400
            agent.run(session="s", prompt="one")
        with pytest.raises(tl.ConfigurationError, match="unfinished"):
            agent.run(session="s", prompt="something else")
    with pytest.raises(tl.ConfigurationError, match="does not exist"):
        agent.run(session="never-started")


def test_max_turns_stops_and_a_new_prompt_continues(store: tl.Store, world: World) -> None:
    lookups = [Reply(tool_uses=[ToolUse("list_tickets")]) for _ in range(3)]
    with ScriptedModel([*lookups, Reply(text="done")]) as m:
        agent = agent_for(m, store, world, max_turns=2)
        run = agent.run(session="s", prompt="look")
        assert run.status is tl.RunStatus.MAX_TURNS and "max_turns" in (run.reason or "")
        assert run.turns == 2 and run.messages[-1]["content"][0]["type"] == "tool_result"
        run = agent.run(session="s", prompt="keep going")
        assert run.status is tl.RunStatus.COMPLETED
        # The results and the new prompt went as one user turn, results first.
        assert len(m.requests) == 4
        merged_turn = m.requests[2]["messages"][-1]
        assert merged_turn["role"] == "user"
        assert [b["type"] for b in merged_turn["content"]] == ["tool_result", "text"]
        assert m.rejected == []


def test_async_agent(store: tl.Store, world: World) -> None:
    with ScriptedModel([Reply(tool_uses=[TICKET]), Reply(text="done")]) as m:
        agent = tl.Agent(
            client=m.async_client(), model="claude-test", tools=world.toolset(), store=store
        )
        with pytest.raises(tl.ConfigurationError, match="arun"):
            agent.run(session="s", prompt="go")
        run = asyncio.run(agent.arun(session="s", prompt="go"))
        again = asyncio.run(agent.arun(session="s", prompt="go"))
    assert run.status is tl.RunStatus.COMPLETED and again.messages == run.messages
    assert len(world.tickets()) == 1 and len(world.executions()) == 1


def test_ledger_alert_stops_the_session_and_the_outcome_lands_later(
    store: tl.Store, world: World
) -> None:
    """The outcome and checkpoint B share a commit that fails: the effect happened, the alert
    says so, the run stops. This process still knows the outcome: it keeps the call (in progress,
    never in doubt nor run again) and writes it once the store takes writes again; the next run
    then answers from the ledger."""
    spied, spy = spy_store(store, fail_when=writes_status(Status.SUCCEEDED))
    alerts: list[tl.LedgerWriteError] = []
    with ScriptedModel([Reply(tool_uses=[TICKET]), Reply(text="done")]) as m:
        agent = agent_for(m, spied, world, on_alert=alerts.append)
        with pytest.raises(tl.StoreError):
            agent.run(session="s", prompt="go")
        (alert,) = alerts
        assert alert.tool == "create_ticket"
        ((record, verdict),) = store.started()
        assert record.tool_use_id == alert.tool_use_id and "this process" in verdict.why
        assert store.ledger("s").in_doubt() == []
        with pytest.raises(tl.EffectInProgressError):
            agent.run(session="s")
        spy.fail_when = None  # the store takes writes again
        deadline = time.time() + 10
        while store.ledger("s").get(alert.tool_use_id).status is Status.STARTED:  # type: ignore[union-attr]
            assert time.time() < deadline, "the outcome was never written"
            time.sleep(0.05)
        run = agent.run(session="s")
    assert run.status is tl.RunStatus.COMPLETED
    assert len(world.tickets()) == 1 and len(world.executions()) == 1


def test_a_call_answered_not_executed_is_not_run_by_a_second_delivery(
    store: tl.Store, world: World
) -> None:
    """A turn of a lookup and a ticket; the ticket's intent cannot be written, so the model is
    told it was not executed, and the session goes on. A queue then delivers the turn's message
    again (``run_tool_uses`` on it, the store healthy): the ticket is answered as the model was
    told, not opened — else the model, retrying it under a new id, would open it twice."""
    second = ToolUse("create_ticket", {"title": "Second"}, id="toolu_second")

    @tl.tool(effect="read_only")
    def lookup(title: str) -> str:
        """Look a ticket up."""
        return f"{title}: none"

    tools = [*world.toolset(), lookup]

    def second_intent(ops: Sequence[Op]) -> bool:
        return any(
            isinstance(op, InsertEffect)
            and op.record.status is Status.STARTED
            and op.record.tool_use_id == "toolu_second"
            for op in ops
        )

    spied, _ = spy_store(store, fail_when=second_intent)
    turn = Reply(tool_uses=[ToolUse("lookup", {"title": "Second"}), second])
    with ScriptedModel([turn, Reply(text="done")]) as m:
        agent = tl.Agent(client=m.client(), model="x", tools=tools, store=spied)
        run = agent.run(session="s", prompt="go")
    assert run.status is tl.RunStatus.COMPLETED
    told = run.messages[2]["content"]
    assert told[1]["is_error"] is True and told[1]["content"].startswith("not executed: ")
    assert world.tickets() == []
    delivered = store.messages("s")[1]
    again = tl.run_tool_uses(delivered.content, tools, ledger=store.ledger("s"))
    assert [r["content"] for r in again] == [r["content"] for r in told]
    assert world.tickets() == [] and world.executions() == [], "nothing ran again"


def test_a_checkpoint_never_reports_an_outcome_still_being_written(
    store: tl.Store, world: World
) -> None:
    """A turn of two calls: the ticket is opened, then its outcome is written before the
    read-only lookup runs — and that write fails (the store refuses it for as long as the test
    says). The lookup's record and checkpoint B could go through; but checkpoint B would tell
    the model a success the ledger lacks, for good if this process died now. So it waits: the
    run stops, the transcript still ends with the model's calls, verify finds nothing, and once
    the outcome lands the next run answers the ticket from the ledger."""
    spied, spy = spy_store(store, fail_when=writes_status(Status.SUCCEEDED))

    @tl.tool(effect="read_only")
    def lookup(title: str) -> str:
        """Look a ticket up."""
        return f"{title}: open"

    tools = [*world.toolset(), lookup]
    alerts: list[tl.LedgerWriteError] = []
    turn = Reply(tool_uses=[TICKET, ToolUse("lookup", {"title": "Outage"})])
    with ScriptedModel([turn, Reply(text="done")]) as m:
        agent = tl.Agent(
            client=m.client(), model="x", tools=tools, store=spied, on_alert=alerts.append
        )
        with pytest.raises(tl.StoreError, match="checkpoint that would report it"):
            agent.run(session="s", prompt="go")
        (alert,) = alerts
        assert alert.tool == "create_ticket"
        last = store.messages("s")[-1]
        assert last.role == "assistant"  # checkpoint B did not land
        assert [p for p in verify(store) if p.severity is tl.Severity.ERROR] == []
        spy.fail_when = None  # the store takes writes again: this process's writer lands it
        deadline = time.time() + 10
        while store.ledger("s").get(alert.tool_use_id).status is Status.STARTED:  # type: ignore[union-attr]
            assert time.time() < deadline, "the outcome was never written"
            time.sleep(0.05)
        run = agent.run(session="s")
    assert run.status is tl.RunStatus.COMPLETED
    assert len(world.tickets()) == 1 and len(world.executions()) == 1
    assert verify(store) == []


def test_queued_approval_stops_then_proceeds(store: tl.Store, world: World) -> None:
    @tl.tool(high_impact=True)
    def wire(amount: int) -> str:
        """Wire money."""
        world.log_execution(
            "wire", tl.ToolContext(session_id="s", tool_use_id="-", idempotency_key="-")
        )
        return "wired"

    script = [Reply(tool_uses=[ToolUse("wire", {"amount": 5})]), Reply(text="done")]
    with ScriptedModel(script) as m:
        agent = tl.Agent(
            client=m.client(), model="x", tools=[wire], store=store, approve=tl.approvals.queue
        )
        run = agent.run(session="s", prompt="pay")
        assert run.status is tl.RunStatus.AWAITING_APPROVAL
        assert len(m.requests) == 1, "nothing was sent to the model while it waits"
        (request,) = tl.approvals.pending(store)
        for verb in ("approve", "deny"):
            command = shlex.join(["toolledger", "--store", store.url, verb, "s"])
            # Bound to the question asked: a first run, not the re-run of a call in doubt.
            assert f"`{command} {request.tool_use_id} --in-doubt=no`" in (run.reason or "")
        assert (request.tool, request.input, request.in_doubt) == ("wire", {"amount": 5}, False)
        assert agent.run(session="s").status is tl.RunStatus.AWAITING_APPROVAL
        tl.approvals.decide(store, "s", request.tool_use_id, approved=True, by="ana")
        run = agent.run(session="s")
    assert run.status is tl.RunStatus.COMPLETED
    assert len(world.executions("wire")) == 1
    record = store.ledger("s").get(request.tool_use_id)
    assert record is not None and record.approved_by == "ana"
    (used,) = store.backend.read_approvals("s")
    assert used.status is tl.ApprovalStatus.USED and used.decided_by == "ana"
    with pytest.raises(tl.NotPendingError, match="has been used"):  # decided and used up
        tl.approvals.decide(store, "s", request.tool_use_id, approved=False, by="bo")
    with pytest.raises(tl.NotPendingError):  # no request at all
        tl.approvals.decide(store, "s", "toolu_nothing", approved=True, by="bo")
    with pytest.raises(tl.NotInDoubtError, match="is succeeded"):  # it has its outcome
        store.ledger("s").resolve(request.tool_use_id, happened=False)
    (still,) = store.backend.read_approvals("s")
    assert still == used, "a refused decision changes nothing"


def test_the_approval_queue_outside_a_ledger_is_a_configuration_error() -> None:
    request = tl.ApprovalRequest(
        session_id="s", tool_use_id="toolu_1", tool="wire", input={}, in_doubt=False, reason="r"
    )
    with pytest.raises(tl.ConfigurationError, match="needs the request's ledger"):
        tl.approvals.queue(request)


def test_queued_denial_is_told_to_the_model(store: tl.Store, world: World) -> None:
    @tl.tool(high_impact=True)
    def wire(amount: int) -> str:
        raise AssertionError("must not run")

    script = [Reply(tool_uses=[ToolUse("wire", {"amount": 5})]), Reply(text="ok, not paid")]
    with ScriptedModel(script) as m:
        agent = tl.Agent(
            client=m.client(), model="x", tools=[wire], store=store, approve=tl.approvals.queue
        )
        agent.run(session="s", prompt="pay")
        (request,) = tl.approvals.pending(store)
        tl.approvals.decide(store, "s", request.tool_use_id, approved=False, by="ana")
        run = agent.run(session="s")
        (result,) = m.requests[-1]["messages"][-1]["content"]
    assert run.status is tl.RunStatus.COMPLETED
    assert result["is_error"] is True and "declined by ana" in result["content"]


def test_an_approval_for_other_input_is_not_honoured(store: tl.Store) -> None:
    """An approval is bound to (tool_use_id, tool, input hash)."""
    request = tl.ApprovalRequest(
        session_id="s",
        tool_use_id="t1",
        tool="wire",
        input={"amount": 5},
        in_doubt=False,
        reason="r",
        input_hash="sha256:five",
        ledger=store.ledger("s"),
    )
    assert tl.approvals.queue(request).pending
    tl.approvals.decide(store, "s", "t1", approved=True, by="ana")
    changed = tl.ApprovalRequest(
        session_id="s",
        tool_use_id="t1",
        tool="wire",
        input={"amount": 5000},
        in_doubt=False,
        reason="r",
        input_hash="sha256:five-thousand",
        ledger=store.ledger("s"),
    )
    assert tl.approvals.queue(changed).pending, "asked afresh, not approved"
    (pending,) = tl.approvals.pending(store)
    assert pending.input == {"amount": 5000}
    tl.approvals.decide(store, "s", "t1", approved=True, by="ana")
    decision = tl.approvals.queue(changed)
    assert decision.approved and decision.by == "ana"
    assert decision.approval is not None, "the runner uses it up together with the intent"


def test_an_approval_is_used_up_with_the_intent_and_only_once(store: tl.Store) -> None:
    runs: list[int] = []

    @tl.tool(effect="non_idempotent", high_impact=True)
    def wire(amount: int) -> str:
        runs.append(amount)
        raise tl.OutcomeUnknown("the bank did not answer")

    block = {"type": "tool_use", "id": "t1", "name": "wire", "input": {"amount": 5}}
    ledger = store.ledger("s")
    (first,) = tl.run_tool_uses([block], [wire], ledger=ledger, approve=tl.approvals.queue)
    assert "awaiting approval" in first["content"] and runs == []
    tl.approvals.decide(store, "s", "t1", approved=True, by="ana")
    (second,) = tl.run_tool_uses([block], [wire], ledger=ledger, approve=tl.approvals.queue)
    assert runs == [5] and "may already have happened" in second["content"]
    (used,) = store.backend.read_approvals("s")
    assert used.status is tl.ApprovalStatus.USED and used.used_at is not None
    record = ledger.get("t1")
    assert record is not None and record.approved_by == "ana"
    # In doubt now: running it again is another question, asked afresh — never the used answer.
    (third,) = tl.run_tool_uses([block], [wire], ledger=ledger, approve=tl.approvals.queue)
    assert "in doubt, awaiting a person" in third["content"] and runs == [5]
    (asked,) = tl.approvals.pending(store)
    assert asked.in_doubt


def test_terminal_approver_shows_the_call_and_reads_the_answer(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = iter(["y", "n"])
    monkeypatch.setattr("builtins.input", lambda *a: next(answers))
    request = tl.ApprovalRequest(
        session_id="s",
        tool_use_id="t1",
        tool="send_email",
        input={"to": "ceo@example.com"},
        in_doubt=True,
        reason="it may already have happened",
    )
    assert tl.approvals.terminal(request).approved is True
    assert tl.approvals.terminal(request).approved is False
    shown = capsys.readouterr().err
    assert "send_email" in shown and "ceo@example.com" in shown and "IN DOUBT" in shown


def test_verify_finds_a_transcript_that_lies(store: tl.Store, world: World) -> None:
    with ScriptedModel([Reply(tool_uses=[TICKET]), Reply(text="done")]) as m:
        agent_for(m, store, world).run(session="s", prompt="go")
    assert verify(store) == []
    state = store.backend.read_session("s")
    assert state is not None
    forged = [{"type": "tool_result", "tool_use_id": "toolu_forged", "content": "ok"}]
    from dataclasses import replace

    from toolledger.records import StoredMessage

    store.backend.apply(
        "s",
        [
            AppendMessages(
                (StoredMessage(seq=state.messages, role="user", content=forged, created_at=0.0),)
            ),
            PutSession(
                replace(state, version=state.version + 1, messages=state.messages + 1),
                state.version,
            ),
        ],
    )
    found = [p.message for p in verify(store)]
    assert any("unexpected `tool_use_id`" in p for p in found)
    assert any("toolu_forged succeeded but the ledger has no record" in p for p in found)


def test_the_terminal_approver_without_a_terminal_declines(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def closed(*args: Any) -> str:
        raise EOFError

    monkeypatch.setattr("builtins.input", closed)
    request = tl.ApprovalRequest(
        session_id="s",
        tool_use_id="t1",
        tool="wire[/]",  # markup in a name prints as it is
        input={"amount": 5},
        in_doubt=False,
        reason="r",
    )
    decision = tl.approvals.terminal(request)
    assert decision == tl.Decision(approved=False, by="terminal: no terminal to ask on")
    assert "no terminal" in capsys.readouterr().err


def test_an_empty_answer_is_sent_back_with_content(store: tl.Store, world: World) -> None:
    """The model may end its turn with no content at all (``end_turn``, ``content: []``), or with
    an empty text block. It is stored as it came; the Messages API refuses it back in a later
    request (only a final assistant message may be empty), so the request carries it as a
    placeholder text and the conversation goes on."""
    with ScriptedModel([Reply(tool_uses=[TICKET]), Reply(), Reply(text="Ticket open.")]) as m:
        agent = agent_for(m, store, world)
        first = agent.run(session="s", prompt="Outage!")
        assert first.status is tl.RunStatus.COMPLETED and first.final_text == ""
        assert first.messages[-1] == {"role": "assistant", "content": []}, "stored as it came"
        run = agent.run(session="s", prompt="status?")
    assert run.status is tl.RunStatus.COMPLETED and run.final_text == "Ticket open."
    assert m.rejected == []
    said = m.requests[-1]["messages"][3]
    assert said == {"role": "assistant", "content": [{"type": "text", "text": "(no content)"}]}
    assert len(world.tickets()) == 1


@pytest.mark.parametrize(
    "content",
    [[], "", [{"type": "text", "text": ""}], [{"type": "text", "text": ""}, TICKET_BLOCK]],
    ids=["no-blocks", "empty-string", "empty-text", "empty-text-then-call"],
)
def test_an_empty_turn_or_text_block_is_never_sent_as_it_is(content: Any) -> None:
    from toolledger.adapters.anthropic import merged, pairing_errors
    from toolledger.records import StoredMessage

    turns = [("user", "hi"), ("assistant", content), ("user", "and?")]
    if content and content[-1] is TICKET_BLOCK:
        turns[2] = ("user", [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}])
    messages = [
        StoredMessage(seq=i, role=r, content=c, created_at=0.0) for i, (r, c) in enumerate(turns)
    ]
    assert pairing_errors([{"role": r, "content": c} for r, c in turns]) != [], "the API refuses it"
    sent = merged(messages)
    assert pairing_errors(sent) == []
    blocks = sent[1]["content"]
    assert blocks == (
        [TICKET_BLOCK]
        if content and content[-1] is TICKET_BLOCK
        else [{"type": "text", "text": "(no content)"}]
    )


def test_a_model_api_error_whose_message_holds_a_nul_fails_the_session_on_every_store(
    store: tl.Store, world: World
) -> None:
    """The session's reason is the API error's message, which a proxy may fill with anything:
    a NUL in it (which PostgreSQL's text refuses) is kept as ``\\x00``, and the session is
    ``failed``, not left ``running`` with its failure unrecorded."""
    import anthropic
    import httpx

    class Failing:
        def create(self, **kwargs: Any) -> Any:
            request = httpx.Request("POST", "https://api.example/v1/messages")
            raise anthropic.APIConnectionError(message="bad gateway\x00garbage", request=request)

    class Client:
        messages = Failing()

    agent = tl.Agent(client=Client(), model="claude-test", tools=world.toolset(), store=store)
    with pytest.raises(tl.ModelCallError) as info:
        agent.run(session="s", prompt="hi")
    assert info.value.session_id == "s"
    state = store.session("s")
    assert state is not None and state.status is tl.RunStatus.FAILED
    assert state.reason == "model API error: bad gateway\\x00garbage"


@pytest.mark.parametrize("api", ["anthropic", "openai-chat", "openai-responses"])
@pytest.mark.parametrize("title", ["Outage", "Second outage"], ids=["same-input", "other-input"])
def test_a_reply_that_reuses_an_earlier_call_id_is_neither_stored_nor_run(
    store: tl.Store, world: World, api: str, title: str
) -> None:
    """A server that mints call ids per position (``call_0`` in every reply: some
    OpenAI-compatible servers) asks for a second ticket under the first call's id. Taken as it
    is, the ledger would answer it with the first ticket's result (the same input: the ticket
    never opened, the model told it did), or refuse it on every resume (another input: the
    session stuck on a turn it can never run). The reply is refused: nothing of it is stored or
    run, the session fails saying why, and a reply with a fresh id goes on."""
    from toolledger.testing.scripted_openai import ScriptedOpenAI

    def script(second_id: str) -> list[Reply]:
        return [
            Reply(tool_uses=[ToolUse("create_ticket", {"title": "Outage"}, id="call_0")]),
            Reply(tool_uses=[ToolUse("create_ticket", {"title": title}, id=second_id)]),
            Reply(text="Both tickets are open."),
        ]

    def agent(server: ScriptedModel | ScriptedOpenAI) -> tl.Agent:
        client = server.client()
        return tl.Agent(
            client=tl.OpenAIResponses(client) if api == "openai-responses" else client,
            model="m",
            tools=world.toolset(),
            store=store,
        )

    server_of = ScriptedModel if api == "anthropic" else ScriptedOpenAI
    with (
        server_of(script("call_0")) as m,
        pytest.raises(tl.MalformedContentError, match="call_0") as info,
    ):
        agent(m).run(session="s", prompt="two tickets")
    assert info.value.tool_use_id == "call_0"
    assert [t["title"] for t in world.tickets()] == ["Outage"]
    assert len(store.messages("s")) == 3, "the prompt, the first call and its result"
    state = store.session("s")
    assert state is not None and state.status is tl.RunStatus.FAILED, state
    assert "call_0" in (state.reason or ""), state.reason
    with server_of(script("call_1")) as m:
        run = agent(m).run(session="s", prompt="two tickets")
    assert run.status is tl.RunStatus.COMPLETED
    assert sorted(t["title"] for t in world.tickets()) == sorted(["Outage", title])
    # A later run's reply reusing an id of an earlier run's call (the transcript read from the
    # store), and the same run again once refused.
    third = Reply(tool_uses=[ToolUse("create_ticket", {"title": "Third"}, id="call_0")])
    with server_of([*script("call_1"), third]) as m:
        again = agent(m)
        for _ in range(2):
            with pytest.raises(tl.MalformedContentError, match="call_0"):
                again.run(session="s", prompt="a third one")
    assert len(world.tickets()) == 2
