"""The crash matrix: every crash point x every recovery strategy x one and two calls per turn,
with the real ``anthropic`` SDK against the scripted model and real ``SIGKILL``s.

Effects are counted in the world the tools write (ticket files, an execution log), never in
toolledger's records. Every request the model received must obey the tool_use/tool_result
pairing rule (the scripted model rejects it otherwise, and the test fails).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import toolledger as tl
from toolledger._crash import POINTS
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse
from toolledger.testing.world import KINDS, TOOL_OF_KIND, AgentSpec, World, run_agent

from ..conftest import url_for

KILLED = -9


def needs_intent(kind: str) -> bool:
    return kind in ("plain", "checked")


@pytest.mark.parametrize("calls", [1, 2])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("backend", ["sqlite", "json", "postgres"])
def test_crash_matrix(
    backend: str,
    point: str,
    kind: str,
    calls: int,
    tmp_path: Path,
    request: pytest.FixtureRequest,
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
    with ScriptedModel(script) as model:
        spec = AgentSpec(
            store_url=(
                str(request.getfixturevalue("postgres_store_url"))
                if backend == "postgres"
                else url_for(backend, tmp_path)
            ),
            base_url=model.url,
            world=str(world.path),
            session="outage-42",
        )
        # Kill on the last call of the turn. Safe calls' outcomes share one commit (the final
        # one, with checkpoint B), so ``after_record`` happens once for them.
        per_call = ("after_intent", "before_record") + (
            ("after_record",) if needs_intent(kind) else ()
        )
        nth = calls if point in per_call else 1
        code, _ = run_agent(spec, crash_at=f"{point}:{nth}")
        reachable = point != "after_intent" or needs_intent(kind)
        assert code == (KILLED if reachable else 0)

        code, result = run_agent(spec)  # resume, no crash
        assert code == 0 and result is not None
        in_doubt_window = point in ("after_intent", "before_record")
        if kind == "plain" and in_doubt_window:
            # Never re-run silently: a person must say whether it happened.
            assert result["status"] == "needs_attention", result
            assert "in doubt" in result["reason"]
            with tl.open_store(spec.store_url) as store:
                (doubt,) = store.ledger("outage-42").in_doubt()
                happened = point == "before_record"  # after_intent: killed before the tool ran
                store.ledger("outage-42").resolve(doubt.tool_use_id, happened=happened, by="test")
            code, result = run_agent(spec)
            assert code == 0 and result is not None
        assert result["status"] == "completed", result

        assert model.rejected == [], "every request obeyed the pairing rule"
        final_request = model.requests[-1]["messages"]
        assert final_request[-1]["role"] == "user"
        results = [b for b in final_request[-1]["content"] if b["type"] == "tool_result"]
        assert len(results) == calls and not any(r.get("is_error") for r in results)

    tickets = world.tickets()
    assert sorted(t["title"] for t in tickets) == [f"outage {i}" for i in range(calls)], (
        "exactly one effect per call"
    )
    executions = world.executions(tool_name)
    if kind in ("plain", "checked"):
        assert len(executions) == calls, "a non-idempotent tool never ran twice"
    else:
        assert calls <= len(executions) <= 2 * calls, "safe tools may re-run; effects did not"
