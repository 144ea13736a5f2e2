"""A failed intent commit must not drop the safe records that were riding with it: they go back
in the queue and land with checkpoint B, so the transcript never reports a success its ledger
lacks (verify() stays clean)."""

from __future__ import annotations

import toolledger as tl
from toolledger._verify import verify
from toolledger.records import Status
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

from ..helpers import spy_store, writes_status


@tl.tool(effect="read_only")
def look() -> str:
    return "all quiet"


@tl.tool
def create_ticket(title: str) -> str:
    return "T-1"


def test_a_failed_intent_commit_does_not_leave_verify_errors(tmp_path) -> None:
    store = tl.open_store(f"sqlite:///{tmp_path / 'l.db'}")
    spied, _ = spy_store(store, fail_when=writes_status(Status.STARTED))  # only the intent fails
    script = [
        Reply(tool_uses=[ToolUse("look"), ToolUse("create_ticket", {"title": "x"})]),
        Reply(text="ok"),
    ]
    with ScriptedModel(script) as model:
        agent = tl.Agent(client=model.client(), model="m", tools=[look, create_ticket], store=spied)
        assert agent.run(session="s", prompt="go").status is tl.RunStatus.COMPLETED
    assert (
        verify(store) == []
    )  # fails: "the transcript reports toolu_… succeeded but the ledger has no record"
