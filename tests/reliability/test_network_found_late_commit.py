"""Found by the network fault tests, fixed: a commit held up on the network longer than
``op_timeout`` must not land *after* the worker has read it back and found it missing.

The worker's connection is cut at ``op_timeout`` and the commit is read back on a fresh
connection (docs/design.md, rule 16). The first transaction was still open on the server, its
``COMMIT`` on its way, so the read-back saw "not landed"; the resend then waited on the first
transaction's row locks, which committed, and the resend took the worker's own rows for someone
else's: a call that never ran was left in doubt (the intent), or the run stopped with
``SessionConflictError`` about a worker that did not exist (the outcome with checkpoint B).

Now the server backend of a connection cut mid-write is ended (``pg_terminate_backend``, waiting
for it to exit) before the store reads or writes anything else, so the read-back is conclusive.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
import toolledger._crash
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

from ..conftest import with_params
from .faultproxy import COMMIT, Fault, FaultProxy, running_proxy

pytestmark = pytest.mark.postgres

OP_TIMEOUT = 1.0
LATE_BY = 1.5  # the commit's connection: every byte takes this long each way


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    with running_proxy() as started:
        yield started


def _agent(url: str, model: ScriptedModel, tickets: Path) -> tuple[tl.Store, tl.Agent]:
    @tl.tool(effect="non_idempotent")
    def create_ticket(title: str, ctx: tl.ToolContext) -> dict[str, Any]:
        """Open a ticket."""
        (tickets / ctx.tool_use_id).write_text(title)
        return {"ticket": ctx.tool_use_id}

    store = tl.open_store(url)
    agent = tl.Agent(
        client=model.client(), model="m", tools=[create_ticket], store=store, lease_ttl=1.5
    )
    return store, agent


def _slow_commit_at(proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    def hook(name: str) -> None:
        if name == point and not proxy.fired:
            proxy.arm(Fault.SLOW_REQUEST, on=COMMIT, latency=LATE_BY)

    monkeypatch.setattr(toolledger._crash, "watchers", [hook])


SCRIPT = [Reply(tool_uses=[ToolUse("create_ticket", {"title": "Outage"})]), Reply(text="ok")]


@pytest.mark.parametrize(
    "point",
    [
        pytest.param("after_checkpoint_a", id="the intent"),
        pytest.param("before_record", id="the outcome with checkpoint B"),
    ],
)
def test_a_late_commit_is_neither_in_doubt_nor_taken_for_another_worker(
    point: str,
    proxy: FaultProxy,
    postgres_url: str,
    postgres_schema: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The commit after ``point`` crawls (every byte of its connection later than
    ``op_timeout``): the intent's used to leave a call that never ran in doubt; the outcome's
    used to stop the run with a ``SessionConflictError`` about a worker that did not exist."""
    tickets = tmp_path / "tickets"
    tickets.mkdir()
    url = with_params(proxy.url(postgres_url), schema=postgres_schema, op_timeout="1")
    _slow_commit_at(proxy, monkeypatch, point)
    with ScriptedModel(SCRIPT) as model:
        store, agent = _agent(url, model, tickets)
        with store:
            run = agent.run(session="s", prompt="Checkout is down.")
            assert proxy.fired[Fault.SLOW_REQUEST] == 1
            assert store.in_doubt() == [], "a call that never ran is in doubt"
            assert run.status is tl.RunStatus.COMPLETED, run.reason
    assert len(list(tickets.iterdir())) == 1
