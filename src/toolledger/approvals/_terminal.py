"""Interactive prompts (the terminal approver). All terminal output lives in ``toolledger.cli``.

``rich`` is loaded only when a person is asked, so importing toolledger does not pay for it.
"""

from __future__ import annotations

import getpass
import json
import os
from typing import TYPE_CHECKING

from .._shell import shown, shown_id
from ..engine._gate import ApprovalRequest, Decision

if TYPE_CHECKING:
    from rich.console import Console


def ask_approval(request: ApprovalRequest, console: Console | None = None) -> bool | None:
    """Show the call and ask y/N. An in-doubt call is flagged in red: it may already have run.
    ``None``: there is no terminal to ask on (stdin closed)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.panel import Panel
    from rich.prompt import Confirm
    from rich.syntax import Syntax

    console = console or Console(stderr=True)
    tool, session, call = (
        shown_id(t) for t in (request.tool, request.session_id, request.tool_use_id)
    )
    title = f"approve [bold]{escape(tool)}[/bold]? (session {escape(session)}, {escape(call)})"
    body = Syntax(json.dumps(request.input, indent=2, ensure_ascii=False), "json", word_wrap=True)
    console.print(Panel(body, title=title, subtitle=escape(shown(request.reason))))
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


def terminal(request: ApprovalRequest) -> Decision:
    """Ask on this terminal: shows the tool, its input, and whether the call is in doubt. With no
    terminal to answer on (stdin closed) the call is declined, and says so."""
    approved = ask_approval(request)
    if approved is None:  # no terminal: nobody said yes
        return Decision(approved=False, by="terminal: no terminal to ask on")
    # A yes to the "IN DOUBT" question, shown as a re-run, is a yes to the re-run.
    return Decision(approved=approved, by=f"terminal:{user()}", rerun=approved and request.in_doubt)


def user() -> str:
    """Who runs this command, for ``--by``: the login name, else ``uid N``.

    ``getpass.getuser()`` reads ``$LOGNAME``, ``$USER``… then the password database, and a
    process under a uid with no entry there and none of those variables (a container's random
    uid) gets ``KeyError`` (``OSError`` from Python 3.13): that must not stop a person settling
    a call.
    """
    try:
        return getpass.getuser()
    except (KeyError, OSError, ImportError):
        return f"uid {os.getuid()}"
