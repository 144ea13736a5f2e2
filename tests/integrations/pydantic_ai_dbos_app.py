"""The Pydantic AI agent of pydantic_ai_app.py made durable by DBOS (``DBOSDurability``, a SQLite
system database): DBOS records each model request as a step and, after a crash, re-executes the
workflow — the model's steps answer from DBOS, so the tool calls come back with the same ids, and
the tools (which DBOS runs inline, not as steps) answer from the ledger.

``python pydantic_ai_dbos_app.py DIRECTORY start|resume``: ``start`` runs workflow ``wf-1``;
``resume`` launches DBOS, which recovers the pending workflow, and waits for its result. Prints
the output and the ledger's sessions as JSON; ``TOOLLEDGER_CRASH_AT`` makes it ``SIGKILL`` itself.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from dbos import DBOS, SetWorkflowID
from pydantic_ai import Agent
from pydantic_ai.durable_exec.dbos import DBOSDurability
from pydantic_ai.models.function import FunctionModel

import toolledger as tl
from toolledger.integrations.pydantic_ai import LedgerToolset

sys.path.insert(0, str(Path(__file__).parent))  # run as a script, beside its sibling
from pydantic_ai_app import scripted, world_toolset

WORKFLOW = "wf-1"


def main(directory: str, phase: str) -> None:
    where = Path(directory)
    with tl.open_store(f"sqlite:///{where / 'ledger.db'}") as store:
        DBOS(
            config={
                "name": "toolledger-test",
                "system_database_url": f"sqlite:///{where / 'dbos.db'}",
            }
        )
        agent = Agent(
            FunctionModel(scripted),
            name="ledgered",
            toolsets=[
                LedgerToolset(
                    world_toolset(where / "world.txt"),
                    store=store,
                    effects={"append_line": {"effect": "non_idempotent"}},
                )
            ],
            capabilities=[DBOSDurability()],
        )

        @DBOS.workflow()
        async def conversation(prompt: str) -> str:
            result = await agent.run(prompt)
            return result.output

        async def run() -> str:
            DBOS.launch()  # recovers the workflows a killed process left pending
            if phase == "start":
                with SetWorkflowID(WORKFLOW):
                    return await conversation("checkout is down")
            handle: Any = await DBOS.retrieve_workflow_async(WORKFLOW)
            output: str = await handle.get_result()
            return output

        try:
            output = asyncio.run(run())
        finally:
            DBOS.destroy()
        print(json.dumps({"output": output, "sessions": store.sessions()}))


if __name__ == "__main__":
    main(*sys.argv[1:])
