"""Upgrades lose nothing (docs/design.md, rule 17): stores written by toolledger 0.1.0 open with
this release, on every backend, and every session goes on — counted in the world the tools write.

The stores are in ``fixtures/v0_1_0/`` (made by ``make_v0_1_0_fixtures.py`` running 0.1.0 itself);
``manifest.json`` says what each session holds and what a resume does. Each test works on a copy:
opening a store migrates it in place.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger._lineage import Branch, BranchKind
from toolledger._liveness import Running
from toolledger._verify import verify
from toolledger.ops import AbandonMessages, PutSession
from toolledger.records import Status
from toolledger.testing import ScriptedModel

from ..conftest import drop_schema, with_params
from .fixture_tools import FixtureWorld, replies

HERE = Path(__file__).parent / "fixtures" / "v0_1_0"
MANIFEST: dict[str, Any] = json.loads((HERE / "manifest.json").read_text())
FIXTURE_SCHEMA = "tl_fixture_v0_1_0"


def load_dump(url: str, sql: str, schema: str) -> None:
    """Load a plain ``pg_dump`` into ``schema`` (psql's job, done with psycopg: statements, and
    ``COPY … FROM stdin`` blocks; psql's own ``\\`` commands are skipped)."""
    import psycopg

    sql = sql.replace(FIXTURE_SCHEMA, schema)
    with psycopg.connect(url, autocommit=True) as conn:
        lines = iter(sql.splitlines())
        statement: list[str] = []
        for line in lines:
            if not statement and (line.startswith(("--", "\\")) or not line.strip()):
                continue
            statement.append(line)
            if not line.rstrip().endswith(";"):
                continue
            text = "\n".join(statement)
            statement = []
            if text.startswith("COPY ") and text.rstrip().endswith("FROM stdin;"):
                with conn.cursor() as cur, cur.copy(text) as copy:
                    for row in lines:
                        if row == "\\.":
                            break
                        copy.write(row + "\n")
            else:
                conn.execute(text)


@pytest.fixture(params=["sqlite", "json", "postgres"])
def old_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(backend, URL of a private copy of the 0.1.0 store)."""
    kind = str(request.param)
    if kind == "sqlite":
        shutil.copy(HERE / "v0_1_0.db", tmp_path / "old.db")
        yield kind, f"sqlite:///{tmp_path / 'old.db'}"
    elif kind == "json":
        shutil.copytree(HERE / "v0_1_0_json", tmp_path / "old_json")
        yield kind, f"json:///{tmp_path / 'old_json'}"
    else:
        base = str(request.getfixturevalue("postgres_url"))
        schema = f"tl_upgrade_{uuid.uuid4().hex[:12]}"
        load_dump(base, (HERE / "v0_1_0_postgres.sql").read_text(), schema)
        try:
            yield kind, with_params(base, schema=schema)
        finally:
            drop_schema(base, schema)


def session(name: str) -> dict[str, Any]:
    found: dict[str, Any] = MANIFEST["sessions"][name]
    return found


def fixture(kind: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = MANIFEST["backends"][kind]["sessions"][name]
    return found


def world_of(kind: str, name: str, tmp_path: Path) -> FixtureWorld:
    return FixtureWorld.restore(tmp_path / f"world-{name}", fixture(kind, name)["world"])


def agent(
    store: tl.Store, world: FixtureWorld, model: ScriptedModel, approve: Any = None
) -> tl.Agent:
    return tl.Agent(
        client=model.client(),
        model=MANIFEST["agent"]["model"],
        tools=world.toolset(),
        store=store,
        approve=approve,
    )


def added(world: FixtureWorld, before: dict[str, Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for e in world.executions()[len(before["executions"]) :]:
        counts[e["tool"]] = counts.get(e["tool"], 0) + 1
    return counts


def test_every_record_reads_as_it_was_written(old_store: tuple[str, str]) -> None:
    kind, url = old_store
    with tl.open_store(url) as store:
        for name in MANIFEST["sessions"]:
            want = fixture(kind, name)
            got = {r.tool_use_id: r for r in store.ledger(name).records()}
            assert sorted(got) == sorted(r["tool_use_id"] for r in want["records"])
            for r in want["records"]:
                record = got[r["tool_use_id"]]
                assert (record.tool, record.status.value, record.attempt, record.result) == (
                    r["tool"],
                    r["status"],
                    r["attempt"],
                    r["result"],
                )
                assert record.holder is None and record.deadline is None and record.history == ()
            state = store.backend.read_session(name)
            assert (state.status.value if state else None) == want["status"]
            assert state is None or state.lineage == (), "written before branches: none"
            assert store.abandoned(name) == {}
        problems = [p for p in verify(store) if p.severity.value == "error"]
        assert problems == []


def test_a_completed_session_stays_completed(old_store: tuple[str, str], tmp_path: Path) -> None:
    kind, url = old_store
    s = session("completed")
    world = world_of(kind, "completed", tmp_path)
    before = world.snapshot()
    with tl.open_store(url) as store, ScriptedModel(replies(s["script"])) as model:
        run = agent(store, world, model).run(session="completed", prompt=s["prompt"])
        assert model.requests == [], "the model is not asked again"
    assert run.status is tl.RunStatus.COMPLETED
    assert run.final_text == s["on_resume"]["final_text"]
    assert added(world, before) == {}


def test_a_session_written_before_branches_can_be_rewound(old_store: tuple[str, str]) -> None:
    """The store grew what branches need (the lineage beside the state, the abandoned
    branches): a session 0.1 wrote takes a rewind and keeps its lineage."""
    _, url = old_store
    with tl.open_store(url) as store:
        state = store.session("completed")
        assert state is not None and state.messages >= 2
        messages = store.messages("completed")
        branch = Branch(
            kind=BranchKind.REWIND, source="completed", turn=0, at=2e9, cut=1, note_seq=None,
            branch=1,
        )  # fmt: skip
        moved = replace(state, version=state.version + 1, messages=1, lineage=(branch,))
        rewind = [AbandonMessages(from_seq=1, branch=1), PutSession(moved, state.version)]
        assert store.apply("completed", rewind) == [True, True]
    with tl.open_store(url) as store:
        assert store.session("completed") == moved
        assert store.messages("completed") == messages[:1]
        assert store.abandoned("completed") == {1: messages[1:]}


def test_a_session_written_by_0_1_forked_at_turn_0_replays_nothing(
    old_store: tuple[str, str], tmp_path: Path
) -> None:
    """One lineage, one call per id (docs/design.md, rule 19) holds for sessions 0.1 wrote: a fork
    at turn 0, replaying the recorded answers (ids included), runs none of their calls again, and
    its copies name where the calls were made — records 0.1 wrote have no such field."""
    kind, url = old_store
    world = world_of(kind, "completed", tmp_path)
    before = world.snapshot()
    with tl.open_store(url) as store:
        fork = tl.fork(store, "completed", at_turn=0, new_session="completed-again")
        with ScriptedModel.from_session(store, "completed") as model:
            run = agent(store, world, model).run(session=fork)
        copies = store.ledger(fork).records()
        assert copies and all(r.made_in == "completed" for r in copies)
        assert [p for p in verify(store) if p.severity.value == "error"] == []
    assert run.status is tl.RunStatus.COMPLETED
    assert added(world, before) == {}, "nothing ran again"


@pytest.mark.parametrize("name", ["in-doubt", "needs-attention"])
def test_an_in_doubt_call_waits_for_a_person_then_goes_on(
    old_store: tuple[str, str], tmp_path: Path, name: str
) -> None:
    """The intent 0.1.0 left (no holder, no deadline) names a process that is gone, written
    long ago: it is in doubt — never run again silently."""
    kind, url = old_store
    s = session(name)
    world = world_of(kind, name, tmp_path)
    before = world.snapshot()
    with tl.open_store(url) as store, ScriptedModel(replies(s["script"])) as model:
        first = agent(store, world, model).run(session=name)
        assert first.status is tl.RunStatus.NEEDS_ATTENTION
        (doubt,) = store.ledger(name).in_doubt()
        store.ledger(name).resolve(doubt.tool_use_id, happened=True, by="ana")
        done = agent(store, world, model).run(session=name)
    assert done.status is tl.RunStatus.COMPLETED
    assert done.final_text == s["on_resume"]["final_text"]
    assert added(world, before) == {}, "create_ticket never ran again"
    assert len(world.tickets()) == len(before["tickets"])


def test_a_pending_approval_is_decided_and_used_once(
    old_store: tuple[str, str], tmp_path: Path
) -> None:
    kind, url = old_store
    s = session("awaiting-approval")
    world = world_of(kind, "awaiting-approval", tmp_path)
    before = world.snapshot()
    with tl.open_store(url) as store, ScriptedModel(replies(s["script"])) as model:
        waiting = agent(store, world, model, tl.approvals.queue).run(session="awaiting-approval")
        assert waiting.status is tl.RunStatus.AWAITING_APPROVAL
        (request,) = tl.approvals.pending(store, "awaiting-approval")
        tl.approvals.decide(
            store, "awaiting-approval", request.tool_use_id, approved=True, by="ana"
        )
        done = agent(store, world, model, tl.approvals.queue).run(session="awaiting-approval")
        (used,) = store.backend.read_approvals("awaiting-approval")
    assert done.status is tl.RunStatus.COMPLETED
    assert done.final_text == s["on_resume"]["final_text"]
    assert added(world, before) == {"send_email": 1}
    assert used.status is tl.ApprovalStatus.USED


def test_an_approved_call_runs_once(old_store: tuple[str, str], tmp_path: Path) -> None:
    kind, url = old_store
    s = session("approved")
    world = world_of(kind, "approved", tmp_path)
    before = world.snapshot()
    with tl.open_store(url) as store, ScriptedModel(replies(s["script"])) as model:
        run = agent(store, world, model, tl.approvals.queue).run(session="approved")
        again = agent(store, world, model, tl.approvals.queue).run(session="approved")
        (used,) = store.backend.read_approvals("approved")
        (record,) = [r for r in store.ledger("approved").records() if r.tool == "send_email"]
    assert run.status is again.status is tl.RunStatus.COMPLETED
    assert added(world, before) == {"send_email": 1}
    assert used.status is tl.ApprovalStatus.USED
    assert record.status is Status.SUCCEEDED and record.approved_by == "ana"


def test_a_ledger_used_alone_answers_from_its_records(
    old_store: tuple[str, str], tmp_path: Path
) -> None:
    kind, url = old_store
    want = fixture(kind, "ledger-only")
    world = world_of(kind, "ledger-only", tmp_path)
    before = world.snapshot()
    content = [
        {"type": "tool_use", "id": c["tool_use_id"], "name": c["name"], "input": c["input"]}
        for c in want["tool_calls"]
    ]
    with tl.open_store(url) as store:
        results = tl.run_tool_uses(content, world.toolset(), ledger=store.ledger("ledger-only"))
    assert [r.get("is_error", False) for r in results] == [False, True]
    assert json.loads(results[0]["content"])["id"] == "T-0001"
    assert "no ticket T-9999" in results[1]["content"]
    assert added(world, before) == {}


def test_a_lease_0_1_left_behind(old_store: tuple[str, str]) -> None:
    """A 0.1.0 lease names ``host:pid`` only, which proves nothing: a pid this process table
    lacks may be a live worker of another PID namespace with this hostname (a container on the
    host's network). On the host that wrote it too, it holds as any lease whose holder no table
    can judge: until it expires on the server's clock, or is watched unrenewed for its time to
    live (toolledger 0.1 freed it at once on a gone pid)."""
    kind, url = old_store
    with tl.open_store(url) as store:
        lease = store.backend.read_lease("leased")
        assert lease is not None and lease.holder is None
        assert lease.owner.split(":")[0] == MANIFEST["written_by"]["host"]
        verdict = store.lease_state(lease)
    assert isinstance(verdict, Running), (kind, verdict)
    assert "ended" not in verdict.why
