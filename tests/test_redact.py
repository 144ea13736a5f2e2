"""The redact= hook: secrets never reach the store's bytes; resumes still work."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import toolledger as tl
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

from .conftest import tool_use, url_for

CARD = "4242-4242-4242-4242"


def scrub(text: str) -> str:
    return re.sub(r"\b(?:\d{4}-){3}\d{4}\b", "[card]", text)


@tl.tool
def charge(customer: str) -> dict[str, str]:
    """Charge a customer's card on file."""
    return {"status": "charged", "card": CARD}


def stored_bytes(tmp_path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())


@pytest.mark.parametrize("kind", ["sqlite", "json"])
def test_secrets_never_reach_the_disk(kind: str, tmp_path: Path) -> None:
    store = tl.open_store(url_for(kind, tmp_path), redact=scrub)
    script = [
        Reply(
            text=f"Charging the card {CARD}.", tool_uses=[ToolUse("charge", {"customer": "acme"})]
        ),
        Reply(text="Charged."),
    ]
    with ScriptedModel(script) as model:
        agent = tl.Agent(client=model.client(), model="x", tools=[charge], store=store)
        run = agent.run(session="s", prompt=f"charge acme, card {CARD}")
        # The model got the real result in the moment.
        (result,) = model.requests[1]["messages"][2]["content"]
        assert CARD in result["content"]
    store.close()
    assert run.status is tl.RunStatus.COMPLETED
    assert CARD.encode() not in stored_bytes(tmp_path)
    assert b"[card]" in stored_bytes(tmp_path)


def test_a_replay_answers_with_the_redacted_result(tmp_path: Path) -> None:
    store = tl.Store(tl.open_store(url_for("sqlite", tmp_path)).backend, redact=scrub)
    use = tool_use("toolu_1", "charge", customer="acme")
    first = tl.run_tool_uses([use], [charge], ledger=store.ledger("s"))
    second = tl.run_tool_uses([use], [charge], ledger=store.ledger("s"))
    assert CARD in first[0]["content"]
    assert CARD not in second[0]["content"] and "[card]" in second[0]["content"]
    store.close()


class Interrupted(BaseException):
    """Stands in for the process dying inside the tool (not an Exception: nothing catches it)."""


def test_tool_inputs_are_left_alone_so_a_resume_still_matches(tmp_path: Path) -> None:
    """A pending call is matched to its ledger record by its input's hash: had the transcript's
    tool_use input been redacted, the resume would raise LedgerMismatchError."""
    store = tl.Store(
        tl.open_store(url_for("sqlite", tmp_path)).backend, redact=lambda text: "[redacted]"
    )

    @tl.tool
    def note(text: str) -> str:
        raise Interrupted

    script = [Reply(tool_uses=[ToolUse("note", {"text": "keep me"})]), Reply(text="done")]
    with ScriptedModel(script) as model:
        agent = tl.Agent(client=model.client(), model="x", tools=[note], store=store)
        with pytest.raises(Interrupted):
            agent.run(session="s", prompt="note it")
        run = agent.run(session="s")
    assert run.status is tl.RunStatus.NEEDS_ATTENTION and "in doubt" in (run.reason or "")
    stored = store.backend.read_messages("s")
    assert stored[1].content[0]["input"] == {"text": "keep me"}
    assert stored[0].content == "[redacted]"
    store.close()
