"""The crash matrix again, for OpenAI: every crash point x every recovery strategy x one and two
calls per turn, on Chat Completions and on the Responses API, with the real ``openai`` SDK
against the scripted OpenAI server and real ``SIGKILL``s.

The assertions are the Anthropic matrix's (tests/agent/test_crash_matrix.py): effects counted in
the world's files, a plain non-idempotent call in doubt needs a person and then completes, and
every request the model received obeys the API's pairing rule. SQLite only: the JSON store is
exercised by the Anthropic matrix, and the provider does not touch the store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger._crash import POINTS
from toolledger.adapters.openai import ERROR_PREFIX
from toolledger.testing.scripted import Reply, ToolUse
from toolledger.testing.scripted_openai import ScriptedOpenAI
from toolledger.testing.world import KINDS, TOOL_OF_KIND, AgentSpec, World, run_agent
from toolledger.verify import verify

from ..conftest import url_for

KILLED = -9


def needs_intent(kind: str) -> bool:
    return kind in ("plain", "checked")


def last_results(provider: str, body: dict[str, Any]) -> list[str]:
    """The result texts of the last turn in a request, in the API's own shape."""
    if provider == "openai":
        messages = body["messages"]
        assert messages[-1]["role"] == "tool"
        last_assistant = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        return [m["content"] for m in messages[last_assistant + 1 :] if m["role"] == "tool"]
    items = body["input"]
    assert items[-1]["type"] == "function_call_output"
    last_call = max(i for i, item in enumerate(items) if item.get("type") == "function_call")
    return [
        item["output"] for item in items[last_call + 1 :] if item["type"] == "function_call_output"
    ]


@pytest.mark.parametrize("calls", [1, 2])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("provider", ["openai", "openai-responses"])
def test_openai_crash_matrix(
    provider: str, point: str, kind: str, calls: int, tmp_path: Path
) -> None:
    world = World(tmp_path / "world")
    tool_name = TOOL_OF_KIND[kind]
    script = [
        Reply(
            text="Opening tickets.",
            tool_uses=[ToolUse(tool_name, {"title": f"outage {i}"}) for i in range(calls)],
        ),
        Reply(text="All tickets are open."),
    ]
    with ScriptedOpenAI(script) as model:
        spec = AgentSpec(
            store_url=url_for("sqlite", tmp_path),
            base_url=model.url,
            world=str(world.path),
            session="outage-42",
            model="gpt-scripted",
            provider=provider,
        )
        per_call = ("after_intent", "before_record") + (
            ("after_record",) if needs_intent(kind) else ()
        )
        nth = calls if point in per_call else 1
        code, _ = run_agent(spec, crash_at=f"{point}:{nth}")
        reachable = point != "after_intent" or needs_intent(kind)
        assert code == (KILLED if reachable else 0)

        code, result = run_agent(spec)  # resume, no crash
        assert code == 0 and result is not None
        if kind == "plain" and point in ("after_intent", "before_record"):
            assert result["status"] == "needs_attention", result
            assert "in doubt" in result["reason"]
            with tl.open_store(spec.store_url) as store:
                (doubt,) = store.ledger("outage-42").in_doubt()
                happened = point == "before_record"
                store.ledger("outage-42").resolve(doubt.tool_use_id, happened=happened, by="test")
            code, result = run_agent(spec)
            assert code == 0 and result is not None
        assert result["status"] == "completed", result

        assert model.rejected == [], "every request obeyed the pairing rule"
        results = last_results(provider, model.requests[-1])
        assert len(results) == calls and not any(r.startswith(ERROR_PREFIX) for r in results)
        with tl.open_store(spec.store_url) as store:
            assert verify(store) == [], "the transcript agrees with the ledger"

    tickets = world.tickets()
    assert sorted(t["title"] for t in tickets) == [f"outage {i}" for i in range(calls)], (
        "exactly one effect per call"
    )
    executions = world.executions(tool_name)
    if kind in ("plain", "checked"):
        assert len(executions) == calls, "a non-idempotent tool never ran twice"
    else:
        assert calls <= len(executions) <= 2 * calls, "safe tools may re-run; effects did not"
