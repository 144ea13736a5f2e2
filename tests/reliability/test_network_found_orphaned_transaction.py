"""Found by the network fault tests, fixed: a partition that cuts a transaction before its
COMMIT must not leave the session stuck once the network is back.

The cut transaction stays open on the server, holding its row locks — the session's lease row
among them — until the server ends it. toolledger asked the server for no deadline of its own,
so that took the server's TCP keepalive: two hours by default, during which every resume of the
session waited on the lease row, was cut at ``op_timeout`` and failed. Our connections now set
``idle_in_transaction_session_timeout`` to the operation deadline: no transaction of ours is idle
longer unless its client is gone. (Without that setting this test fails: the cut transaction is
sent whole but for its ``COMMIT``, one pipelined write that the relay cuts at the ``COMMIT``.)
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

from ..conftest import with_params
from .faultproxy import COMMIT, Fault, running_proxy

pytestmark = pytest.mark.postgres


def test_a_session_resumes_once_the_partition_heals(
    postgres_url: str, postgres_schema: str, tmp_path: Path
) -> None:
    tickets = tmp_path / "tickets"
    tickets.mkdir()

    @tl.tool(effect="non_idempotent")
    def create_ticket(title: str, ctx: tl.ToolContext) -> dict[str, Any]:
        """Open a ticket."""
        (tickets / ctx.tool_use_id).write_text(title)
        return {"ticket": ctx.tool_use_id}

    script = [Reply(tool_uses=[ToolUse("create_ticket", {"title": "Outage"})]), Reply(text="ok")]

    class Partitioning(ScriptedModel):
        """Cuts the network as it answers with the call: the next COMMIT is checkpoint A's,
        which carries the call's intent (on the general path, A alone)."""

        def reply(self, path: str, reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
            if reply.tool_uses and not proxy.fired:
                proxy.arm(Fault.BLACK_HOLE, on=COMMIT)  # that COMMIT never arrives
            return super().reply(path, reply, body)

    with running_proxy() as proxy, Partitioning(script) as model:
        url = with_params(
            proxy.url(postgres_url),
            schema=postgres_schema,
            op_timeout="1",
            pool_timeout="1",
            connect_timeout="2",
        )

        def agent(store: tl.Store) -> tl.Agent:
            return tl.Agent(
                client=model.client(), model="m", tools=[create_ticket], store=store, lease_ttl=1.5
            )

        store = tl.open_store(url)
        with pytest.raises(tl.StoreError):
            agent(store).run(session="s", prompt="Checkout is down.")
        store.close()  # the worker gives up while cut off
        proxy.heal(server_notices=False)  # the network is back; the server has not noticed
        try:
            with tl.open_store(url) as store:
                deadline = time.monotonic() + 6  # a few resumes, at op_timeout=1
                while True:
                    try:
                        run = agent(store).run(session="s", prompt="Checkout is down.")
                        break
                    except tl.StoreError:
                        assert time.monotonic() < deadline, "the session never resumed"
            assert run.status is tl.RunStatus.COMPLETED
        finally:
            proxy.let_server_notice()
