"""The agent of openai_agents_app.py under ``dbos-openai-agents`` (``DBOSRunner`` in a workflow,
a SQLite system database), without an approval: DBOS records each model call as a step and, after
a crash, re-executes the workflow — the model's step answers from DBOS, so the call comes back
with the same id, and the tool, which DBOS runs inline, runs again unless the ledger answers it.

``python openai_agents_dbos_app.py MODEL_URL DIR STORE_URL MODE start|start-kill|resume``:
``start`` runs workflow ``wf-1`` (``start-kill``: the refund ``SIGKILL``s its process right after
its effect); ``resume`` launches DBOS, which recovers it, and waits for its result.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from agents import Agent
from dbos import DBOS, SetWorkflowID
from dbos_openai_agents import DBOSRunner

import toolledger as tl
from toolledger.integrations.openai_agents import ledgered

sys.path.insert(0, str(Path(__file__).parent))  # run as a script, beside its sibling
from openai_agents_app import refund_tool, told, use_model

WORKFLOW = "wf-1"


def main(url: str, where: str, store_url: str, mode: str, phase: str) -> dict[str, Any]:
    use_model(url)
    world = Path(where)
    tool = refund_tool(world, kill=phase.endswith("kill"))
    with tl.open_store(store_url) as store:
        DBOS(
            config={
                "name": "toolledger-oa",
                "system_database_url": f"sqlite:///{world / 'dbos.db'}",
            }
        )
        agent: Agent[Any] = Agent(name="support", model="gpt-scripted", tools=[unapproved(tool)])
        if mode == "ledgered":
            agent = ledgered(
                agent,
                store=store,
                effects={"refund": {"effect": "non_idempotent"}},
                session=lambda ctx: str(DBOS.workflow_id),
            )

        @DBOS.workflow()
        async def conversation(prompt: str) -> dict[str, Any]:
            return told(await DBOSRunner.run(agent, prompt))

        async def run() -> dict[str, Any]:
            DBOS.launch()  # recovers the workflows a killed process left pending
            if phase.startswith("start"):
                with SetWorkflowID(WORKFLOW):
                    return await conversation("Refund order A-7, 500 cents.")
            handle: Any = await DBOS.retrieve_workflow_async(WORKFLOW)
            out: dict[str, Any] = await handle.get_result()
            return out

        try:
            return {**asyncio.run(run()), "sessions": store.sessions()}
        finally:
            DBOS.destroy()


def unapproved(tool: Any) -> Any:
    """The refund without the approval (DBOS runs the workflow to its end, unattended)."""
    import dataclasses

    return dataclasses.replace(tool, needs_approval=False)


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:])))
