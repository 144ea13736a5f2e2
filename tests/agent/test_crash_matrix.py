"""The crash matrix: every crash point x every recovery strategy x one and two calls per turn x
a kill in the first or the second tool turn, with the real ``anthropic`` SDK against the
scripted model and real ``SIGKILL``s.

Effects are counted in the world the tools write (ticket files, an execution log), never in
toolledger's records. Every request the model received must obey the tool_use/tool_result
pairing rule (the scripted model rejects it otherwise, and the test fails).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from toolledger._crash import POINTS
from toolledger.testing.scripted import ScriptedModel
from toolledger.testing.world import KINDS, AgentSpec, World, run_agent

from ..conftest import url_for
from ..crashcase import SESSION, assert_one_effect_per_call, crash_and_recover, script


@pytest.mark.parametrize("turns", [1, 2])
@pytest.mark.parametrize("calls", [1, 2])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("backend", ["sqlite", "json", "postgres"])
def test_crash_matrix(
    backend: str,
    point: str,
    kind: str,
    calls: int,
    turns: int,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """``turns``: the kill falls in the run's first tool turn, whose checkpoint A creates
    nothing new, or its second, whose every commit follows a turn already committed."""
    world = World(tmp_path / "world")
    url = (
        str(request.getfixturevalue("postgres_store_url"))
        if backend == "postgres"
        else url_for(backend, tmp_path)
    )
    with ScriptedModel(script(kind, calls, turns)) as model:
        spec = AgentSpec(store_url=url, base_url=model.url, world=str(world.path), session=SESSION)
        crash_and_recover(
            lambda at: run_agent(spec, crash_at=at),
            url,
            point=point,
            kind=kind,
            calls=calls,
            turns=turns,
        )
        assert model.rejected == [], "every request obeyed the pairing rule"
        final_request = model.requests[-1]["messages"]
        assert final_request[-1]["role"] == "user"
        results = [b for b in final_request[-1]["content"] if b["type"] == "tool_result"]
        assert len(results) == calls and not any(r.get("is_error") for r in results)
    assert_one_effect_per_call(world, kind, calls * turns)
