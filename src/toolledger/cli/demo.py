"""``toolledger demo``: the brief's story, end to end, with no network.

A customer reports an outage; the agent opens a ticket and e-mails the customer. The agent
process is ``SIGKILL``ed right after ``create_ticket`` succeeded — before its result was recorded,
the exact gap the brief is about — then restarted on the same session. The ticket system ends up
with one ticket, the customer with one e-mail, and the timeline says why.

The model is a scripted Messages API on 127.0.0.1, driven by the real ``anthropic`` SDK. This
module is also the agent process: ``python -m toolledger.cli.demo --child ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.panel import Panel

from ..gate import ApprovalRequest, Decision
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


def _child(argv: list[str]) -> int:
    """The agent process."""
    import anthropic

    from ..agent import Agent
    from ..stores import open_store

    parser = argparse.ArgumentParser()
    parser.add_argument("--store")
    parser.add_argument("--base-url")
    parser.add_argument("--world", type=Path)
    args = parser.parse_args(argv)

    def approve(request: ApprovalRequest) -> Decision:
        # Stands in for a person at `tl.approvals.terminal`, so the demo runs unattended.
        return Decision(approved=True, by="on-call engineer (demo)")

    client = anthropic.Anthropic(base_url=args.base_url, api_key="demo", max_retries=0)
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


def run_demo(console: Console, *, directory: Path | None, as_json: bool) -> int:
    from ..stores import open_store
    from ..testing.scripted import ScriptedModel
    from . import render
    from .output import Out

    with tempfile.TemporaryDirectory(prefix="toolledger-demo-") as tmp:
        base = directory or Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        world = base / "world"
        store_url = f"sqlite:///{base / 'demo.db'}"

        def say(*parts: Any) -> None:
            if not as_json:
                console.print(*parts)

        say(Panel.fit(f"[bold]toolledger demo[/bold]\n{PROMPT}\nstore: {store_url}"))
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
        else:
            console.print("[bold red]the demo did not go as it should[/bold red]")
            if second.stderr:
                console.print(second.stderr[-2000:])
        return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        sys.exit(_child(sys.argv[2:]))
    sys.exit(run_demo(Console(), directory=None, as_json=False))
