"""What an ``Agent`` keeps of a transcript: the request's messages extended turn by turn, and
the sessions it ran kept for their next run.

Whatever is kept, the model is sent exactly what a request built from the whole stored transcript
would hold — for every provider, across runs of other agents, a stop after a turn's results (two
user messages in a row), a crash mid-turn and its resume — and nothing handed to the API or the
caller changes afterwards.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import pytest

import toolledger as tl
from toolledger.adapters import Provider, provider_for
from toolledger.adapters.openai import OpenAIResponses
from toolledger.ops import InsertEffect
from toolledger.records import SessionState, Status, StoredMessage
from toolledger.stores.contract import Backend
from toolledger.testing.conformance import make_record

_ids = itertools.count(1)


class Crash(BaseException):
    """The process dying mid-tool (nothing in the loop catches it)."""


class Recorder:
    """A model API's ``create``: answers from ``script`` ("call": one call of ``note``; "text":
    a final answer), keeps what it was sent and a deep copy of it taken at the call."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.script: list[str] = []
        self.sent: list[dict[str, Any]] = []
        self.snapshots: list[dict[str, Any]] = []

    def create(self, **kwargs: Any) -> dict[str, Any]:
        self.sent.append(kwargs)
        self.snapshots.append(copy.deepcopy(kwargs))
        step = self.script.pop(0)
        call_id = f"call_{next(_ids)}"
        arguments = {"n": len(self.sent)}
        if self.kind == "anthropic":
            content: list[dict[str, Any]] = [{"type": "text", "text": f"turn {len(self.sent)}"}]
            if step == "call":
                content.append(
                    {"type": "tool_use", "id": call_id, "name": "note", "input": arguments}
                )
            usage = {"input_tokens": 3, "output_tokens": 2}
            return {"content": content, "stop_reason": "end_turn", "usage": usage}
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": "ok"}
            if step == "call":
                function = {"name": "note", "arguments": json.dumps(arguments)}
                message["tool_calls"] = [{"id": call_id, "type": "function", "function": function}]
            return {
                "choices": [{"message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2},
            }
        text = {"type": "output_text", "text": "ok"}
        output: list[dict[str, Any]] = [{"type": "message", "role": "assistant", "content": [text]}]
        if step == "call":
            output.append(
                {
                    "type": "function_call",
                    "call_id": call_id,
                    "name": "note",
                    "arguments": json.dumps(arguments),
                }
            )
        return {"output": output, "status": "completed", "usage": {"input_tokens": 3}}


class _Resource:
    def __init__(self, create: Callable[..., Any]) -> None:
        self.create = create


class _Chat:
    def __init__(self, recorder: Recorder) -> None:
        self.completions = _Resource(recorder.create)


def client_for(kind: str, recorder: Recorder) -> Any:
    if kind == "anthropic":
        return type("Client", (), {"messages": _Resource(recorder.create)})()
    if kind == "chat":
        return type("Client", (), {"chat": _Chat(recorder)})()
    return OpenAIResponses(type("Client", (), {"responses": _Resource(recorder.create)})())


PROVIDERS = ["anthropic", "chat", "responses"]
crashing: list[bool] = [False]


@tl.tool(effect="idempotent")
def note(n: int) -> str:
    """Note a number."""
    if crashing[0]:
        crashing[0] = False
        raise Crash
    return f"noted {n}"


class Agents:
    """Agents of one provider on one store, sharing one recorder; ``run`` scripts the replies."""

    def __init__(self, kind: str, store: tl.Store) -> None:
        self.recorder = Recorder(kind)
        self.client = client_for(kind, self.recorder)
        self.store = store

    def agent(self, **kwargs: Any) -> tl.Agent:
        return tl.Agent(
            client=self.client,
            model="m",
            tools=[note],
            store=self.store,
            system="Be brief.",
            **kwargs,
        )

    def run(self, agent: tl.Agent, script: Sequence[str], prompt: str | None) -> tl.Run:
        self.recorder.script = list(script)
        run = agent.run(session="s", prompt=prompt)
        assert self.recorder.script == []
        return run

    def expected(self, provider: Provider) -> list[dict[str, Any]]:
        """Each request as a full rebuild of the stored transcript before its answer."""
        stored = self.store.backend.read_messages("s")
        return [
            provider.request(
                model="m",
                max_tokens=4096,
                system="Be brief.",
                tools=tl.ToolSet([note]),
                messages=stored[:i],
            )
            for i, m in enumerate(stored)
            if m.role == "assistant"
        ]


@pytest.mark.parametrize("kind", PROVIDERS)
def test_every_request_is_the_whole_transcript_rebuilt(kind: str, store: tl.Store) -> None:
    agents = Agents(kind, store)
    one, other = agents.agent(), agents.agent()
    agents.run(one, ["call", "call", "text"], "first")
    agents.run(one, ["call", "text"], "second")  # its own last run, kept
    agents.run(other, ["call", "text"], "third")  # another agent moves the session on
    stopped = agents.run(agents.agent(max_turns=1), ["call"], "fourth")
    assert stopped.status is tl.RunStatus.MAX_TURNS  # ends with the results: two user messages
    agents.run(one, ["text"], "fifth")  # kept, then read on from where it was kept
    crashing[0] = True
    with pytest.raises(Crash):
        agents.run(one, ["call"], "sixth")
    agents.run(one, ["text"], None)  # the crashed turn resumed by the agent it crashed in
    crashing[0] = True
    with pytest.raises(Crash):
        agents.run(other, ["call"], "seventh")
    last = agents.run(agents.agent(), ["text"], None)  # and by a new one

    provider = one.provider
    assert agents.recorder.snapshots == agents.expected(provider)
    assert agents.recorder.sent == agents.recorder.snapshots, "nothing sent changed afterwards"
    if kind == "anthropic":  # the results of the stopped turn and the next prompt, merged
        merged = [m for r in agents.recorder.sent for m in r["messages"] if _results_then_text(m)]
        assert merged
    assert last.messages == provider.transcript(store.backend.read_messages("s"))


def _results_then_text(message: dict[str, Any]) -> bool:
    content = message["content"]
    if message["role"] != "user" or isinstance(content, str):
        return False
    kinds = [b.get("type") for b in content]
    return "tool_result" in kinds and kinds[-1] == "text"


@pytest.mark.parametrize("kind", PROVIDERS)
def test_a_wire_extended_equals_the_wire_built_whole(kind: str) -> None:
    recorder = Recorder(kind)
    provider = provider_for(client_for(kind, recorder))
    call = recorder.create  # answers shaped by the provider itself
    messages: list[StoredMessage] = []

    def add(role: str, content: Any) -> None:
        messages.append(StoredMessage(seq=len(messages), role=role, content=content, created_at=1))

    for prompt in ("a", "b"):
        add(*provider.prompt_message(prompt))
        recorder.script = ["call"]
        turn = provider.read_response(call())
        add("assistant", turn.content)
        for role, content in provider.results_messages(
            [(c.tool_use_id, "done", False) for c in turn.calls]
        ):
            add(role, content)
    add(*provider.prompt_message("c"))  # after the results: one user turn for Anthropic
    whole = provider.wire(messages)
    for cut in range(len(messages) + 1):
        start = provider.wire(messages[:cut])
        before = copy.deepcopy(start)
        assert provider.wire(messages[cut:], start) == whole
        assert start == before, "the start is never changed"
        assert provider.wire(messages[cut:], tuple(start)) == whole


class ReadSpy:
    """A backend that notes where each transcript read began."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.since: list[int] = []

    def read_messages(self, session_id: str, since: int = 0) -> list[StoredMessage]:
        self.since.append(since)
        return self.inner.read_messages(session_id, since)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def spied(store: tl.Store, **kwargs: Any) -> tuple[tl.Store, ReadSpy]:
    spy = ReadSpy(store.backend)
    return tl.Store(spy, clock=store.clock, worker_id=store.worker_id, **kwargs), spy


def test_a_kept_session_is_read_from_where_it_was_kept(store: tl.Store) -> None:
    mine, spy = spied(store)
    agents = Agents("anthropic", mine)
    one = agents.agent()
    agents.run(one, ["call", "text"], "first")
    assert spy.since == [] or spy.since == [0] * len(spy.since)
    spy.since.clear()
    agents.run(one, ["text"], "second")
    assert spy.since == [], "unchanged since its last run: nothing read again"
    n = store.backend.read_session("s")
    assert n is not None
    agents.run(agents.agent(), ["call", "text"], "third")
    spy.since.clear()
    agents.run(one, ["text"], "fourth")
    assert spy.since == [n.messages - 1], "read on from its last kept message"
    assert agents.recorder.snapshots == agents.expected(one.provider)


def test_a_store_with_a_redact_hook_is_read_whole_every_run(store: tl.Store) -> None:
    mine, spy = spied(store, redact=lambda text: text.replace("secret", "[gone]"))
    agents = Agents("anthropic", mine)
    one = agents.agent()
    agents.run(one, ["text"], "a secret")
    agents.run(one, ["text"], "another")
    assert spy.since == [0]  # the second run: the first wrote a new session
    assert agents.recorder.sent[-1]["messages"][0] == {"role": "user", "content": "a [gone]"}


@pytest.mark.parametrize("kept", [True, False])
def test_a_stray_record_is_found_whether_the_session_is_kept_or_not(
    store: tl.Store, kept: bool
) -> None:
    agents = Agents("anthropic", store)
    one = agents.agent()
    agents.run(one, ["call", "text"], "first")
    store.apply("s", [InsertEffect(make_record("s", "toolu_stray", status=Status.SUCCEEDED))])
    sent = len(agents.recorder.sent)
    with pytest.raises(tl.CorruptLedgerError, match="toolu_stray"):
        agents.run(one if kept else agents.agent(), [], "second")
    assert len(agents.recorder.sent) == sent, "the model is not asked"


def test_run_messages_are_the_callers_own(store: tl.Store) -> None:
    agents = Agents("anthropic", store)
    one = agents.agent()
    run = agents.run(one, ["call", "text"], "first")
    for message in run.messages:
        if isinstance(message["content"], list):
            message["content"][0]["text"] = "changed"
            message["content"].append({"type": "text", "text": "added"})
        message["role"] = "system"
    agents.run(one, ["text"], "second")
    assert agents.recorder.snapshots == agents.expected(one.provider)


def test_run_messages_are_copied_when_first_read_and_show_that_run(
    store: tl.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose caller never reads ``messages`` copies no transcript; one that reads them
    later — after the session's next run — gets the transcript as that run left it, once."""
    from toolledger.agent import _state

    made: list[int] = []
    real = _state.copied

    def counting(value: Any) -> Any:
        made.append(len(value))
        return real(value)

    monkeypatch.setattr(_state, "copied", counting)
    agents = Agents("anthropic", store)
    one = agents.agent()
    first = agents.run(one, ["call", "text"], "first")
    second = agents.run(one, ["text"], "second")
    assert made == [], "nothing read, nothing copied"
    late = first.messages
    assert made == [4] and first.messages is late  # copied once, when first read
    assert [m["role"] for m in late] == ["user", "assistant", "user", "assistant"]
    assert [m["role"] for m in second.messages] == [*(m["role"] for m in late), "user", "assistant"]
    assert second.messages[: len(late)] == late and made == [4, 6]


def test_run_messages_copied_when_read_survive_pickle_asdict_and_replace(store: tl.Store) -> None:
    """``messages`` stays a field: a run not read yet pickles, deep-copies, turns into a dict
    and is replaced with its transcript, and ``Run(messages=...)`` still gives it."""
    agents = Agents("anthropic", store)
    run = agents.run(agents.agent(), ["call", "text"], "first")
    roles = ["user", "assistant", "user", "assistant"]
    assert [m["role"] for m in pickle.loads(pickle.dumps(run)).messages] == roles
    fresh = agents.run(agents.agent(), [], "first")  # the same session, nothing read yet
    assert [m["role"] for m in copy.deepcopy(fresh).messages] == roles
    assert [m["role"] for m in dataclasses.asdict(fresh)["messages"]] == roles
    moved = dataclasses.replace(
        agents.run(agents.agent(), [], "first"), status=tl.RunStatus.MAX_TURNS
    )
    assert [m["role"] for m in moved.messages] == roles
    given = tl.Run(
        session_id="s",
        status=tl.RunStatus.COMPLETED,
        reason=None,
        turns=0,
        usage=tl.Usage(),
        messages=[{"role": "user", "content": "hi"}],
    )
    assert given.messages == [{"role": "user", "content": "hi"}]


def _containers(value: Any, out: list[int]) -> list[int]:
    """The ids of every dict, list and tuple reachable from ``value``, each time it is reached."""
    if isinstance(value, dict | list | tuple):
        out.append(id(value))
        for item in value.values() if isinstance(value, dict) else value:
            _containers(item, out)
    return out


@pytest.mark.parametrize("kind", PROVIDERS)
def test_run_messages_share_no_container_with_what_the_agent_keeps(
    kind: str, store: tl.Store
) -> None:
    agents = Agents(kind, store)
    one = agents.agent()
    run = agents.run(one, ["call", "call", "text"], "first")
    handed = _containers(run.messages, [])
    assert len(handed) == len(set(handed)), "no container is reached twice in what is handed"
    kept = one._transcripts.get("s")
    assert kept is not None and kept.messages
    held = _containers([m.content for m in kept.messages], [])
    if kept.wire is not None:
        held = _containers(kept.wire.items, held)
    assert not set(handed) & set(held)
    assert json.loads(json.dumps(run.messages)) == run.messages


def test_a_copy_is_equal_and_made_of_new_containers() -> None:
    from collections import OrderedDict

    from toolledger.agent._transcripts import copied

    class Own:  # an object of a provider of one's own: shared, as any value that is no container
        pass

    own = Own()
    content = [
        {"type": "text", "text": "hi", "n": [1, 2.5, None, True]},
        ("a", {"b": []}),
        OrderedDict(c=[{"d": 1}]),
        own,
    ]
    copy_ = copied(content)
    assert copy_ == [*content[:1], ["a", {"b": []}], {"c": [{"d": 1}]}, own]
    assert type(copy_[1]) is list and type(copy_[2]) is dict, "plain JSON's own containers"
    assert not set(_containers(copy_, [])) & set(_containers(content, []))
    assert copy_[3] is own


def test_a_kept_transcript_is_used_only_for_the_session_it_continues() -> None:
    from toolledger.agent._transcripts import Kept, Transcripts

    def state(**kw: Any) -> SessionState:
        base: dict[str, Any] = {
            "session_id": "s",
            "status": tl.RunStatus.COMPLETED,
            "version": 4,
            "messages": 2,
            "created_at": 1.0,
            "updated_at": 2.0,
        }
        return SessionState(**{**base, **kw})

    messages = tuple(
        StoredMessage(seq=i, role=r, content="x", created_at=1) for i, r in enumerate("ua")
    )
    kept = Kept(state=state(), messages=messages, called=frozenset(), wire=None)
    assert Transcripts.reuse(kept, state()) == 2
    assert Transcripts.reuse(kept, state(version=6, messages=4)) == 1
    assert Transcripts.reuse(kept, state(version=6, messages=4, created_at=5.0)) is None
    assert Transcripts.reuse(kept, state(version=3, messages=2, updated_at=3.0)) is None
    assert Transcripts.reuse(kept, state(version=6, messages=1)) is None
    later = StoredMessage(seq=2, role="user", content="y", created_at=2)
    assert Transcripts.continues(kept, 1, [messages[1], later])
    other = StoredMessage(seq=1, role="assistant", content="not it", created_at=1)
    assert not Transcripts.continues(kept, 1, [other, later])
    assert not Transcripts.continues(kept, 1, [])
