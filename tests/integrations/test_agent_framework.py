"""toolledger.integrations.agent_framework: Agent Framework's function calls through the ledger.

The kill: a person approves the refund, the process dies after it, and the app re-sends the
approval it saved with the session it saved — the framework runs the approved call again. Counted
in the world (``refunds.txt``): plain framework, two refunds; with ``LedgerMiddleware``, one, on
SQLite and on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .apps import ChargeInDoubtOnce, run_app
from .conftest import require

require("agent_framework_openai", "recipes", "agent framework")

from agent_framework import Agent, AgentSession, tool  # noqa: E402
from agent_framework_openai import OpenAIChatCompletionClient  # noqa: E402

import toolledger as tl  # noqa: E402
from toolledger.integrations.agent_framework import LedgerMiddleware  # noqa: E402
from toolledger.records import Status  # noqa: E402
from toolledger.testing.scripted_openai import Reply, ScriptedOpenAI, ToolUse  # noqa: E402

from ..conftest import url_for  # noqa: E402

APP = str(Path(__file__).with_name("agent_framework_app.py"))
REFUND = "A-7 500\n"
SESSION, CALL_ID = "ticket-9", "call_R1"


def script() -> list[Reply]:
    refund = ToolUse("refund", {"order": "A-7", "cents": 500}, id=CALL_ID)
    return [Reply(tool_uses=[refund]), Reply(text="Refunded.")]


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres_store_url"))
    return url_for("sqlite", tmp_path)


def app(model: ScriptedOpenAI, tmp_path: Path, url: str, mode: str, phase: str, **kw: Any) -> Any:
    return run_app(APP, model.url, str(tmp_path), url, mode, phase, **kw)


def ok(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def dead(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == -9, done.stdout + done.stderr


def refunds(tmp_path: Path) -> str:
    return (tmp_path / "refunds.txt").read_text()


def test_plain_framework_refunds_twice_when_the_approval_is_resent(tmp_path: Path) -> None:
    url = url_for("sqlite", tmp_path)
    with ScriptedOpenAI(script()) as model:
        assert ok(app(model, tmp_path, url, "plain", "ask")) == {
            "requests": ["function_approval_request"]
        }
        dead(app(model, tmp_path, url, "plain", "approve-kill"))
        out = ok(app(model, tmp_path, url, "plain", "approve"))
    assert out["text"] == "Refunded." and refunds(tmp_path) == REFUND * 2


def test_a_resent_approval_answers_from_the_ledger(url: str, tmp_path: Path) -> None:
    with ScriptedOpenAI(script()) as model:
        ok(app(model, tmp_path, url, "ledgered", "ask"))
        dead(app(model, tmp_path, url, "ledgered", "approve", crash_at="after_record"))
        out = ok(app(model, tmp_path, url, "ledgered", "approve"))
    assert refunds(tmp_path) == REFUND, "one refund"
    assert out["text"] == "Refunded." and "refunded 500 cents on A-7" in out["results"][0]
    with tl.open_store(url) as store:
        (record,) = store.ledger(SESSION).records()
    assert (record.tool_use_id, record.status) == (CALL_ID, Status.SUCCEEDED)
    assert record.approved_by == "agent-framework approval"


def test_a_resent_approval_does_not_cover_a_call_in_doubt(url: str, tmp_path: Path) -> None:
    with ScriptedOpenAI(script()) as model:
        ok(app(model, tmp_path, url, "ledgered", "ask"))
        dead(app(model, tmp_path, url, "ledgered", "approve", crash_at="before_record"))
        out = ok(app(model, tmp_path, url, "ledgered", "approve"))
    assert refunds(tmp_path) == REFUND, "not refunded again"
    assert "may already have happened" in out["results"][0]
    with tl.open_store(url) as store:
        (doubt,) = store.ledger(SESSION).in_doubt()
    assert doubt.tool_use_id == CALL_ID


def test_failures_are_recorded_and_a_run_without_a_session_is_refused() -> None:
    ran: list[str] = []

    @tool
    def charge(order: str) -> str:
        """Charge an order."""
        ran.append(order)
        raise ValueError("backend down")

    asked = [Reply(tool_uses=[ToolUse("charge", {"order": "A"}, id="c-1")]), Reply(text="ok")]
    with ScriptedOpenAI(asked) as model, tl.open_store("memory://") as store:
        client = OpenAIChatCompletionClient(model="m", base_url=model.url, api_key="k")
        agent = Agent(client=client, tools=[charge], middleware=[LedgerMiddleware(store)])
        asyncio.run(agent.run("go", session=AgentSession(session_id="s")))
        (record,) = store.ledger("s").records()
        assert record.status is Status.FAILED and "backend down" in (record.error or "")
    with ScriptedOpenAI(asked) as model, tl.open_store("memory://") as store:
        client = OpenAIChatCompletionClient(model="m", base_url=model.url, api_key="k")
        agent = Agent(client=client, tools=[charge], middleware=[LedgerMiddleware(store)])
        with pytest.raises(Exception, match="session"):
            asyncio.run(agent.run("go"))
    assert ran == ["A"], "the run without a session ran nothing"


def test_an_in_doubt_call_rerun_by_approve_is_recorded_as_that_approvers() -> None:
    """What the framework's approval does not cover (re-run a call in doubt) goes to
    ``approve=``: the ledger records that approver's name, and a sync approver is asked off the
    event loop, as ``tl.arun_tool_uses`` asks it."""
    world = ChargeInDoubtOnce()

    @tool
    def charge(order: str) -> str:
        """Charge an order."""
        return world.charge(order)

    asked = [Reply(tool_uses=[ToolUse("charge", {"order": "A"}, id="c-1")]), Reply(text="ok")]
    with tl.open_store("memory://") as store:
        for _ in range(2):
            with ScriptedOpenAI(asked) as model:
                client = OpenAIChatCompletionClient(model="m", base_url=model.url, api_key="k")
                middleware = LedgerMiddleware(store, approve=world.rerun_it)
                agent = Agent(client=client, tools=[charge], middleware=[middleware])
                asyncio.run(agent.run("go", session=AgentSession(session_id="s")))
        record = store.ledger("s").get("c-1")
    world.rerun_once(record)
