"""Interactive prompts (the terminal approver). All terminal output lives in ``toolledger.cli``."""

from __future__ import annotations

import json
from typing import Any, Protocol

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.prompt import Confirm
from rich.syntax import Syntax


class Asked(Protocol):
    """What the prompt shows of a request (``toolledger.approvals.ApprovalRequest`` has it)."""

    @property
    def tool(self) -> str: ...
    @property
    def session_id(self) -> str: ...
    @property
    def tool_use_id(self) -> str: ...
    @property
    def input(self) -> dict[str, Any]: ...
    @property
    def reason(self) -> str: ...
    @property
    def in_doubt(self) -> bool: ...


def ask_approval(request: Asked, console: Console | None = None) -> bool | None:
    """Show the call and ask y/N. An in-doubt call is flagged in red: it may already have run.
    ``None``: there is no terminal to ask on (stdin closed)."""
    console = console or Console(stderr=True)
    title = (
        f"approve [bold]{escape(request.tool)}[/bold]? "
        f"(session {escape(request.session_id)}, {escape(request.tool_use_id)})"
    )
    body = Syntax(json.dumps(request.input, indent=2, ensure_ascii=False), "json", word_wrap=True)
    console.print(Panel(body, title=title, subtitle=escape(request.reason)))
    if request.in_doubt:
        console.print(
            "[bold red]IN DOUBT:[/bold red] this call was interrupted while it ran and may "
            "already have taken effect. Approving runs it again."
        )
    try:
        return Confirm.ask("Approve", default=False, console=console)
    except EOFError:
        console.print("[yellow]no terminal to answer on (stdin is closed): declined[/yellow]")
        return None
