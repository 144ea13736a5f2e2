"""One worker of the DBOS fleet test (``test_dbos_fleet.py``), started as its own process:
``python -m tests.integrations.dbos_fleet_worker SYSTEM_DB STORE MODEL_URL WORLD EXECUTOR_ID``.

It registers the World's agent, launches DBOS under its executor id (so a restart recovers the
sessions its killed predecessor was running), declares the queue and serves it until it is
killed. ``TOOLLEDGER_CRASH_AT`` in its environment makes it ``SIGKILL`` itself at a crash point.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import anthropic
from dbos import DBOS

import toolledger as tl
from toolledger.integrations import dbos as tl_dbos
from toolledger.testing.world import World

APP = "toolledger-fleet"
VERSION = "fleet-test"  # every worker runs this code: one application version, so any recovers
WORKER_CONCURRENCY = 2


def main(system_db: str, store_url: str, model_url: str, world: str, executor_id: str) -> None:
    def make_agent() -> tl.Agent:
        client = anthropic.Anthropic(base_url=model_url, api_key="scripted", max_retries=0)
        return tl.Agent(
            client=client,
            model="claude-scripted",
            tools=World(world).toolset(),
            store=tl.open_store(store_url),
        )

    DBOS(
        config={
            "name": APP,
            "system_database_url": system_db,
            "executor_id": executor_id,
            "application_version": VERSION,
            "log_level": "WARNING",
            "sys_db_pool_size": 6,
        }
    )
    tl_dbos.register(make_agent, retry_interval=0.2, max_retry_interval=2.0)
    DBOS.launch()
    tl_dbos.register_queue(worker_concurrency=WORKER_CONCURRENCY, polling_interval_sec=0.1)
    Path(world, f"ready-{executor_id}").touch()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main(*sys.argv[1:6])
