"""An OpenAI Agents SDK agent for the kill tests: ``refund`` adds a line to ``DIR/refunds.txt``
(one per real refund) and needs a person's approval; the model is ``ScriptedOpenAI`` (Responses
API) at ``MODEL_URL``, which asks for ``refund`` under call id ``call_R1``, then answers.

``python openai_agents_app.py MODEL_URL DIR STORE_URL MODE PHASE``; ``MODE`` is ``plain`` (the SDK
alone) or ``ledgered`` (``toolledger.integrations.openai_agents``), ``PHASE`` one of:

* ``ask`` — run until the approval interruption; save the state to ``DIR/asked.json``;
* ``approve`` — load it, approve, save the approved state to ``DIR/approved.json`` (what an app
  keeps while it runs the approved call), then run; ``approve-kill`` is the same, the refund
  ``SIGKILL``ing its process right after its effect (``TOOLLEDGER_CRASH_AT`` kills at
  toolledger's points instead);
* ``resume`` — load ``approved.json`` and run: the resume after a crash;
* ``settle`` — load ``asked.json`` (the state before the approval), approve what the ledger
  already finished (``settle_interruptions``) and run.

Prints what the run answered as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from agents import (
    Agent,
    RunConfig,
    Runner,
    RunState,
    function_tool,
    set_default_openai_client,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

import toolledger as tl
from toolledger.integrations.openai_agents import ledgered, settle_interruptions

SESSION = "ticket-9"
CALL_ID = "call_R1"
EFFECTS = {"refund": {"effect": "non_idempotent", "high_impact": True}}


def refund_tool(world: Path, *, kill: bool = False) -> Any:
    @function_tool(needs_approval=True)
    def refund(order: str, cents: int) -> str:
        """Refund an order."""
        with (world / "refunds.txt").open("a") as f:
            f.write(f"{order} {cents}\n")
        if kill:
            os.kill(os.getpid(), signal.SIGKILL)  # after the effect, before anything is told
        return f"refunded {cents} cents on {order}"

    return refund


def use_model(url: str) -> None:
    set_tracing_disabled(True)
    set_default_openai_client(AsyncOpenAI(base_url=url, api_key="scripted", max_retries=0))


def told(result: Any) -> dict[str, Any]:
    outputs = [i.output for i in result.new_items if i.type == "tool_call_output_item"]
    waiting = [i.call_id for i in result.interruptions]
    return {"outputs": outputs, "final": result.final_output, "interruptions": waiting}


async def main(url: str, where: str, store_url: str, mode: str, phase: str) -> dict[str, Any]:
    use_model(url)
    world = Path(where)
    agent: Agent[Any] = Agent(
        name="support",
        model="gpt-scripted",
        tools=[refund_tool(world, kill=phase.endswith("kill"))],
    )
    config = RunConfig(group_id=SESSION)
    with tl.open_store(store_url) as store:
        if mode == "ledgered":
            agent = ledgered(agent, store=store, effects=EFFECTS)
        if phase == "ask":
            result = await Runner.run(agent, "Refund order A-7, 500 cents.", run_config=config)
            (world / "asked.json").write_text(result.to_state().to_string())
            return told(result)
        if phase.startswith("approve"):
            state = await RunState.from_string(agent, (world / "asked.json").read_text())
            (item,) = state.get_interruptions()
            state.approve(item)
            (world / "approved.json").write_text(state.to_string())
        elif phase == "resume":
            state = await RunState.from_string(agent, (world / "approved.json").read_text())
        else:  # settle
            state = await RunState.from_string(agent, (world / "asked.json").read_text())
            waiting = settle_interruptions(state, store.ledger(SESSION))
            assert waiting == [], "the ledger finished the call: nobody is asked again"
        return told(await Runner.run(agent, state, run_config=config))


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*sys.argv[1:]))))
