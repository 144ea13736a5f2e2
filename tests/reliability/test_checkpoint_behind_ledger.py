"""A checkpoint behind its ledger — a json session log that lost its last commits (an older copy
restored, a lost final newline) while the ledger kept its records. Resuming it would ask the model
again and run the lost turns' calls again under new ids; the agent refuses, naming the records,
and so does a session whose log is gone altogether."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import toolledger as tl
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse


def test_a_checkpoint_behind_its_ledger_is_not_resumed_blindly(tmp_path: Path) -> None:
    url = f"json:///{tmp_path / 'l'}"
    tickets: list[str] = []

    @tl.tool
    def create_ticket(title: str) -> str:
        tickets.append(title)
        return f"T-{title}"

    script = [
        Reply(tool_uses=[ToolUse("create_ticket", {"title": "a"})]),
        Reply(tool_uses=[ToolUse("create_ticket", {"title": "b"})]),
        Reply(text="done"),
    ]
    with ScriptedModel(script) as model:
        with tl.open_store(url) as store:
            agent = tl.Agent(
                client=model.client(), model="m", tools=[create_ticket], store=store, lease_ttl=0.2
            )
            agent.run(session="s", prompt="go")
        log = tmp_path / "l" / "s.session.jsonl"
        lines = log.read_bytes().splitlines()
        seqs = [[m["seq"] for m in json.loads(line).get("messages", [])] for line in lines]
        turn_1_b = next(n for n, s in enumerate(seqs) if 2 in s)  # turn 1's tool_result
        log.write_bytes(b"\n".join(lines[: turn_1_b + 1]) + b"\n")  # up to checkpoint B of turn 1
        time.sleep(0.3)  # any lease the cut brought back has expired
        with tl.open_store(url) as store:
            agent = tl.Agent(
                client=model.client(), model="m", tools=[create_ticket], store=store, lease_ttl=0.2
            )
            with pytest.raises(tl.CorruptLedgerError, match="is behind its ledger") as info:
                agent.run(session="s", prompt="go")
            assert info.value.session_id == "s"
            log.unlink()  # and with no checkpoint at all
            time.sleep(0.3)
            with pytest.raises(tl.CorruptLedgerError, match="has no checkpoint at all"):
                agent.run(session="s", prompt="go")
        assert len(model.requests) == 3, "the model was not asked again"
    assert tickets == ["a", "b"]
