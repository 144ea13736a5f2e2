"""A lone surrogate in the transcript — a prompt, or text or tool input the model sent (escaped in
its JSON) — must not wedge the session: the SDK cannot encode it, so it is stored and sent as
U+FFFD, and the tool runs with that input."""

from __future__ import annotations

from pathlib import Path

import toolledger as tl
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse


def test_a_lone_surrogate_from_the_model_does_not_wedge_the_session(tmp_path: Path) -> None:
    seen: list[str] = []

    @tl.tool
    def create_ticket(title: str) -> str:
        seen.append(title)
        return "T-1"

    script = [
        Reply(tool_uses=[ToolUse("create_ticket", {"title": "broken \ud800 title"})]),
        Reply(text="done"),
    ]
    with ScriptedModel(script) as model, tl.open_store(f"sqlite:///{tmp_path / 'l.db'}") as store:
        agent = tl.Agent(client=model.client(), model="m", tools=[create_ticket], store=store)
        run = agent.run(session="s", prompt="go \udc00 on")
        assert run.status is tl.RunStatus.COMPLETED
        assert model.rejected == []
        assert model.requests[0]["messages"][0]["content"] == "go \ufffd on"
    assert seen == ["broken \ufffd title"]
