"""``Store.history``: every turn of a session, read from its transcript and its ledger, on every
backend — and a call left in doubt by a real ``SIGKILL`` shows as in doubt."""

from __future__ import annotations

from pathlib import Path

import pytest

import toolledger as tl
from toolledger.codec import input_hash
from toolledger.ops import AppendMessages, InsertEffect
from toolledger.records import EffectRecord, Status, StoredMessage
from toolledger.testing import Counter
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse
from toolledger.testing.world import AgentSpec, World, run_agent

from .conftest import url_for

FOUR_TURNS = [
    Reply(text="Looking it up.", tool_uses=[ToolUse("lookup", {"q": "outage"})]),
    Reply(
        tool_uses=[
            ToolUse("create_ticket", {"title": "Outage"}),
            ToolUse("flaky", {"n": 1}),
        ]
    ),
    Reply(text="Refunding.", tool_uses=[ToolUse("refund", {"amount": 10})]),
    Reply(text="Done: ticket opened, refund declined."),
]


def four_tools(calls: Counter) -> tl.ToolSet:
    @tl.tool(effect="read_only")
    def lookup(q: str) -> str:
        """Look something up."""
        calls.hit("lookup")
        return f"found {q}"

    @tl.tool(effect="non_idempotent")
    def create_ticket(title: str) -> dict[str, str]:
        """Open a ticket."""
        calls.hit("create_ticket")
        return {"ticket": "T-1", "title": title}

    @tl.tool(effect="idempotent")
    def flaky(n: int) -> str:
        """Fail."""
        calls.hit("flaky")
        raise RuntimeError("backend down")

    @tl.tool(effect="non_idempotent", high_impact=True)
    def refund(amount: int) -> str:
        """Refund."""
        calls.hit("refund")
        return "refunded"

    return tl.ToolSet([lookup, create_ticket, flaky, refund])


def decline(request: tl.ApprovalRequest) -> bool:
    """The approver of the four-turn session: it declines the refund."""
    return False


def run_four_turns(store: tl.Store, session: str, calls: Counter) -> tl.Run:
    tools = four_tools(calls)
    with ScriptedModel(FOUR_TURNS) as model:
        agent = tl.Agent(
            client=model.client(),
            model="claude-test",
            tools=tools,
            store=store,
            approve=decline,
        )
        return agent.run(session=session, prompt="A customer reports an outage.")


def test_history_of_a_four_turn_session(store: tl.Store) -> None:
    calls = Counter()
    run = run_four_turns(store, "s-1", calls)
    assert run.status is tl.RunStatus.COMPLETED
    turns = store.history("s-1", tools=four_tools(Counter()))

    assert [t.number for t in turns] == [1, 2, 3, 4]
    assert [t.text for t in turns] == [
        "Looking it up.",
        "",
        "Refunding.",
        "Done: ticket opened, refund declined.",
    ]
    assistant = [m for m in store.messages("s-1") if m.role == "assistant"]
    assert [t.at for t in turns] == [m.created_at for m in assistant]
    assert [t.seq for t in turns] == [m.seq for m in assistant]
    got = [[(c.tool, c.input, c.effect, c.disposition) for c in t.calls] for t in turns]
    assert got == [
        [("lookup", {"q": "outage"}, tl.EffectClass.READ_ONLY, tl.CallState.SUCCEEDED)],
        [
            (
                "create_ticket",
                {"title": "Outage"},
                tl.EffectClass.NON_IDEMPOTENT,
                tl.CallState.SUCCEEDED,
            ),
            ("flaky", {"n": 1}, tl.EffectClass.IDEMPOTENT, tl.CallState.FAILED),
        ],
        [("refund", {"amount": 10}, tl.EffectClass.NON_IDEMPOTENT, tl.CallState.DECLINED)],
        [],
    ]
    # the ids are the transcript's and the ledger's, whole
    ids = [c.tool_use_id for t in turns for c in t.calls]
    records = {r.tool_use_id: r for r in store.ledger("s-1").records()}
    (flaky,) = turns[1].calls[1:]
    assert set(ids) == {*records, flaky.tool_use_id}
    for t in turns:
        for c in t.calls:
            assert c.record == records.get(c.tool_use_id)
    # a safe tool that raised needs no record: its failure is read from the transcript
    assert flaky.record is None and flaky.result is not None and "backend down" in flaky.result
    assert [c.result for c in turns[0].calls] == ["found outage"]
    assert calls["lookup"] == 1 and calls["create_ticket"] == 1 and calls["flaky"] == 1
    assert calls["refund"] == 0, "declined: it never ran"

    # without the tools, the effect class is unknown; the rest is the same
    bare = store.history("s-1")
    assert [c.effect for t in bare for c in t.calls] == [None] * 4
    assert [c.disposition for t in bare for c in t.calls] == [
        c.disposition for t in turns for c in t.calls
    ]
    assert store.history("no-such-session") == []


def test_a_started_call_is_in_progress_while_its_attempt_may_run(store: tl.Store) -> None:
    """A ``started`` record judged running (no owner, touched just now: a 0.1 intent counts as
    running until its default deadline) is in progress, never in doubt; a call with no record
    is not recorded."""
    content = [
        {"type": "tool_use", "id": "toolu_live", "name": "send", "input": {"to": "a@b"}},
        {"type": "tool_use", "id": "toolu_none", "name": "send", "input": {"to": "c@d"}},
    ]
    now = store.now()
    record = EffectRecord(
        session_id="live",
        tool_use_id="toolu_live",
        tool="send",
        input_hash=input_hash({"to": "a@b"}),
        status=Status.STARTED,
        attempt=1,
        created_at=now,
        updated_at=now,
    )
    messages = (
        StoredMessage(seq=0, role="user", content="send it", created_at=now),
        StoredMessage(seq=1, role="assistant", content=content, created_at=now),
    )
    store.backend.apply("live", [AppendMessages(messages), InsertEffect(record)])
    (turn,) = store.history("live")
    live, none = turn.calls
    assert live.disposition is tl.CallState.IN_PROGRESS and live.why
    assert live.record is not None and live.record.status is Status.STARTED
    assert none.disposition is tl.CallState.NOT_RECORDED and none.record is None


@pytest.mark.parametrize("kind", ["sqlite", "json", "postgres"])
def test_a_call_left_in_doubt_by_a_real_kill(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = (
        str(request.getfixturevalue("postgres_store_url"))
        if kind == "postgres"
        else url_for(kind, tmp_path)
    )
    world = World(tmp_path / "world")
    script = [Reply(tool_uses=[ToolUse("create_ticket", {"title": "Outage"})]), Reply(text="ok")]
    with ScriptedModel(script) as model:
        spec = AgentSpec(store_url=url, base_url=model.url, world=str(world.path), session="k")
        assert run_agent(spec, crash_at="before_record")[0] == -9
    assert len(world.executions()) == 1, "the tool ran; its outcome was never recorded"
    with tl.open_store(url) as store:
        (turn,) = store.history("k", tools=world.toolset())
        (call,) = turn.calls
        (doubt,) = store.in_doubt()
    assert call.tool_use_id == doubt.tool_use_id
    assert call.disposition is tl.CallState.IN_DOUBT
    assert call.effect is tl.EffectClass.NON_IDEMPOTENT
    assert call.why


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_history_reads_openai_transcripts(api: str) -> None:
    """The same turns, whatever the API the session spoke."""
    from toolledger.testing.scripted_openai import ScriptedOpenAI

    calls = Counter()
    with ScriptedOpenAI(FOUR_TURNS) as model, tl.open_store("memory://") as store:
        client = model.client() if api == "chat" else tl.OpenAIResponses(model.client())
        agent = tl.Agent(
            client=client, model="gpt-test", tools=four_tools(calls), store=store, approve=decline
        )
        assert agent.run(session="s", prompt="go").status is tl.RunStatus.COMPLETED
        turns = store.history("s")
        records = {r.tool_use_id for r in store.ledger("s").records()}
    assert [t.text for t in turns] == [r.text for r in FOUR_TURNS]
    assert [[(c.tool, c.input, c.disposition.value) for c in t.calls] for t in turns] == [
        [("lookup", {"q": "outage"}, "succeeded")],
        [("create_ticket", {"title": "Outage"}, "succeeded"), ("flaky", {"n": 1}, "failed")],
        [("refund", {"amount": 10}, "declined")],
        [],
    ]
    assert {c.tool_use_id for t in turns for c in t.calls} >= records and len(records) == 3
