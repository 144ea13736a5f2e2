"""How to test your own agent against a crash: a real process, really killed, then resumed.

The model is ``ScriptedModel`` (a fake Messages API on 127.0.0.1 that the real ``anthropic`` SDK
talks to); the crash is ``arm_crash("before_record")``: the process ``SIGKILL``s itself after the
tool returned and before its outcome was written — the instant a naive resume repeats the effect.
The test then counts the effects in the world (files in an outbox), not in the ledger.

Run it with pytest (``pytest examples/testing_your_agent.py``) or as a script:

    python examples/testing_your_agent.py
"""

from __future__ import annotations

import multiprocessing
import tempfile
import uuid
from pathlib import Path
from typing import Any

import toolledger as tl
from toolledger.testing import arm_crash
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse


def make_agent(client: Any, store: tl.Store, outbox: Path) -> tl.Agent:
    """Your agent, built the way your application builds it (here: one e-mail tool)."""

    @tl.tool(effect="non_idempotent")
    def send_email(to: str, body: str, ctx: tl.ToolContext) -> str:
        """E-mail a customer."""
        # Every send is one more message (a name of its own), like a real mail server.
        message = f"Message-ID: <{ctx.idempotency_key}@example.com>\nTo: {to}\n\n{body}"
        (outbox / f"{uuid.uuid4().hex}.eml").write_text(message)
        return "sent"

    @send_email.check
    def _(to: str, body: str, ctx: tl.ToolContext) -> str | None:
        """Did this call's e-mail go out? Search the outbox for its Message-ID."""
        wanted = f"Message-ID: <{ctx.idempotency_key}@example.com>"
        sent = any(m.read_text().startswith(wanted) for m in outbox.iterdir())
        return "sent" if sent else None

    return tl.Agent(client=client, model="claude-test", tools=[send_email], store=store)


def run_killed(base_url: str, url: str, outbox: Path) -> None:
    """The first run, in a child process that dies right after the e-mail went out."""
    import anthropic

    arm_crash("before_record")
    with tl.open_store(url) as store:
        client = anthropic.Anthropic(base_url=base_url, api_key="test", max_retries=0)
        make_agent(client, store, outbox).run(session="s1", prompt="Tell acme we are on it.")


def test_a_kill_after_the_send_sends_one_email(tmp_path: Path) -> None:
    outbox, url = tmp_path / "outbox", f"sqlite:///{tmp_path / 'agent.db'}"
    outbox.mkdir()
    script = [
        Reply(tool_uses=[ToolUse("send_email", {"to": "ops@acme.test", "body": "On it."})]),
        Reply(text="Done: acme was told."),
    ]
    with ScriptedModel(script) as model:
        child = multiprocessing.get_context("fork").Process(
            target=run_killed, args=(model.url, url, outbox)
        )
        child.start()
        child.join(60)
        assert child.exitcode == -9, "killed by SIGKILL, not finished"
        assert len(list(outbox.iterdir())) == 1, "the e-mail went out before the kill"

        with tl.open_store(url) as store:  # the restart, as your process would do it
            run = make_agent(model.client(), store, outbox).run(session="s1")
        assert run.status is tl.RunStatus.COMPLETED, run.reason
        assert len(list(outbox.iterdir())) == 1, "the resume did not send it again"
        # What the model was sent: one tool_result for the one call, the check's answer.
        last = model.requests[-1]["messages"][-1]["content"]
        assert [block["content"] for block in last if block["type"] == "tool_result"] == ["sent"]


if __name__ == "__main__":
    test_a_kill_after_the_send_sends_one_email(Path(tempfile.mkdtemp()))
    print("killed after the send, resumed: 1 e-mail sent")
