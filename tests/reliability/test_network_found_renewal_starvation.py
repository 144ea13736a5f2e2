"""Found by the network fault tests, fixed: sessions cut off from their store must not starve
the lease renewals of a healthy session in the same process.

Every sync run's lease was renewed on one pool of four threads, and a renewal on a silent store
holds its thread until the operation deadline cuts it. With more sessions on a silent store than
renewers — their tools still running, so their renewals still attempted — every thread was busy
with a hopeless renewal, a healthy session's renewal waited behind them longer than its lease
lived, and another worker could take the healthy session over. The renewers now grow to as many
renewals as are under way at once (at most one per sync run).
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

from ..conftest import with_params
from .faultproxy import BLACK_HOLE, running_proxy

pytestmark = pytest.mark.postgres

STALLED = 12  # three times the renewers
LEASE_TTL = 1.5
HOLD = 4.0  # every tool runs for longer than two lease lives


def test_sessions_on_a_silent_store_do_not_let_a_healthy_lease_lapse(
    postgres_url: str, postgres_schema: str, tmp_path: Path
) -> None:
    entered = threading.Barrier(STALLED + 2)

    @tl.tool(effect="non_idempotent", timeout=60)
    def create_ticket(title: str, ctx: tl.ToolContext) -> dict[str, Any]:
        """Open a ticket, slowly."""
        entered.wait(10)
        time.sleep(HOLD)
        (tmp_path / ctx.tool_use_id).write_text(title)
        return {"ticket": ctx.tool_use_id}

    script = [Reply(tool_uses=[ToolUse("create_ticket", {"title": "Outage"})]), Reply(text="ok")]
    direct_url = with_params(postgres_url, schema=postgres_schema, op_timeout="1")
    with running_proxy() as proxy, ScriptedModel(script) as model:
        silent_url = with_params(
            proxy.url(postgres_url),
            schema=postgres_schema,
            op_timeout="1",
            pool_timeout="1",
            connect_timeout="2",
        )
        with tl.open_store(direct_url) as healthy, tl.open_store(silent_url) as silent:

            def run(store: tl.Store, session: str) -> None:
                agent = tl.Agent(
                    client=model.client(),
                    model="m",
                    tools=[create_ticket],
                    store=store,
                    lease_ttl=LEASE_TTL,
                )
                with contextlib.suppress(tl.ToolLedgerError):  # the silent store's runs fail
                    agent.run(session=session, prompt="Checkout is down.")

            threads = [
                threading.Thread(target=run, args=(silent, f"stalled-{n}")) for n in range(STALLED)
            ]
            threads.append(threading.Thread(target=run, args=(healthy, "healthy")))
            for t in threads:
                t.start()
            lapsed: list[float] = []
            try:
                entered.wait(10)
                proxy.set_mode("both", BLACK_HOLE)
                cut_at = time.monotonic()
                while time.monotonic() - cut_at < HOLD - 0.3:
                    lease = healthy.backend.read_lease("healthy")
                    assert lease is not None
                    if lease.expires_at <= healthy.now():
                        lapsed.append(round(time.monotonic() - cut_at, 2))
                    time.sleep(0.05)
            finally:
                proxy.heal()
                for t in threads:
                    t.join(30)
    assert lapsed == [], f"the healthy session's lease lapsed {lapsed[:1]}s after the cut"
