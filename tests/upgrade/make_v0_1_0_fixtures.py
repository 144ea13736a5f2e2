"""Write the upgrade fixtures of toolledger 0.1.0: stores that 0.1.0 itself wrote, for later
releases to open and resume ("upgrades lose nothing").

**Run this with toolledger 0.1.0 — commit 8e94cf8 — never with a later source tree.** The
fixtures are worth something only if the release they are named after wrote them. From a clone of
the repository:

    git worktree add --detach /tmp/tl-0.1.0 8e94cf8
    python3 -m venv /tmp/tl-0.1.0/.venv
    /tmp/tl-0.1.0/.venv/bin/pip install -e '/tmp/tl-0.1.0[dev,all]'
    /tmp/tl-0.1.0/.venv/bin/python tests/upgrade/make_v0_1_0_fixtures.py
    git worktree remove --force /tmp/tl-0.1.0

(run from the checkout that keeps the fixtures; ``--postgres URL`` names the server, by default
``$TOOLLEDGER_TEST_POSTGRES_URL`` or ``postgresql://postgres@127.0.0.1:5432/test``, and ``pg_dump``
and ``psql`` must be on ``PATH``). The script refuses to run when the ``toolledger`` it imports is
not 0.1.0, or is a git checkout at another commit or with local changes.

It writes, in ``fixtures/v0_1_0/`` beside this file:

* ``v0_1_0.db`` — ``sqlite:///`` (checkpointed: no ``-wal``/``-shm`` needed);
* ``v0_1_0_json/`` — ``json:///``;
* ``v0_1_0_postgres.sql`` — ``pg_dump --schema=tl_fixture_v0_1_0 --no-owner --no-privileges``
  of ``postgresql://…?schema=tl_fixture_v0_1_0`` (the schema is dropped afterwards; load it with
  ``psql URL -f v0_1_0_postgres.sql`` and open ``URL?schema=tl_fixture_v0_1_0``);
* ``manifest.json`` — what each session holds and what its script does next.

Each store holds the same seven sessions (``SESSIONS``), made by really running 0.1.0's ``Agent``
and ``run_tool_uses`` against ``toolledger.testing.ScriptedModel`` through the real ``anthropic``
SDK, with the tools of ``fixture_tools.py``; the kills are real ``SIGKILL``s of forked processes at
0.1.0's crash points. The model mints tool_use ids from the session name and the response number,
so the ids — and the worlds — are the same in every backend and every regeneration; timestamps,
worker names and lease owners are not.

Then it checks the result with 0.1.0, on copies: ``toolledger sessions``, ``in-doubt`` and
``verify`` on each store (the only warnings allowed are the two in-doubt calls), and every
session resumed as the manifest's ``on_resume`` says (``--no-check`` skips this).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import multiprocessing
import os
import platform
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # fixture_tools, as a plain module (this runs as a script)

import anthropic  # noqa: E402 - imported once here, inherited by every forked child
from fixture_tools import TOOLS, FixtureWorld, replies  # noqa: E402

import toolledger as tl  # noqa: E402
from toolledger.testing import ScriptedModel, arm_crash  # noqa: E402

RELEASE = "0.1.0"
RELEASE_COMMIT = "8e94cf835b3cc7a1df3131b4fa340d984f2c415d"
OUT = HERE / "fixtures" / "v0_1_0"
SQLITE_FILE = "v0_1_0.db"
JSON_DIR = "v0_1_0_json"
PG_DUMP = "v0_1_0_postgres.sql"
PG_SCHEMA = "tl_fixture_v0_1_0"
DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"
MODEL = "claude-scripted"
KILLED = -9
# The "leased" session's lease: held by a killed process until 2100-01-01 (UTC), give or take the
# few seconds between taking it and the kill.
LEASE_UNTIL = 4102444800.0

GITIGNORE = (
    "# The repository ignores *.db; this one, written by toolledger 0.1.0, is a fixture.\n"
    "!v0_1_0.db\n"
)

REGENERATE = (
    "git worktree add --detach /tmp/tl-0.1.0 8e94cf8 && python3 -m venv /tmp/tl-0.1.0/.venv && "
    "/tmp/tl-0.1.0/.venv/bin/pip install -e '/tmp/tl-0.1.0[dev,all]' && "
    "/tmp/tl-0.1.0/.venv/bin/python tests/upgrade/make_v0_1_0_fixtures.py && "
    "git worktree remove --force /tmp/tl-0.1.0"
)

TICKET = {"name": "create_ticket", "input": {"title": "Checkout returns 502 for acme-corp"}}
EMAIL = {"name": "send_email", "input": {"to": "ops@acme.example", "subject": "Outage update"}}

# Every session, as data: how it is made and what its script does next. A ScriptedModel picks the
# step by the number of assistant turns in the request, so resuming with the whole ``script``
# plays ``script[next_script_index:]``.
SESSIONS: dict[str, dict[str, Any]] = {
    "completed": {
        "description": "a finished agent session: a non-idempotent call, a read-only call, "
        "then the final text",
        "prompt": "Checkout returns 502 for acme-corp. Open a ticket.",
        "approver": None,
        "script": [
            {"text": "Opening a ticket.", "tool_uses": [TICKET]},
            {"tool_uses": [{"name": "list_tickets", "input": {}}]},
            {"text": "Ticket T-0001 is open."},
        ],
        "how": "Agent.run to the end",
        "on_resume": {
            "same_prompt": "returns the completed run as it is: the model is not asked, "
            "nothing runs",
            "status": "completed",
            "final_text": "Ticket T-0001 is open.",
            "executions_added": {},
        },
    },
    "in-doubt": {
        "description": "killed (SIGKILL) at crash point before_record while the plain "
        "non-idempotent create_ticket ran: its record is started (in doubt), the session "
        "running",
        "prompt": "The login page is down. Open a ticket.",
        "approver": None,
        "script": [
            {"tool_uses": [{"name": "create_ticket", "input": {"title": "Login page is down"}}]},
            {"text": "Ticket opened."},
        ],
        "how": "Agent.run in a forked process armed with arm_crash('before_record'): the tool "
        "returned (its ticket exists in the world), its outcome was never written",
        "on_resume": {
            "approver": None,
            "status": "needs_attention",
            "executions_added": {},
            "then": "Ledger.resolve(tool_use_id, happened=True) and run again: completed with "
            "'Ticket opened.', create_ticket never runs again",
            "status_after_resolve": "completed",
            "final_text": "Ticket opened.",
        },
    },
    "needs-attention": {
        "description": "killed like in-doubt, then resumed with no approver: stopped "
        "needs_attention, the call still in doubt",
        "prompt": "Invoices fail to render. Open a ticket.",
        "approver": None,
        "script": [
            {
                "tool_uses": [
                    {"name": "create_ticket", "input": {"title": "Invoices fail to render"}}
                ]
            },
            {"text": "Ticket opened."},
        ],
        "how": "Agent.run killed at before_record, then Agent.run (no approver) in another process",
        "on_resume": {
            "approver": None,
            "status": "needs_attention",
            "executions_added": {},
            "then": "Ledger.resolve(tool_use_id, happened=True) and run again: completed with "
            "'Ticket opened.', create_ticket never runs again",
            "status_after_resolve": "completed",
            "final_text": "Ticket opened.",
        },
    },
    "awaiting-approval": {
        "description": "stopped awaiting_approval: the high-impact send_email waits in the "
        "approval queue (pending), nothing ran",
        "prompt": "Tell acme-corp about the outage.",
        "approver": "queue",
        "script": [{"tool_uses": [EMAIL]}, {"text": "acme-corp has been told."}],
        "how": "Agent.run with approve=toolledger.approvals.queue",
        "on_resume": {
            "approver": "queue",
            "status": "awaiting_approval",
            "executions_added": {},
            "then": "toolledger.approvals.decide(store, session, tool_use_id, approved=True, "
            "by='ana') and run again with approve=queue: completed, send_email runs once",
            "status_after_approval": "completed",
            "final_text": "acme-corp has been told.",
        },
    },
    "approved": {
        "description": "like awaiting-approval, then approved by 'ana' "
        "(toolledger.approvals.decide) and not yet run",
        "prompt": "Tell acme-corp the outage is over.",
        "approver": "queue",
        "script": [{"tool_uses": [EMAIL]}, {"text": "acme-corp has been told."}],
        "how": "Agent.run with approve=queue, then approvals.decide(..., approved=True, by='ana')",
        "on_resume": {
            "approver": "queue",
            "status": "completed",
            "final_text": "acme-corp has been told.",
            "executions_added": {"send_email": 1},
            "record": {"status": "succeeded", "approved_by": "ana"},
            "approval_status_after": "used",
        },
    },
    "ledger-only": {
        "description": "a ledger used only through run_tool_uses (no agent state): "
        "create_ticket succeeded, add_comment failed",
        "approver": None,
        "tool_uses": [
            {"name": "create_ticket", "input": {"title": "Search is slow"}},
            {"name": "add_comment", "input": {"ticket_id": "T-9999", "text": "Seen again."}},
        ],
        "how": "run_tool_uses on one message with both tool_use blocks",
        "on_resume": {
            "run_tool_uses": "the same content returns the stored results: create_ticket's "
            "ticket, and add_comment's is_error 'no ticket T-9999'; nothing runs",
            "executions_added": {},
        },
    },
    "leased": {
        "description": "killed (SIGKILL) at crash point after_checkpoint_b of its first turn "
        "(a read-only list_tickets) while holding the session's lease until 2100: status "
        "running, the lease's owner a process of the generating host that no longer exists",
        "prompt": "Are there open tickets?",
        "approver": None,
        "script": [
            {"tool_uses": [{"name": "list_tickets", "input": {}}]},
            {"text": "There are no open tickets."},
        ],
        "how": "Agent.run(lease_ttl≈until 2100) in a forked process armed with "
        "arm_crash('after_checkpoint_b')",
        "on_resume": {
            "on_the_generating_host": "the holder's process is gone: the lease is taken over at "
            "once (token + 1) and the run completes with 'There are no open tickets.'; "
            "list_tickets does not run again",
            "on_another_host": "the holder cannot be checked: SessionBusyError until "
            "lease.expires_at",
            "status": "completed",
            "final_text": "There are no open tickets.",
            "executions_added": {},
        },
    },
}


# -- the release check ---------------------------------------------------------------------------


def check_release() -> str:
    """Refuse any toolledger but 0.1.0; return how it was found."""
    src = Path(tl.__file__).resolve().parent
    if tl.__version__ != RELEASE:
        sys.exit(f"toolledger {tl.__version__} from {src}: these fixtures need {RELEASE}")
    git = ["git", "-C", str(src)]
    found = subprocess.run([*git, "rev-parse", "HEAD"], check=False, capture_output=True, text=True)
    if found.returncode != 0:
        return f"toolledger {RELEASE} installed at {src} (not a git checkout)"
    head = found.stdout.strip()
    if head != RELEASE_COMMIT:
        sys.exit(f"toolledger at {src} is commit {head}, not {RELEASE_COMMIT} ({RELEASE})")
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--", "."], capture_output=True, text=True, check=True
    ).stdout.strip()
    if dirty:
        sys.exit(f"toolledger at {src} has local changes:\n{dirty}")
    return f"toolledger {RELEASE} from {src}, commit {head}, clean"


# -- the model -----------------------------------------------------------------------------------


class FixtureModel(ScriptedModel):
    """``ScriptedModel`` minting its ids from ``label`` and the response number: fresh for every
    response, as the API's, and the same on every regeneration."""

    def __init__(self, steps: list[dict[str, Any]], *, label: str) -> None:
        super().__init__(replies(steps), model=MODEL)
        self.label = label
        self.responses = 0
        self._count = threading.Lock()

    def reply(self, path: str, reply: Any, body: dict[str, Any]) -> dict[str, Any]:
        out = super().reply(path, reply, body)
        with self._count:
            n = self.responses
            self.responses += 1
        out["id"] = "msg_" + _hex(f"v0_1_0:{self.label}:{n}")
        uses = [b for b in out["content"] if b["type"] == "tool_use"]
        for i, block in enumerate(uses):
            block["id"] = tool_use_id(self.label, n, i)
        return out


def _hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def tool_use_id(label: str, response: int, index: int) -> str:
    return "toolu_" + _hex(f"v0_1_0:{label}:{response}:{index}")


# -- forked processes ----------------------------------------------------------------------------


def forked(target: Callable[..., Any], *args: Any, timeout: float = 120) -> tuple[int, Any, int]:
    """Run ``target(*args)`` in a forked process; return its exit code (``-9`` when killed), the
    JSON it returned (``None`` when it returned nothing) and its pid."""
    fd, name = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    result = Path(name)
    proc = multiprocessing.get_context("fork").Process(target=_child, args=(target, args, result))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        raise TimeoutError(f"{target.__name__}{args!r:.200} did not finish in {timeout}s")
    try:
        text = result.read_text()
    finally:
        result.unlink(missing_ok=True)
    assert proc.exitcode is not None and proc.pid is not None
    return proc.exitcode, json.loads(text) if text else None, proc.pid


def _child(target: Callable[..., Any], args: tuple[Any, ...], result: Path) -> None:
    try:
        out = target(*args)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    result.write_text(json.dumps(out))


def agent_child(
    url: str,
    base_url: str,
    world: str,
    session: str,
    prompt: str,
    approver: str | None,
    crash_at: str | None = None,
    lease_ttl: float = 30.0,
) -> dict[str, Any]:
    arm_crash(crash_at)
    client = anthropic.Anthropic(base_url=base_url, api_key="scripted", max_retries=0)
    with tl.open_store(url) as store:
        agent = tl.Agent(
            client=client,
            model=MODEL,
            tools=FixtureWorld(world).toolset(),
            store=store,
            approve=tl.approvals.queue if approver == "queue" else None,
            lease_ttl=lease_ttl,
        )
        run = agent.run(session=session, prompt=prompt)
        return {
            "status": run.status.value,
            "reason": run.reason,
            "turns": run.turns,
            "final_text": run.final_text,
        }


def approve_child(url: str, session: str) -> dict[str, Any]:
    with tl.open_store(url) as store:
        (request,) = tl.approvals.pending(store, session)
        decided = tl.approvals.decide(store, session, request.tool_use_id, approved=True, by="ana")
        return {"tool_use_id": decided.tool_use_id, "status": decided.status.value}


def ledger_content(session: str, uses: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The one message of tool_use blocks that the ledger-only session ran."""
    return [
        {
            "type": "tool_use",
            "id": tool_use_id(session, 0, i),
            "name": u["name"],
            "input": u["input"],
        }
        for i, u in enumerate(uses)
    ]


def ledger_child(url: str, session: str, world: str, uses: list[dict[str, Any]]) -> Any:
    content = ledger_content(session, uses)
    with tl.open_store(url) as store:
        ledger = store.ledger(session)
        return tl.run_tool_uses(content, FixtureWorld(world).toolset(), ledger=ledger)


def _plain(value: Any) -> Any:
    if value is None:
        return None
    return json.loads(json.dumps(dataclasses.asdict(value)))


def read_child(url: str, names: list[str]) -> dict[str, Any]:
    """Everything the store holds, session by session, as plain data."""
    with tl.open_store(url) as store:
        backend = store.backend
        out: dict[str, Any] = {
            "session_ids": store.sessions(),
            "in_doubt": [[r.session_id, r.tool_use_id] for r in store.in_doubt()],
            "sessions": {},
        }
        for sid in names:
            state = backend.read_session(sid)
            messages = backend.read_messages(sid) if state is not None else []
            calls = [
                {"name": b["name"], "tool_use_id": b["id"], "input": b["input"]}
                for m in messages
                if m.role == "assistant" and isinstance(m.content, list)
                for b in m.content
                if b.get("type") == "tool_use"
            ]
            out["sessions"][sid] = {
                "state": _plain(state),
                "transcript": [{"role": m.role, "content": m.content} for m in messages],
                "tool_calls": calls,
                "records": [_plain(r) for r in store.ledger(sid).records()],
                "approvals": [_plain(a) for a in backend.read_approvals(sid)],
                "lease": _plain(backend.read_lease(sid)),
            }
        return out


# -- making the sessions -------------------------------------------------------------------------


def expect(code: int, result: Any, status: str | None, what: str) -> None:
    if status is None:
        ok = code == KILLED
    else:
        ok = code == 0 and result is not None and result.get("status") == status
    if not ok:
        wanted = "killed (-9)" if status is None else status
        raise AssertionError(f"{what}: wanted {wanted}, got exit {code} and {result}")


def make_sessions(url: str, worlds: Path) -> dict[str, dict[str, Any]]:
    """Create every session of ``SESSIONS`` in the store at ``url``; return each one's world
    snapshot and the owner pid of the leased session."""
    made: dict[str, dict[str, Any]] = {}
    for name, spec in SESSIONS.items():
        world = worlds / name
        FixtureWorld(world)
        info: dict[str, Any] = {}
        if name == "ledger-only":
            code, results, _ = forked(ledger_child, url, name, str(world), spec["tool_uses"])
            assert code == 0 and results is not None, (code, results)
            flags = [bool(r.get("is_error")) for r in results]
            assert flags == [False, True], results
            made[name] = {"world": FixtureWorld(world).snapshot(), "results": results}
            continue
        with FixtureModel(spec["script"], label=name) as model:
            args = (url, model.url, str(world), name, spec["prompt"], spec["approver"])
            if name == "completed":
                expect(*forked(agent_child, *args)[:2], "completed", name)
            elif name in ("in-doubt", "needs-attention"):
                expect(*forked(agent_child, *args, "before_record")[:2], None, name)
                if name == "needs-attention":
                    expect(*forked(agent_child, *args)[:2], "needs_attention", name)
            elif name in ("awaiting-approval", "approved"):
                expect(*forked(agent_child, *args)[:2], "awaiting_approval", name)
                if name == "approved":
                    code, decided, _ = forked(approve_child, url, name)
                    assert code == 0 and decided and decided["status"] == "approved", decided
            elif name == "leased":
                ttl = LEASE_UNTIL - time.time()
                code, result, pid = forked(agent_child, *args, "after_checkpoint_b", ttl)
                expect(code, result, None, name)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 0)
                    raise AssertionError(f"pid {pid} of the killed holder exists again")
                info["owner_pid"] = pid
            else:
                raise AssertionError(name)
            assert not model.rejected, model.rejected
        made[name] = {"world": FixtureWorld(world).snapshot(), **info}
    return made


def describe(read: dict[str, Any], made: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The manifest's view of one store, checked against what each session must be."""
    sessions: dict[str, Any] = {}
    host = socket.gethostname()
    for name, data in read["sessions"].items():
        spec = SESSIONS[name]
        state = data["state"]
        assistant_turns = sum(1 for m in data["transcript"] if m["role"] == "assistant")
        entry: dict[str, Any] = {
            "status": state["status"] if state else None,
            "reason": state["reason"] if state else None,
            "state": state,
            "tool_calls": data["tool_calls"],
            "records": data["records"],
            "approvals": data["approvals"],
            "lease": data["lease"],
            "transcript": data["transcript"],
            "world": made[name]["world"],
        }
        if "script" in spec:
            entry["next_script_index"] = assistant_turns
            entry["remaining_script"] = spec["script"][assistant_turns:]
        else:
            content = ledger_content(name, spec["tool_uses"])
            entry["tool_calls"] = [
                {"name": b["name"], "tool_use_id": b["id"], "input": b["input"]} for b in content
            ]
            entry["run_tool_uses_content"] = content
            entry["run_tool_uses_results"] = made[name]["results"]
        if name == "leased":
            lease = data["lease"]
            entry["lease_holder"] = {
                "host": host,
                "pid": made[name]["owner_pid"],
                "process_exists": False,
                "note": "the owner is host:pid:…; only on this host can a later run see that "
                "the pid is gone",
            }
            assert lease["owner"].startswith(f"{host}:{made[name]['owner_pid']}:"), lease
            assert lease["expires_at"] > LEASE_UNTIL - 3600, lease
        check_session(name, entry)
        sessions[name] = entry
    return sessions


def check_session(name: str, e: dict[str, Any]) -> None:
    """What each session must hold; a fixture that is not what it claims fails here."""
    records = {r["tool_use_id"]: r for r in e["records"]}
    statuses = sorted((r["tool"], r["status"], r["attempt"]) for r in e["records"])
    approvals = [(a["tool"], a["status"], a["decided_by"]) for a in e["approvals"]]
    calls = [c["name"] for c in e["tool_calls"]]
    if name == "completed":
        assert e["status"] == "completed" and calls == ["create_ticket", "list_tickets"]
        assert statuses == [("create_ticket", "succeeded", 1), ("list_tickets", "succeeded", 1)], (
            statuses
        )
        assert len(e["world"]["tickets"]) == 1 and e["remaining_script"] == []
    elif name in ("in-doubt", "needs-attention"):
        want = "running" if name == "in-doubt" else "needs_attention"
        assert e["status"] == want, e["status"]
        assert statuses == [("create_ticket", "started", 1)], statuses
        assert len(e["world"]["tickets"]) == 1, "the killed call's ticket exists"
        assert [x["tool"] for x in e["world"]["executions"]] == ["create_ticket"]
    elif name == "awaiting-approval":
        assert e["status"] == "awaiting_approval" and calls == ["send_email"]
        assert statuses == [] and approvals == [("send_email", "pending", None)]
        assert e["world"]["emails"] == []
    elif name == "approved":
        assert e["status"] == "awaiting_approval" and calls == ["send_email"]
        assert statuses == [] and approvals == [("send_email", "approved", "ana")]
        assert e["world"]["emails"] == []
    elif name == "ledger-only":
        assert e["state"] is None and e["transcript"] == [] and e["lease"] is None
        assert statuses == [("add_comment", "failed", 1), ("create_ticket", "succeeded", 1)], e[
            "records"
        ]
    elif name == "leased":
        assert e["status"] == "running" and calls == ["list_tickets"]
        assert statuses == [("list_tickets", "succeeded", 1)]
        assert [m["role"] for m in e["transcript"]] == ["user", "assistant", "user"]
    assert all(r["worker"] for r in records.values())


# -- the backends --------------------------------------------------------------------------------


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="tl-v0_1_0-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def pg_urls(base: str) -> tuple[str, str]:
    """(the URL psql takes, the store URL with ``?schema=``)."""
    parts = urlsplit(base)
    plain = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
    return plain, f"{plain}?schema={PG_SCHEMA}"


def psql(plain: str, *args: str) -> str:
    return subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", plain, *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def drop_schema(plain: str) -> None:
    psql(plain, "-c", f'DROP SCHEMA IF EXISTS "{PG_SCHEMA}" CASCADE')


def checkpoint_sqlite(path: Path) -> None:
    """Fold the WAL into the file and close: the .db alone is the whole store."""
    conn = sqlite3.connect(path)
    try:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert busy == 0, "the WAL could not be checkpointed: is a process still using it?"
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    for suffix in ("-wal", "-shm"):
        leftover = path.with_name(path.name + suffix)
        assert not leftover.exists(), f"{leftover} is still there after the checkpoint"


def generate(work: Path, pg_base: str) -> dict[str, Any]:
    """Every store, written to ``work`` and then moved into ``OUT``; the manifest's backends."""
    backends: dict[str, Any] = {}
    names = list(SESSIONS)

    db = work / SQLITE_FILE
    url = f"sqlite:///{db}"
    made = make_sessions(url, work / "worlds-sqlite")
    _, read, _ = forked(read_child, url, names)
    checkpoint_sqlite(db)
    backends["sqlite"] = {
        "file": SQLITE_FILE,
        "url": "sqlite:///{copy of the file}",
        "sessions": describe(read, made),
        "session_ids": read["session_ids"],
        "in_doubt": read["in_doubt"],
    }

    jdir = work / JSON_DIR
    url = f"json:///{jdir}"
    made = make_sessions(url, work / "worlds-json")
    _, read, _ = forked(read_child, url, names)
    backends["json"] = {
        "dir": JSON_DIR,
        "url": "json:///{copy of the directory}",
        "files": sorted(p.name for p in jdir.iterdir()),
        "sessions": describe(read, made),
        "session_ids": read["session_ids"],
        "in_doubt": read["in_doubt"],
    }

    plain, url = pg_urls(pg_base)
    drop_schema(plain)
    try:
        made = make_sessions(url, work / "worlds-postgres")
        _, read, _ = forked(read_child, url, names)
        dump = subprocess.run(
            ["pg_dump", f"--schema={PG_SCHEMA}", "--no-owner", "--no-privileges", plain],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        (work / PG_DUMP).write_text(dump)
    finally:
        drop_schema(plain)
    backends["postgres"] = {
        "dump": PG_DUMP,
        "schema": PG_SCHEMA,
        "load": f"psql POSTGRES_URL -f {PG_DUMP} (the schema {PG_SCHEMA} must not exist)",
        "pg_dump": subprocess.run(
            ["pg_dump", "--version"], check=True, capture_output=True, text=True
        ).stdout.strip(),
        "dump_note": "a plain dump by this pg_dump: it opens and closes with psql's \\restrict "
        "/ \\unrestrict meta-commands, which psql 13.22, 14.19, 15.14, 16.10, 17.6 or newer "
        "understands; an older psql needs those two lines removed",
        "url": f"POSTGRES_URL?schema={PG_SCHEMA}",
        "sessions": describe(read, made),
        "session_ids": read["session_ids"],
        "in_doubt": read["in_doubt"],
    }

    same_everywhere(backends)
    if OUT.exists():
        for old in (OUT / SQLITE_FILE, OUT / PG_DUMP):
            old.unlink(missing_ok=True)
        shutil.rmtree(OUT / JSON_DIR, ignore_errors=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / ".gitignore").write_text(GITIGNORE)
    shutil.copy2(db, OUT / SQLITE_FILE)
    shutil.copytree(jdir, OUT / JSON_DIR)
    shutil.copy2(work / PG_DUMP, OUT / PG_DUMP)
    return backends


def same_everywhere(backends: dict[str, Any]) -> None:
    """Every backend holds the same sessions: ids, statuses, records and worlds."""

    def shape(b: dict[str, Any]) -> Any:
        return {
            name: (
                e["status"],
                e["tool_calls"],
                [(r["tool_use_id"], r["status"], r["attempt"], r["result"]) for r in e["records"]],
                [(a["tool_use_id"], a["status"], a["decided_by"]) for a in e["approvals"]],
                e["world"],
                e.get("remaining_script"),
            )
            for name, e in b["sessions"].items()
        }

    first, *rest = backends.values()
    for other in rest:
        assert shape(other) == shape(first), "the backends' sessions differ"


def manifest(backends: dict[str, Any], found: str) -> dict[str, Any]:
    sessions = {
        name: {k: v for k, v in spec.items() if k != "how"} | {"made_by": spec["how"]}
        for name, spec in SESSIONS.items()
    }
    return {
        "fixture_format": 1,
        "written_by": {
            "toolledger": RELEASE,
            "commit": RELEASE_COMMIT,
            "found": found,
            "anthropic": anthropic.__version__,
            "python": platform.python_version(),
            "host": socket.gethostname(),
            "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        },
        "regenerate": REGENERATE,
        "generator": "tests/upgrade/make_v0_1_0_fixtures.py",
        "agent": {
            "model": MODEL,
            "system": None,
            "max_tokens": 4096,
            "client": "anthropic.Anthropic(base_url=ScriptedModel.url, api_key='scripted', "
            "max_retries=0)",
            "approvers": {"null": "approve=None", "queue": "approve=toolledger.approvals.queue"},
        },
        "tools": {
            "module": "tests/upgrade/fixture_tools.py",
            "world": "FixtureWorld(path).toolset(); FixtureWorld.restore(path, "
            "session['world']) lays out the world a session's store expects (one world "
            "per session)",
            "declarations": TOOLS,
        },
        "notes": [
            "Open copies: opening a store may migrate it in place (and SQLite adds -wal/-shm).",
            "A ScriptedModel picks its reply by the number of assistant turns in the request: "
            "resume with the session's whole script (fixture_tools.replies(script)); it plays "
            "script[next_script_index:], which is remaining_script.",
            "tool_use ids, transcripts, records' results and worlds are the same in every "
            "backend; timestamps, workers and lease owners differ.",
            "The json directory holds what 0.1.0 left, .toolledger.lock (empty) included.",
            "The leased session's lease owner names the generating host (written_by.host): on "
            "any other host the holder cannot be checked and the lease holds until its "
            "expires_at (2100).",
            "in-doubt's lease was held by the killed process with a 30 s ttl: it has expired "
            "(and its holder is gone). The other agent sessions' leases were given back "
            "(expires_at 0); ledger-only has none.",
        ],
        "sessions": sessions,
        "backends": backends,
    }


# -- the check, with 0.1.0, on copies ------------------------------------------------------------


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolledger.cli", "--store", url, *args],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "160"},
    )


def check_cli(kind: str, url: str) -> None:
    for command in ("sessions", "in-doubt", "verify"):
        done = cli(url, command)
        print(f"$ toolledger --store <{kind}> {command}  (exit {done.returncode})")
        print(done.stdout.rstrip() or "(nothing)")
        if done.stderr:
            print(done.stderr.rstrip())
        if command == "sessions":
            assert done.returncode == 0, done
    report = json.loads(cli(url, "--json", "verify").stdout)
    problems = report["problems"]
    errors = [p for p in problems if p["severity"] == "error"]
    doubted = sorted(p["session_id"] for p in problems if p["severity"] == "warning")
    assert not errors, errors
    assert doubted == ["in-doubt", "needs-attention"], problems
    listed = json.loads(cli(url, "--json", "sessions").stdout)
    states = {s["session_id"]: s["status"] for s in listed["sessions"]}
    assert states == {
        "completed": "completed",
        "in-doubt": "running",
        "needs-attention": "needs_attention",
        "awaiting-approval": "awaiting_approval",
        "approved": "awaiting_approval",
        "leased": "running",
    }, states
    assert listed["ledger_only"] == ["ledger-only"], listed


def resolve_child(url: str, session: str) -> str:
    with tl.open_store(url) as store:
        (doubt,) = store.ledger(session).in_doubt()
        store.ledger(session).resolve(doubt.tool_use_id, happened=True, by="check")
        return doubt.tool_use_id


def check_resume(kind: str, url: str, backend: dict[str, Any], worlds: Path) -> None:
    """Resume every session of a copy with 0.1.0, as the manifest's ``on_resume`` says."""
    for name, spec in SESSIONS.items():
        entry = backend["sessions"][name]
        world = FixtureWorld.restore(worlds / name, entry["world"])
        before = len(world.executions())
        if name == "ledger-only":
            code, results, _ = forked(ledger_child, url, name, str(world.path), spec["tool_uses"])
            assert code == 0 and results is not None
            assert [bool(r.get("is_error")) for r in results] == [False, True], results
            assert json.loads(results[0]["content"])["id"] == entry["world"]["tickets"][0]["id"]
        else:
            with FixtureModel(spec["script"], label=f"{name}/check") as model:
                args = (url, model.url, str(world.path), name, spec["prompt"], spec["approver"])
                code, result, _ = forked(agent_child, *args)
                if name in ("in-doubt", "needs-attention"):
                    expect(code, result, "needs_attention", f"{kind} {name}")
                    forked(resolve_child, url, name)
                    code, result, _ = forked(agent_child, *args)
                elif name == "awaiting-approval":
                    expect(code, result, "awaiting_approval", f"{kind} {name}")
                    forked(approve_child, url, name)
                    code, result, _ = forked(agent_child, *args)
                expect(code, result, "completed", f"{kind} {name}")
                assert result["final_text"] == spec["script"][-1]["text"], result
                assert not model.rejected, model.rejected
                if name == "completed":
                    assert model.requests == [], "a completed session asked the model again"
        added = [e["tool"] for e in world.executions()[before:]]
        if name in ("approved", "awaiting-approval"):
            assert added == ["send_email"], added
        else:
            assert added == [], (name, added)
        _, after, _ = forked(read_child, url, [name])
        after = after["sessions"][name]
        if name == "approved":
            (record,) = after["records"]
            assert (record["status"], record["approved_by"]) == ("succeeded", "ana"), record
            assert [a["status"] for a in after["approvals"]] == ["used"], after["approvals"]
        if name == "leased":
            old, new = entry["lease"], after["lease"]
            assert new["token"] == old["token"] + 1 and new["owner"] != old["owner"], (old, new)
        print(f"  {kind}: {name} resumed as on_resume says")


def check(pg_base: str, backends: dict[str, Any]) -> None:
    with scratch() as work:
        shutil.copy2(OUT / SQLITE_FILE, work / SQLITE_FILE)
        shutil.copytree(OUT / JSON_DIR, work / JSON_DIR)
        urls = {"sqlite": f"sqlite:///{work / SQLITE_FILE}", "json": f"json:///{work / JSON_DIR}"}
        plain, urls["postgres"] = pg_urls(pg_base)
        drop_schema(plain)
        try:
            psql(plain, "-f", str(OUT / PG_DUMP))
            for kind, url in urls.items():
                check_cli(kind, url)
            for kind, url in urls.items():
                check_resume(kind, url, backends[kind], work / f"worlds-{kind}")
        finally:
            drop_schema(plain)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--postgres",
        default=os.environ.get("TOOLLEDGER_TEST_POSTGRES_URL") or DEFAULT_PG,
        help=f"the PostgreSQL server (its schema {PG_SCHEMA} is created, dumped and dropped)",
    )
    parser.add_argument("--no-check", action="store_true", help="skip the check on copies")
    args = parser.parse_args()
    found = check_release()
    print(found)
    with scratch() as work:
        backends = generate(work, args.postgres)
    data = manifest(backends, found)
    (OUT / "manifest.json").write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT}")
    if not args.no_check:
        check(args.postgres, backends)
        print("checked: every store opens with 0.1.0 and every session goes on")


if __name__ == "__main__":
    main()
