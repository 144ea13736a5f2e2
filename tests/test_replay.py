"""``ScriptedModel.from_session``: a recorded session replayed offline reproduces its transcript,
tool_use ids included, and its tools run as often as they did."""

from __future__ import annotations

from typing import Any

import pytest

import toolledger as tl
from toolledger.ops import AppendMessages
from toolledger.records import StoredMessage
from toolledger.testing import Counter
from toolledger.testing.scripted import ScriptedModel

from .test_history import decline, four_tools, run_four_turns


def transcript(store: tl.Store, session: str) -> list[tuple[int, str, Any]]:
    return [(m.seq, m.role, m.content) for m in store.messages(session)]


def test_a_replayed_session_reproduces_its_transcript(store: tl.Store) -> None:
    recorded = Counter()
    assert run_four_turns(store, "s-1", recorded).status is tl.RunStatus.COMPLETED

    replayed = Counter()
    with ScriptedModel.from_session(store, "s-1") as model, tl.open_store("memory://") as fresh:
        assert len(model.script) == 4
        agent = tl.Agent(
            client=model.client(),
            model="claude-test",
            tools=four_tools(replayed),
            store=fresh,
            approve=decline,
        )
        for session in ("s-1", "another"):
            run = agent.run(session=session, prompt="A customer reports an outage.")
            assert run.status is tl.RunStatus.COMPLETED
            assert transcript(fresh, session) == transcript(store, "s-1")
            assert [
                (c.tool_use_id, c.disposition) for t in fresh.history(session) for c in t.calls
            ] == [(c.tool_use_id, c.disposition) for t in store.history("s-1") for c in t.calls]
        assert model.rejected == []
    ids = [c.tool_use_id for t in store.history("s-1") for c in t.calls]
    assert len(ids) == 4 and len(set(ids)) == 4
    # each replay ran every tool the recording ran, once: a new session's ledger is empty
    names = ("lookup", "create_ticket", "flaky", "refund")
    assert [recorded[n] for n in names] == [1, 1, 1, 0]
    assert [replayed[n] for n in names] == [2, 2, 2, 0]


def test_what_cannot_be_replayed_is_refused(store: tl.Store) -> None:
    with pytest.raises(tl.ConfigurationError, match="no model turn"):
        ScriptedModel.from_session(store, "nothing-here")
    chat = {"role": "assistant", "content": "hi", "tool_calls": []}
    thinking = [{"type": "thinking", "thinking": "hm", "signature": "x"}]
    for session, content, why in (
        ("chat", chat, "openai-chat transcript"),
        ("thinking", thinking, "'thinking' block"),
    ):
        messages = (
            StoredMessage(seq=0, role="user", content="go", created_at=1.0),
            StoredMessage(seq=1, role="assistant", content=content, created_at=2.0),
        )
        store.backend.apply(session, [AppendMessages(messages)])
        with pytest.raises(tl.ConfigurationError, match=why):
            ScriptedModel.from_session(store, session)


def test_a_replayed_chat_completions_session_reproduces_its_transcript(store: tl.Store) -> None:
    from toolledger.testing.scripted_openai import ScriptedOpenAI

    from .test_history import FOUR_TURNS

    def run(model: ScriptedOpenAI, on: tl.Store, calls: Counter) -> None:
        agent = tl.Agent(
            client=model.client(),
            model="gpt-test",
            tools=four_tools(calls),
            store=on,
            approve=decline,
        )
        assert agent.run(session="s", prompt="go").status is tl.RunStatus.COMPLETED

    recorded, replayed = Counter(), Counter()
    with ScriptedOpenAI(FOUR_TURNS) as model:
        run(model, store, recorded)
    with ScriptedOpenAI.from_session(store, "s") as model, tl.open_store("memory://") as fresh:
        run(model, fresh, replayed)
        assert transcript(fresh, "s") == transcript(store, "s")
        assert model.rejected == []
    names = ("lookup", "create_ticket", "flaky", "refund")
    assert [recorded[n] for n in names] == [replayed[n] for n in names] == [1, 1, 1, 0]


def test_a_responses_session_is_not_replayed() -> None:
    from toolledger.testing.scripted_openai import ScriptedOpenAI

    from .test_history import FOUR_TURNS

    with ScriptedOpenAI(FOUR_TURNS) as model, tl.open_store("memory://") as store:
        agent = tl.Agent(
            client=tl.OpenAIResponses(model.client()),
            model="gpt-test",
            tools=four_tools(Counter()),
            store=store,
            approve=decline,
        )
        agent.run(session="s", prompt="go")
        with pytest.raises(tl.ConfigurationError, match="openai-responses transcript"):
            ScriptedOpenAI.from_session(store, "s")
        with pytest.raises(tl.ConfigurationError, match="openai-responses transcript"):
            ScriptedModel.from_session(store, "s")


def test_a_branched_session_is_not_replayed_as_if_it_were_whole(store: tl.Store) -> None:
    """A fork's transcript holds a note toolledger wrote and not the turns it left behind, which
    a replay against the model's answers cannot reproduce: replaying it used to give another
    transcript without a word. It is refused, saying why and what to replay instead — or, asked
    for, replayed as the model's answers alone."""
    run_four_turns(store, "s-1", Counter())
    fork = tl.fork(store, "s-1", at_turn=1, new_session="s-1-fork")
    tl.rewind(store, "s-1", to_turn=2)
    for session in (fork, "s-1"):
        with pytest.raises(tl.ConfigurationError, match="branch") as refused:
            ScriptedModel.from_session(store, session)
        assert "would not be the same" in str(refused.value)
    answers = ScriptedModel.from_session(store, fork, branched=True)
    assert len(answers.script) == 1  # the one model turn the fork holds
