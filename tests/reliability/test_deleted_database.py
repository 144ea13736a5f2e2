"""A SQLite database deleted (or replaced) while a store has it open: SQLite would write on into
the unlinked inode, every commit "succeeding" into a file nobody opens again. The store notices at
its next commit: the effect that just happened is raised as an alert, the run stops with a
StoreError, and nothing more is written into the dead file."""

from __future__ import annotations

from pathlib import Path

import pytest

import toolledger as tl
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_database_deleted_while_open_is_noticed(tmp_path: Path, how: str) -> None:
    db = tmp_path / "l.db"
    tickets: list[str] = []
    alerts: list[tl.LedgerWriteError] = []

    @tl.tool
    def create_ticket(title: str) -> str:
        tickets.append(title)
        for p in tmp_path.glob("l.db*"):  # an operator (or a cleanup job) removes the store
            p.unlink()
        if how == "replaced":
            db.write_bytes(b"")
        return "T-1"

    script = [Reply(tool_uses=[ToolUse("create_ticket", {"title": "x"})]), Reply(text="ok")]
    with ScriptedModel(script) as model, tl.open_store(f"sqlite:///{db}") as store:
        agent = tl.Agent(
            client=model.client(),
            model="m",
            tools=[create_ticket],
            store=store,
            on_alert=alerts.append,
        )
        with pytest.raises(tl.StoreUnavailableError, match=f"was {how}"):
            agent.run(session="s", prompt="go")
        assert len(model.requests) == 1, "nothing more was sent to the model"
    assert tickets == ["x"]
    (alert,) = alerts
    assert alert.tool == "create_ticket" and isinstance(alert.cause, tl.StoreUnavailableError)


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_write_ahead_log_deleted_while_open_is_noticed(tmp_path: Path, how: str) -> None:
    """Only the -wal goes (a cleanup of "temporary" files): SQLite appends on to the unlinked
    log, and a process killed before it checkpoints loses every commit since — a call recorded
    as done would run again. The next commit says so instead, and the store closed normally
    keeps what the log held."""
    db = tmp_path / "l.db"
    tickets: list[str] = []
    alerts: list[tl.LedgerWriteError] = []

    @tl.tool
    def create_ticket(title: str) -> str:
        tickets.append(title)
        wal = tmp_path / "l.db-wal"
        wal.unlink()
        if how == "replaced":
            wal.write_bytes(b"")
        return "T-1"

    script = [Reply(tool_uses=[ToolUse("create_ticket", {"title": "x"})]), Reply(text="ok")]
    with ScriptedModel(script) as model, tl.open_store(f"sqlite:///{db}") as store:
        agent = tl.Agent(
            client=model.client(),
            model="m",
            tools=[create_ticket],
            store=store,
            on_alert=alerts.append,
        )
        with pytest.raises(tl.StoreUnavailableError, match=f"write-ahead log .* was {how}"):
            agent.run(session="s", prompt="go")
        assert len(model.requests) == 1, "nothing more was sent to the model"
    assert tickets == ["x"]
    (alert,) = alerts
    assert alert.tool == "create_ticket" and isinstance(alert.cause, tl.StoreUnavailableError)
    with tl.open_store(f"sqlite:///{db}") as store:
        (record,) = store.ledger("s").records()
        assert record.tool == "create_ticket" and record.status is tl.Status.STARTED
