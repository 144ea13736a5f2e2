"""``toolledger demo``: the story toolledger exists for, end to end, with no network.

A customer reports an outage; the agent opens a ticket and e-mails the customer. The agent
process is ``SIGKILL``ed right after ``create_ticket`` succeeded — before its result was recorded,
the exact gap toolledger closes — then restarted on the same session. The ticket system ends up
with one ticket, the customer with one e-mail, and the timeline says why.

The model is a scripted Messages API on 127.0.0.1, driven by the real ``anthropic`` SDK when it
is installed, else by a few lines of plain HTTP (the demo runs on a core install:
``pip install toolledger``). This module is also the agent process:
``python -m toolledger.cli.demo --child ...``.

``--dir DIR`` keeps the store and the world in DIR (a rerun there starts a fresh story: the
previous run's own files are removed, and it says so; a demo.db or world there that the demo
did not make is left alone, and the demo refuses); without it they live in a temporary
directory, removed at the end, and the demo says that too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from .._shell import shown
from ..engine._gate import ApprovalRequest, Decision
from ..errors import ConfigurationError, ToolLedgerError
from ..records import Status
from ..tools import ToolContext, ToolSet, tool

SESSION = "outage-42"
PROMPT = (
    "Customer acme-corp reports that checkout returns HTTP 502 since 09:12. Open a "
    "ticket and tell them."
)


def demo_tools(world: Path) -> ToolSet:
    tickets = world / "tickets"
    outbox = world / "outbox"
    tickets.mkdir(parents=True, exist_ok=True)
    outbox.mkdir(parents=True, exist_ok=True)

    def all_tickets() -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted(tickets.glob("*.json"))]

    @tool(effect="non_idempotent")
    def create_ticket(title: str, body: str, ctx: ToolContext) -> dict[str, Any]:
        """Open a support ticket. Every call opens a new one."""
        ticket = {
            "id": f"T-{len(all_tickets()) + 1}",
            "title": title,
            "body": body,
            "external_id": ctx.idempotency_key,
        }
        (tickets / f"{uuid.uuid4().hex}.json").write_text(json.dumps(ticket))
        return {"ticket": ticket["id"]}

    @create_ticket.check
    def _(title: str, body: str, ctx: ToolContext) -> dict[str, Any] | None:
        """Did it already happen? Look the ticket up by the external id we gave it."""
        found = [t for t in all_tickets() if t["external_id"] == ctx.idempotency_key]
        return {"ticket": found[0]["id"]} if found else None

    @tool(effect="non_idempotent", high_impact=True)
    def send_email(to: str, subject: str, body: str, ctx: ToolContext) -> dict[str, Any]:
        """E-mail a customer."""
        (outbox / f"{uuid.uuid4().hex}.json").write_text(
            json.dumps(
                {"to": to, "subject": subject, "body": body, "message_id": ctx.idempotency_key}
            )
        )
        return {"sent": True}

    return ToolSet([create_ticket, send_email])


def _script() -> list[Any]:
    from ..testing.scripted import Reply, ToolUse

    return [
        Reply(
            text="I'll open a ticket for the checkout outage.",
            tool_uses=[
                ToolUse(
                    "create_ticket",
                    {
                        "title": "Checkout returns 502",
                        "body": "acme-corp: checkout fails with HTTP 502 since 09:12",
                    },
                )
            ],
        ),
        Reply(
            text="Ticket opened; now I'll let the customer know.",
            tool_uses=[
                ToolUse(
                    "send_email",
                    {
                        "to": "ops@acme-corp.example",
                        "subject": "We're on it",
                        "body": "We opened a ticket for the checkout errors.",
                    },
                )
            ],
        ),
        Reply(text="Done: one ticket is open and the customer has been told."),
    ]


class _PlainMessages:
    """``client.messages.create`` as plain HTTP: what the demo's agent uses when the anthropic
    SDK is not installed (a core install). It speaks only to the demo's scripted model."""

    def __init__(self, base_url: str) -> None:
        self.url = base_url.rstrip("/") + "/v1/messages"

    def create(self, **request: Any) -> dict[str, Any]:
        body = json.dumps(request).encode()
        headers = {"content-type": "application/json", "x-api-key": "demo"}
        sent = urllib.request.Request(self.url, data=body, headers=headers, method="POST")  # noqa: S310 - the demo's own 127.0.0.1 server
        with urllib.request.urlopen(sent, timeout=60) as answer:  # noqa: S310 - likewise
            reply: dict[str, Any] = json.loads(answer.read())
        return reply


class _PlainClient:
    def __init__(self, base_url: str) -> None:
        self.messages = _PlainMessages(base_url)


def _client(base_url: str) -> Any:
    try:
        import anthropic
    except ImportError:
        return _PlainClient(base_url)
    return anthropic.Anthropic(base_url=base_url, api_key="demo", max_retries=0)


def _has_sdk() -> bool:
    try:
        import anthropic  # noqa: F401
    except ImportError:
        return False
    return True


def _child(argv: list[str]) -> int:
    """The agent process."""
    from ..agent._agent import Agent
    from ..stores import open_store

    parser = argparse.ArgumentParser()
    parser.add_argument("--store")
    parser.add_argument("--base-url")
    parser.add_argument("--world", type=Path)
    args = parser.parse_args(argv)

    def approve(request: ApprovalRequest) -> Decision:
        # Stands in for a person at `tl.approvals.terminal`, so the demo runs unattended.
        return Decision(approved=True, by="on-call engineer (demo)")

    client = _client(args.base_url)
    with open_store(args.store) as store:
        agent = Agent(
            client=client,
            model="claude-demo",
            tools=demo_tools(args.world),
            store=store,
            approve=approve,
            system="You are a support agent.",
        )
        run = agent.run(session=SESSION, prompt=PROMPT)
    print(json.dumps({"status": run.status.value, "final_text": run.final_text}))
    return 0


def _spawn(
    store_url: str, base_url: str, world: Path, crash_at: str | None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TOOLLEDGER_CRASH_AT"}
    if crash_at:
        env["TOOLLEDGER_CRASH_AT"] = crash_at
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "toolledger.cli.demo",
            "--child",
            "--store",
            store_url,
            "--base-url",
            base_url,
            "--world",
            str(world),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


DEMO_FILES = ("demo.db", "demo.db-wal", "demo.db-shm")
WORLD_PARTS = ("tickets", "outbox")


def _fresh(base: Path) -> bool:
    """Remove what an earlier demo run left in ``base`` — its store and its world, nothing
    else — so the story starts again. Whether there was any. What is there but not provably
    the demo's is left alone, and the demo refuses (``ConfigurationError``): ``--dir`` may
    name a directory that already holds the user's own files."""
    files = [base / name for name in DEMO_FILES if (base / name).exists()]
    parts = [base / "world" / part for part in WORLD_PARTS if (base / "world" / part).is_dir()]
    if not files and not parts:
        return False
    _refuse_unless_ours(base)
    for path in files:
        path.unlink()
    for where in parts:
        shutil.rmtree(where)
    return True


def _refuse_unless_ours(base: Path) -> None:
    """Raise unless ``base/demo.db`` is a store an earlier demo run made."""
    db = base / "demo.db"
    if not db.exists():
        raise ConfigurationError(
            f"--dir {shown(str(base))} holds demo files (demo.db-wal, demo.db-shm, "
            "world/tickets or world/outbox) but no demo.db: they are not an earlier demo run's, "
            "so nothing was removed. Choose another --dir, or remove them yourself."
        )
    if not _ours(db):
        raise ConfigurationError(
            f"--dir {shown(str(base))} holds a demo.db the demo did not make (not a "
            f"toolledger store holding session {SESSION} alone): nothing was removed. Choose "
            "another --dir, or remove that demo.db yourself."
        )


def _ours(db: Path) -> bool:
    """Whether ``db`` is a toolledger store holding the demo's session and no other, or none
    (a run stopped before it wrote its session), looked at read-only. Another program's SQLite
    database is refused as no store (``refuse_foreign``); a file that cannot be read as a
    store, or is damaged, is not the demo's either."""
    from ..stores import open_store
    from ..stores._url import file_url

    try:
        with open_store(file_url("sqlite", db), read_only=True) as store:
            # (none yet: a run stopped before its session was written — nothing to lose)
            return store.sessions() in ([], [SESSION])
    except ToolLedgerError:
        return False


def _introduce(console: Console, store_url: str, *, kept: bool, again: bool, base: Path) -> None:
    """The demo's first lines: the story, where its store is (and whether it stays), a rerun,
    and a core install's plain HTTP."""
    from rich.markup import escape

    console.print(Panel.fit(f"[bold]toolledger demo[/bold]\n{PROMPT}"))
    # Outside the box, on a line of its own: a box folds its text to its width, and the
    # store's URL is a path, never cut.
    where = Text(f"store: {shown(store_url)}" + (" (kept: --dir)" if kept else ""))
    console.print(where, soft_wrap=True, highlight=False)
    if not kept:
        console.print(
            "(a temporary directory, removed when the demo ends: --dir DIR keeps the store "
            "and the world to look at afterwards)"
        )
    if again:
        console.print(
            f"[yellow]{escape(str(base))} held an earlier demo run: its store and world were "
            "removed, and the story starts again.[/yellow]"
        )
    if not _has_sdk():
        note = (
            "The anthropic SDK is not installed: the agent talks to its scripted model over "
            "plain HTTP (pip install 'toolledger[anthropic]' for your own agents)."
        )
        console.print(f"[dim]{escape(note)}[/dim]")


def refuse_a_file(directory: Path | None) -> None:
    """``--dir`` names a directory, made if missing: a file there is the user's mistake."""
    if directory is not None and directory.exists() and not directory.is_dir():
        raise ConfigurationError(
            f"--dir {shown(str(directory))} is a file, not a directory: name a directory "
            "(it is made if it does not exist)"
        )


def _made_store(base: Path) -> str:
    """The URL of the demo's store in ``base`` (a ``?`` or ``%`` in its path escaped, so it
    names that file), made now, before the story: a directory no store can be made in is said
    in one line, not by an agent process that fails where the story expects a kill."""
    from ..stores import open_store
    from ..stores._url import file_url

    url = file_url("sqlite", base / "demo.db")
    open_store(url).close()
    return url


def run_demo(console: Console, *, directory: Path | None, as_json: bool) -> int:
    from ..stores import open_store
    from ..testing.scripted import ScriptedModel
    from . import render
    from .output import Out

    with tempfile.TemporaryDirectory(prefix="toolledger-demo-") as tmp:
        base = (directory or Path(tmp)).resolve()
        base.mkdir(parents=True, exist_ok=True)
        again = directory is not None and _fresh(base)
        world = base / "world"
        store_url = _made_store(base)

        def say(*parts: Any) -> None:
            if not as_json:
                console.print(*parts)

        if not as_json:
            _introduce(console, store_url, kept=directory is not None, again=again, base=base)
        with ScriptedModel(_script()) as model:
            say(
                "[bold]1.[/bold] The agent starts. It is armed to be killed with SIGKILL right "
                "after [bold]create_ticket[/bold] returns — before its result is recorded."
            )
            first = _spawn(store_url, model.url, world, "before_record")
            killed = first.returncode == -9
            tickets = len(list((world / "tickets").glob("*.json")))
            say(
                f"   agent process {'was [red]SIGKILLed[/red]' if killed else 'exited'} "
                f"(exit {first.returncode}); tickets in the ticket system: {tickets}"
            )
            say(
                "[bold]2.[/bold] The agent is restarted on the same session. A naive resume "
                "would run create_ticket again."
            )
            second = _spawn(store_url, model.url, world, None)
            rejected = list(model.rejected)
        outcome = (
            json.loads(second.stdout.strip().splitlines()[-1])
            if second.returncode == 0
            else {"status": "error", "stderr": second.stderr[-2000:]}
        )
        tickets = len(list((world / "tickets").glob("*.json")))
        emails = len(list((world / "outbox").glob("*.json")))
        with open_store(store_url) as store:
            events = render.timeline(store, SESSION)
            records = store.ledger(SESSION).records()
        ticket_record = next((r for r in records if r.tool == "create_ticket"), None)
        ok = (
            killed
            and outcome.get("status") == "completed"
            and tickets == 1
            and emails == 1
            and not rejected
            and ticket_record is not None
            and ticket_record.status is Status.SUCCEEDED
        )
        if as_json:
            print(
                json.dumps(
                    {
                        "ok": ok,
                        "killed": killed,
                        "status": outcome.get("status"),
                        "tickets": tickets,
                        "emails": emails,
                        "store": store_url if directory is not None else None,
                        "fresh_start": again,
                        "timeline": render.timeline_json(events),
                    },
                    indent=2,
                )
            )
            return 0 if ok else 1
        if ticket_record is not None:
            say(
                f"   the ledger found create_ticket ({ticket_record.tool_use_id}) in doubt — "
                "started, no outcome — so it did not run it blindly: the tool's check looked "
                "the ticket up by the idempotency key it carries, found it, and recorded it as "
                f"[green]{ticket_record.status.value}[/green]."
            )
        say(
            f"[bold]3.[/bold] The session is [green]{outcome.get('status')}[/green]: "
            f"{outcome.get('final_text', outcome.get('stderr', ''))}"
        )
        say(
            f"   tickets: [bold]{tickets}[/bold], e-mails sent: [bold]{emails}[/bold], "
            f"requests that broke the tool_use/tool_result rule: {len(rejected)}"
        )
        Out(console).grid(render.timeline_table(events, f"timeline of {SESSION}"))
        if ok:
            console.print(
                "[bold green]one ticket, one e-mail: nothing happened twice.[/bold green]"
            )
            if directory is not None:
                look = render.command("show", SESSION, url=store_url)
                Out(console).line(f"the store and the world are in {base}; look again with:")
                Out(console).command(look)
        else:
            console.print("[bold red]the demo did not go as it should[/bold red]")
            if second.stderr:  # data: no markup read in it, no control sent raw
                text = Text(shown(second.stderr[-2000:], keep="\n"))
                console.print(text, highlight=False)
        return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        sys.exit(_child(sys.argv[2:]))
    sys.exit(run_demo(Console(), directory=None, as_json=False))
