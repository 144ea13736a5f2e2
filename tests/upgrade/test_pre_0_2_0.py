"""Stores written by the code just before 0.2.0's format changes (``make_pre_0_2_0_fixtures.py``,
commit bc31cd9) open with this release on SQLite and JSON: read-only without a byte changing,
then with write access — their branches, their call in doubt and their pending approval intact,
settled and run on.

Each test works on a copy: a store opened with write access may migrate or stamp it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger._verify import Severity, verify
from toolledger.stores.jsonfile._format import FORMAT, FORMAT_FILE
from toolledger.testing import Reply, ScriptedModel

HERE = Path(__file__).parent / "fixtures" / "pre_0_2_0"
MANIFEST: dict[str, Any] = json.loads((HERE / "manifest.json").read_text())


@pytest.fixture(params=["sqlite", "json"])
def copy(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path]:
    """(URL of a private copy of the store, the copy's directory)."""
    if request.param == "sqlite":
        shutil.copy(HERE / "store.db", tmp_path / "store.db")
        return f"sqlite:///{tmp_path / 'store.db'}", tmp_path
    shutil.copytree(HERE / "json", tmp_path / "json")
    return f"json:///{tmp_path / 'json'}", tmp_path / "json"


def digest(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file() and not p.name.endswith(("-wal", "-shm"))
    }


def test_read_only_everything_is_there_and_nothing_changes(copy: tuple[str, Path]) -> None:
    url, where = copy
    before = digest(where)
    with tl.open_store(url, read_only=True) as store:
        statuses = {s.session_id: s.status.value for s in store.session_states()}
        assert statuses == MANIFEST["statuses"]
        (doubt,) = [r for r, _ in store.started()]
        assert (doubt.session_id, doubt.tool) == ("in-doubt", "send_email")
        (request,) = tl.approvals.pending(store)
        assert (request.session_id, request.tool) == ("awaiting-approval", "refund")
        forked = store.session("forked")
        assert forked is not None
        (fork,) = forked.lineage
        assert (fork.kind, fork.source, fork.turn) == (tl.BranchKind.FORK, "completed", 0)
        assert [e.tool for e in fork.effects] == MANIFEST["forked"]["effects"]
        assert fork.note_seq is not None, "the model was told"
        assert sorted(store.abandoned("rewound")) == MANIFEST["rewound"]["abandoned_branches"]
        assert not [p for p in verify(store) if p.severity is Severity.ERROR]
    assert digest(where) == before


def test_with_write_access_every_session_goes_on(copy: tuple[str, Path]) -> None:
    url, where = copy
    with tl.open_store(url) as store:
        assert not [p for p in verify(store) if p.severity is Severity.ERROR]
        (doubt,) = store.ledger("in-doubt").in_doubt()
        settled = store.ledger("in-doubt").resolve(doubt.tool_use_id, happened=True, by="ana")
        assert settled.status is tl.Status.SUCCEEDED
        (request,) = tl.approvals.pending(store)
        call = request.tool_use_id
        tl.approvals.decide(store, "awaiting-approval", call, approved=False, by="ana")
        assert tl.approvals.pending(store) == []
        # The fork runs on: its first request carries the note telling the model of the
        # ticket opened after the fork point, and opens nothing.
        with ScriptedModel([Reply(text="Noted: the ticket is already open.")]) as model:
            agent = tl.Agent(client=model.client(), model="fixture", tools=[], store=store)
            run = agent.run(session="forked")
        assert run.status is tl.RunStatus.COMPLETED
        sent = json.dumps(model.requests[0]["messages"])
        assert "create_ticket" in sent
    if url.startswith("json:"):
        assert json.loads((where / FORMAT_FILE).read_text())["format"] == FORMAT
