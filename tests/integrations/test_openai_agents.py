"""toolledger.integrations.openai_agents: the OpenAI Agents SDK's function tools through the ledger.

The kill tests run the agent in processes of their own against ``ScriptedOpenAI`` (the Responses
API over HTTP, with the real ``openai`` SDK) and count refunds in the world (``refunds.txt``):

* human in the loop: a person approves the refund, the process dies after the refund, and the app
  resumes from the approved ``RunState`` it saved — the SDK runs the approved call again;
* DBOS (``dbos-openai-agents``): the workflow's process dies after the refund and ``DBOS.launch()``
  recovers it in a new one — the model's step answers from DBOS, the tool runs again.

Plain SDK: two refunds. Ledgered: one, on SQLite and on PostgreSQL.
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

require("agents", "openai-agents")

from agents import Agent, RunConfig, Runner, function_tool  # noqa: E402

import toolledger as tl  # noqa: E402
from toolledger.integrations.openai_agents import ledgered, tool_context  # noqa: E402
from toolledger.records import Status  # noqa: E402
from toolledger.testing.scripted_openai import Reply, ScriptedOpenAI, ToolUse  # noqa: E402

from ..conftest import url_for  # noqa: E402
from .openai_agents_app import CALL_ID, SESSION, use_model  # noqa: E402

HERE = Path(__file__).parent
APP, DBOS_APP = str(HERE / "openai_agents_app.py"), str(HERE / "openai_agents_dbos_app.py")
REFUND = "A-7 500\n"


def script(call_id: str = CALL_ID) -> list[Reply]:
    refund = ToolUse("refund", {"order": "A-7", "cents": 500}, id=call_id)
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


# -- human in the loop: the approved state resumed after a kill -----------------------------------


def test_plain_sdk_refunds_twice_when_the_approved_state_is_resumed(tmp_path: Path) -> None:
    url = url_for("sqlite", tmp_path)
    with ScriptedOpenAI(script()) as model:
        assert ok(app(model, tmp_path, url, "plain", "ask"))["interruptions"] == [CALL_ID]
        dead(app(model, tmp_path, url, "plain", "approve-kill"))
        assert refunds(tmp_path) == REFUND
        out = ok(app(model, tmp_path, url, "plain", "resume"))
    assert out["final"] == "Refunded."
    assert refunds(tmp_path) == REFUND * 2, "the duplicate the ledger is for"


def test_resumed_after_the_outcome_was_recorded_answers_from_the_ledger(
    url: str, tmp_path: Path
) -> None:
    with ScriptedOpenAI(script()) as model:
        ok(app(model, tmp_path, url, "ledgered", "ask"))
        dead(app(model, tmp_path, url, "ledgered", "approve", crash_at="after_record"))
        out = ok(app(model, tmp_path, url, "ledgered", "resume"))
    assert refunds(tmp_path) == REFUND, "one refund"
    assert out["outputs"] == ["refunded 500 cents on A-7"] and out["final"] == "Refunded."
    with tl.open_store(url) as store:
        (record,) = store.ledger(SESSION).records()
    assert (record.tool_use_id, record.status, record.attempt) == (CALL_ID, Status.SUCCEEDED, 1)
    assert record.approved_by == "openai-agents approval", "the SDK's approval, recorded"


def test_killed_while_the_refund_ran_is_in_doubt_and_never_run_again(
    url: str, tmp_path: Path
) -> None:
    """The old approval does not cover a re-run of a call that may have happened: the model is
    told, the call is left in doubt for a person."""
    with ScriptedOpenAI(script()) as model:
        ok(app(model, tmp_path, url, "ledgered", "ask"))
        dead(app(model, tmp_path, url, "ledgered", "approve", crash_at="before_record"))
        out = ok(app(model, tmp_path, url, "ledgered", "resume"))
    assert refunds(tmp_path) == REFUND, "not refunded again"
    (said,) = out["outputs"]
    assert "may already have happened" in said and "toolledger resolve" in said
    with tl.open_store(url) as store:
        (doubt,) = store.ledger(SESSION).in_doubt()
    assert doubt.tool_use_id == CALL_ID


def test_the_state_saved_before_the_approval_is_settled_from_the_ledger(tmp_path: Path) -> None:
    """The app kept only the state from before the approval: after the crash the interruption is
    there again. ``settle_interruptions`` approves it from the ledger, the call answers from it."""
    url = url_for("sqlite", tmp_path)
    with ScriptedOpenAI(script()) as model:
        ok(app(model, tmp_path, url, "ledgered", "ask"))
        dead(app(model, tmp_path, url, "ledgered", "approve", crash_at="after_record"))
        out = ok(app(model, tmp_path, url, "ledgered", "settle"))
    assert refunds(tmp_path) == REFUND
    assert out["outputs"] == ["refunded 500 cents on A-7"] and out["interruptions"] == []


# -- DBOS ------------------------------------------------------------------------------------------


def dbos_app(
    model: ScriptedOpenAI, tmp_path: Path, url: str, mode: str, phase: str, **kw: Any
) -> Any:
    return run_app(DBOS_APP, model.url, str(tmp_path), url, mode, phase, **kw)


@pytest.mark.slow  # DBOS takes a few seconds to recover a workflow and shut down
def test_plain_sdk_under_dbos_refunds_twice(tmp_path: Path) -> None:
    require("dbos_openai_agents", "openai-agents", "openai agents under dbos")
    url = url_for("sqlite", tmp_path)
    with ScriptedOpenAI(script()) as model:
        dead(dbos_app(model, tmp_path, url, "plain", "start-kill"))
        out = ok(dbos_app(model, tmp_path, url, "plain", "resume"))
    assert out["final"] == "Refunded." and refunds(tmp_path) == REFUND * 2


@pytest.mark.slow
def test_a_killed_dbos_workflow_recovered_refunds_once(url: str, tmp_path: Path) -> None:
    require("dbos_openai_agents", "openai-agents", "openai agents under dbos")
    with ScriptedOpenAI(script()) as model:
        dead(dbos_app(model, tmp_path, url, "ledgered", "start", crash_at="after_record"))
        out = ok(dbos_app(model, tmp_path, url, "ledgered", "resume"))
        assert len(model.requests) == 2, "the model's first step answered from DBOS"
    assert refunds(tmp_path) == REFUND
    assert out["outputs"] == ["refunded 500 cents on A-7"] and out["sessions"] == ["wf-1"]


# -- in one process -------------------------------------------------------------------------------


def run(agent: Agent[Any], prompt: str, session: str | None = SESSION) -> Any:
    config = RunConfig(group_id=session) if session else RunConfig()
    return asyncio.run(Runner.run(agent, prompt, run_config=config))


def test_outcomes_reach_the_ledger_failed_and_in_doubt(tmp_path: Path) -> None:
    """The SDK's default failure formatter would turn both exceptions into a success string."""
    seen: list[tuple[str | None, str | None]] = []

    @function_tool
    def charge(order: str) -> str:
        """Charge an order."""
        ctx = tool_context()
        seen.append((ctx.tool_use_id if ctx else None, tl.keys.current_key()))
        if order == "boom":
            raise ValueError("backend down")
        raise tl.OutcomeUnknown("the connection dropped after the request was sent")

    for order in ("boom", "lost"):
        with (
            ScriptedOpenAI(
                [
                    Reply(tool_uses=[ToolUse("charge", {"order": order}, id=f"c-{order}")]),
                    Reply(text="ok"),
                ]
            ) as model,
            tl.open_store("memory://") as store,
        ):
            use_model(model.url)
            out = run(ledgered(Agent(name="a", model="m", tools=[charge]), store=store), "go")
            (record,) = store.ledger(SESSION).records()
            (told,) = [i.output for i in out.new_items if i.type == "tool_call_output_item"]
            if order == "boom":
                assert record.status is Status.FAILED and "backend down" in (record.error or "")
                assert "backend down" in told
            else:
                assert record.status is Status.STARTED, "in doubt, never succeeded"
                assert "may already have happened" in told
    assert [s[0] for s in seen] == ["c-boom", "c-lost"] and all(s[1] for s in seen)


def test_stop_on_first_tool_ends_the_run_with_the_in_doubt_text_as_documented(
    tmp_path: Path,
) -> None:
    """With ``tool_use_behavior="stop_on_first_tool"`` the tool's answer is the run's final
    output, whatever it says (docs/integrations/openai-agents.md): a call left in doubt ends the
    run with toolledger's in-doubt text, not an exception — the ledger tells it apart."""

    @function_tool
    def charge(order: str) -> str:
        """Charge an order."""
        raise tl.OutcomeUnknown("the connection dropped after the request was sent")

    call = Reply(tool_uses=[ToolUse("charge", {"order": "A-7"}, id="c-1")])
    with ScriptedOpenAI([call]) as model, tl.open_store("memory://") as store:
        use_model(model.url)
        agent = Agent(name="a", model="m", tools=[charge], tool_use_behavior="stop_on_first_tool")
        out = run(ledgered(agent, store=store), "go")
        record = store.ledger(SESSION).get("c-1")
    assert "may already have happened" in str(out.final_output)
    assert record is not None and record.status is Status.STARTED, "in doubt"


def test_a_tool_that_raises_cancelled_error_is_in_doubt_not_an_invitation_to_retry(
    tmp_path: Path,
) -> None:
    """An await inside the tool was cancelled (nobody cancelled the run): the SDK would answer
    its failure formatter's "Please try again", and a model that obeys makes the call again
    under a new id, which the ledger cannot match. The call is left in doubt, the model told."""
    world = tmp_path / "charges.txt"

    @function_tool
    async def charge(order: str) -> str:
        """Charge an order; the connection's future is cancelled under it."""
        with world.open("a") as f:
            f.write(order + "\n")
        raise asyncio.CancelledError()

    with (
        ScriptedOpenAI(
            [Reply(tool_uses=[ToolUse("charge", {"order": "A"}, id="c-1")]), Reply(text="ok")]
        ) as model,
        tl.open_store("memory://") as store,
    ):
        use_model(model.url)
        out = run(ledgered(Agent(name="a", model="m", tools=[charge]), store=store), "go")
        (doubt,) = store.ledger(SESSION).in_doubt()
        (told,) = [i.output for i in out.new_items if i.type == "tool_call_output_item"]
        (sent,) = [
            i for i in model.requests[-1]["input"] if i.get("call_id") == "c-1" and "output" in i
        ]
    assert doubt.tool_use_id == "c-1" and "CancelledError" in (doubt.error or "")
    assert "may already have happened" in told and "Do not retry it under a new call" in told
    assert "try again" not in told.lower() and sent["output"] == told, "what the model was sent"
    assert world.read_text() == "A\n"


def test_same_call_id_with_other_arguments_fails_the_run(tmp_path: Path) -> None:
    @function_tool
    def charge(order: str) -> str:
        """Charge an order."""
        return f"charged {order}"

    with tl.open_store("memory://") as store:
        for order, fails in (("A", False), ("B", True)):
            step = [
                Reply(tool_uses=[ToolUse("charge", {"order": order}, id="c-1")]),
                Reply(text="ok"),
            ]
            with ScriptedOpenAI(step) as model:
                use_model(model.url)
                agent = ledgered(Agent(name="a", model="m", tools=[charge]), store=store)
                if fails:
                    with pytest.raises(Exception, match="with another input") as failed:
                        run(agent, "go")
                    assert isinstance(failed.value.__cause__, tl.LedgerMismatchError)
                else:
                    run(agent, "go")
        (record,) = store.ledger(SESSION).records()
    assert record.result == '"charged A"'


def test_what_cannot_be_ledgered_is_refused_clearly() -> None:
    @function_tool(timeout=5)
    async def slow(order: str) -> str:
        """Slow."""
        return order

    store = tl.open_store("memory://")
    inner = Agent(name="inner", model="m", tools=[])
    with pytest.raises(tl.ConfigurationError, match="agent used as a tool"):
        ledgered(Agent(name="a", tools=[inner.as_tool("ask", "ask inner")]), store=store)
    with pytest.raises(tl.ConfigurationError, match="timeout"):
        ledgered(Agent(name="a", tools=[slow]), store=store, effects={"slow": {"timeout": 9}})
    moved = ledgered(Agent(name="a", tools=[slow]), store=store)
    (tool,) = moved.tools
    assert getattr(tool, "timeout_seconds", 0) is None, "the timeout moved into the declaration"
    with pytest.raises(tl.ConfigurationError, match="unknown keys"):
        ledgered(Agent(name="a", tools=[slow]), store=store, effects={"slow": {"effekt": "x"}})


def test_a_run_without_a_session_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    ran: list[str] = []

    @function_tool
    def charge(order: str) -> str:
        """Charge an order."""
        ran.append(order)
        return order

    asked = [Reply(tool_uses=[ToolUse("charge", {"order": "A"}, id="c-1")]), Reply(text="ok")]
    with ScriptedOpenAI(asked) as model:
        use_model(model.url)
        agent = ledgered(
            Agent(name="a", model="m", tools=[charge]), store=tl.open_store("memory://")
        )
        with pytest.raises(Exception, match="group_id"):
            run(agent, "go", session=None)
    assert ran == []


def test_an_in_doubt_call_rerun_by_approve_is_recorded_as_that_approvers(tmp_path: Path) -> None:
    """The question the SDK did not ask (re-run a call in doubt) goes to ``approve=``: the ledger
    records that approver's name, and a sync approver (a person at a prompt) is asked off the
    event loop, as ``tl.arun_tool_uses`` asks it, so the run's other calls are not stalled."""
    world = ChargeInDoubtOnce()

    @function_tool
    def charge(order: str) -> str:
        """Charge an order."""
        return world.charge(order)

    with tl.open_store("memory://") as store:
        for _ in range(2):
            step = [Reply(tool_uses=[ToolUse("charge", {"order": "A"}, id="c-1")]), Reply("ok")]
            with ScriptedOpenAI(step) as model:
                use_model(model.url)
                run(
                    ledgered(
                        Agent(name="a", model="m", tools=[charge]),
                        store=store,
                        approve=world.rerun_it,
                    ),
                    "go",
                )
        record = store.ledger(SESSION).get("c-1")
    world.rerun_once(record)
