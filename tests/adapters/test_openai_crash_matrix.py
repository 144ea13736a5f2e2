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
from toolledger._verify import verify
from toolledger.adapters.openai import ERROR_PREFIX
from toolledger.testing.scripted_openai import ScriptedOpenAI
from toolledger.testing.world import KINDS, AgentSpec, World, run_agent

from ..conftest import url_for
from ..crashcase import SESSION, assert_one_effect_per_call, crash_and_recover, script


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
    with ScriptedOpenAI(script(kind, calls)) as model:
        spec = AgentSpec(
            store_url=url_for("sqlite", tmp_path),
            base_url=model.url,
            world=str(world.path),
            session=SESSION,
            model="gpt-scripted",
            provider=provider,
        )
        crash_and_recover(
            lambda at: run_agent(spec, crash_at=at),
            spec.store_url,
            point=point,
            kind=kind,
            calls=calls,
        )
        assert model.rejected == [], "every request obeyed the pairing rule"
        results = last_results(provider, model.requests[-1])
        assert len(results) == calls and not any(r.startswith(ERROR_PREFIX) for r in results)
        with tl.open_store(spec.store_url) as store:
            assert verify(store) == [], "the transcript agrees with the ledger"
    assert_one_effect_per_call(world, kind, calls)
