"""A store with something on every page of the console, written by real agent runs against a
scripted model: a completed session whose id and tool result are HTML, two sessions waiting for
an approval (with a secret in the input), a call in doubt and, in a ledger used on its own, a
call still in progress."""

from __future__ import annotations

import contextlib
import html as html_lib
import re
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import toolledger as tl
from toolledger.codec import input_hash
from toolledger.ops import InsertEffect
from toolledger.records import EffectRecord, Holder, Status
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

XSS_SESSION = '<img src=x onerror="window.__pwned=3">&<script>window.__pwned=4</script>'
XSS_RESULT = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
SECRET = "sk-live-0123456789"


@dataclass
class Scene:
    """The store, the tools' real executions, and a way to run a session again."""

    url: str
    path: Path
    ran: Counter[str] = field(default_factory=Counter)
    crash: bool = False

    def tools(self) -> list[Any]:
        @tl.tool(effect="non_idempotent", high_impact=True)
        def wire(amount: int, api_key: str) -> dict[str, int]:
            """Wire money."""
            self.ran["wire"] += 1
            if self.crash:
                raise KeyboardInterrupt
            return {"wired": amount}

        @tl.tool(effect="non_idempotent")
        def send_email(to: str) -> str:
            """Send an e-mail."""
            self.ran["send_email"] += 1
            if self.crash:
                raise KeyboardInterrupt  # the process stops mid-call: the intent stays started
            return "sent"

        @tl.tool(effect="read_only")
        def fetch_page(url: str) -> str:
            """Fetch a page."""
            self.ran["fetch_page"] += 1
            return XSS_RESULT

        return [wire, send_email, fetch_page]

    def run(self, session: str, tool: str, tool_input: dict[str, Any]) -> tl.Run:
        """One run of ``session``: the model asks for ``tool`` once, then says it is done."""
        script = [Reply(tool_uses=[ToolUse(tool, tool_input)]), Reply(text="done")]
        with ScriptedModel(script) as model, tl.open_store(self.url) as store:
            agent = tl.Agent(
                client=model.client(),
                model="claude-test",
                tools=self.tools(),
                store=store,
                approve=tl.approvals.queue,
            )
            return agent.run(session=session, prompt="go")

    def dump(self) -> str:
        """Every row of the database, to compare before and after."""
        with sqlite3.connect(self.path) as db:
            return "\n".join(db.iterdump())


PAY = {"amount": 5, "api_key": SECRET}
MAIL = {"to": "ops@example.com"}


def build(
    tmp_path: Path, *, in_doubt: bool = True, waiting: tuple[str, ...] = ("pay-1", "pay-2")
) -> Scene:
    """The scene in ``tmp_path``; ``in_doubt=False`` leaves the in-doubt call out (a console in
    another process sees this process alive: the call would be in progress there)."""
    path = tmp_path / "console.db"
    scene = Scene(url=f"sqlite:///{path}", path=path)
    assert scene.run(XSS_SESSION, "fetch_page", {"url": "https://x"}).status.value == "completed"
    for session in waiting:
        assert scene.run(session, "wire", PAY).status.value == "awaiting_approval"
    if in_doubt:
        scene.crash = True
        with contextlib.suppress(KeyboardInterrupt):
            scene.run("mail-1", "send_email", MAIL)
        scene.crash = False
    with tl.open_store(scene.url) as store:
        running = EffectRecord(
            session_id="batch",
            tool_use_id="toolu_running",
            tool="send_email",
            input_hash=input_hash(MAIL),
            status=Status.STARTED,
            attempt=1,
            created_at=time.time(),
            updated_at=time.time(),
            worker="elsewhere:1",
            holder=Holder(host="", pidns="", pid=1, start=0),  # another machine's process
            deadline=time.time() + 3600,
        )
        assert store.backend.apply("batch", [InsertEffect(running)]) == [True]
    return scene


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "the page has a form with its CSRF token"
    return found.group(1)


def forms_of(html: str) -> list[dict[str, str]]:
    """The hidden fields of every form on a page."""
    out = []
    for form in re.findall(r"<form method=\"post\".*?</form>", html, re.S):
        fields = re.findall(r'type="hidden" name="([^"]+)" value="([^"]*)"', form)
        out.append({k: html_lib.unescape(v) for k, v in fields})
    return out


def browser(app: Any, base: str = "http://127.0.0.1") -> Any:
    """A client that sends what a browser sends with the console's own forms: the console's
    origin (``Origin``, ``Sec-Fetch-Site: same-origin``)."""
    from starlette.testclient import TestClient

    return TestClient(app, base_url=base, headers={"Origin": base, "Sec-Fetch-Site": "same-origin"})
