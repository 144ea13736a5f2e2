"""Notifications: a queued approval and a call left in doubt reach a person — a callable, or a
signed webhook on a real local HTTP server — without ever holding the agent up."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger.notify import Notifier, verify_signature
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

SECRET = "webhook-secret"


class Hook:
    """A webhook receiver on 127.0.0.1: records every request; answers ``codes`` in turn (then
    200); a request waits for ``gate`` when one is set."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.gets: list[str] = []  # paths asked for with GET (a redirected POST arrives so)
        self.codes: list[int] = []
        self.gate: threading.Event | None = None
        self.arrived = threading.Event()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.requests.append((dict(self.headers.items()), body))
                hook.arrived.set()
                if hook.gate is not None:
                    hook.gate.wait(30)
                code = hook.codes.pop(0) if hook.codes else 200
                self.send_response(code)
                if 300 <= code < 400:
                    self.send_header("Location", "/moved/SECRETPATH?token=SECRETQUERY")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                hook.gets.append(self.path)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.requests]


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    yield h
    if h.gate is not None:
        h.gate.set()
    h.server.shutdown()


def tool_use(tool_use_id: str, name: str, **input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_use_id, "name": name, "input": input}


def test_a_queued_approval_is_posted_once_signed_and_masked(hook: Hook, tmp_path: Path) -> None:
    sent: list[str] = []

    @tl.tool(high_impact=True)
    def wire_money(to: str, api_key: str) -> str:
        sent.append(to)
        return "wired"

    notify = Notifier(
        hook.url, secret=SECRET, console_url="http://console.local:8765/", backoff=0.01
    )
    approver = tl.approvals.queue(notify=notify)
    with tl.open_store(f"sqlite:///{tmp_path / 'l.db'}") as store:
        ledger = store.ledger("pay <b>day</b>/1")
        content = [tool_use("toolu_1", "wire_money", to="acct-9", api_key="sk-live-123456")]
        for _ in range(2):  # asked again while pending: no second notification
            (result,) = tl.run_tool_uses(content, [wire_money], ledger=ledger, approve=approver)
            assert result["is_error"] is True
        assert notify.flush(10)
        assert sent == []
        assert [a.tool_use_id for a in tl.approvals.pending(store)] == ["toolu_1"]
    ((headers, body),) = hook.requests
    event = json.loads(body)
    assert event["type"] == "approval_requested"
    assert event["session"] == "pay <b>day</b>/1" and event["tool_use_id"] == "toolu_1"
    assert event["tool"] == "wire_money" and event["in_doubt"] is False
    assert json.loads(event["input"]) == {"to": "acct-9", "api_key": "***"}
    assert "sk-live" not in body.decode()
    assert event["console"] == "http://console.local:8765/session?id=pay%20%3Cb%3Eday%3C%2Fb%3E%2F1"
    assert headers["X-Toolledger-Event"] == "approval_requested"
    assert headers["X-Toolledger-Delivery"] == event["id"]
    stamp, signature = headers["X-Toolledger-Timestamp"], headers["X-Toolledger-Signature"]
    assert verify_signature(SECRET, body, stamp, signature)
    assert not verify_signature("another-secret", body, stamp, signature)
    assert not verify_signature(SECRET, body + b" ", stamp, signature)
    assert not verify_signature(SECRET, body, stamp, signature, now=int(stamp) + 301)
    # What anyone may send is answered no, never raised: a header that is not ASCII, a
    # timestamp that is not a number.
    assert not verify_signature(SECRET, body, stamp, "sha256=é")
    assert not verify_signature(SECRET, body, stamp, signature[:-1] + "\u0663")
    assert not verify_signature(SECRET, body, "soon", signature)


def test_a_failing_webhook_is_retried_with_the_same_delivery_id(hook: Hook) -> None:
    hook.codes = [500, 503, 429]
    notify = Notifier(hook.url, secret=SECRET, backoff=0.01)
    notify.in_doubt(session_id="s", tool_use_id="t", tool="send", input={}, reason="crash")
    assert notify.flush(10)
    assert len(hook.requests) == 4
    assert len({h["X-Toolledger-Delivery"] for h, _ in hook.requests}) == 1


def test_an_event_being_retried_does_not_hold_up_the_next(hook: Hook) -> None:
    """The first event's delivery fails and waits to be retried; the one queued behind it is
    delivered meanwhile, not after every retry of the first (about a minute with the defaults,
    for a person who should have been told at once)."""
    hook.codes = [500]
    notify = Notifier(hook.url, secret=SECRET, backoff=0.5)
    notify.in_doubt(session_id="s", tool_use_id="first", tool="send", input={}, reason="crash")
    notify.in_doubt(session_id="s", tool_use_id="second", tool="send", input={}, reason="crash")
    assert notify.flush(10)
    assert [e["tool_use_id"] for e in hook.events()] == ["first", "second", "first"]
    ids = [h["X-Toolledger-Delivery"] for h, _ in hook.requests]
    assert ids[0] == ids[2] != ids[1], "a retry is the same delivery"


def test_a_refusing_webhook_is_not_retried_and_is_logged(
    hook: Hook, caplog: pytest.LogCaptureFixture
) -> None:
    hook.codes = [403]
    notify = Notifier(hook.url, secret=SECRET, backoff=0.01)
    with caplog.at_level(logging.ERROR, logger="toolledger"):
        notify.in_doubt(session_id="s", tool_use_id="t", tool="send", input={}, reason="crash")
        assert notify.flush(10)
    assert len(hook.requests) == 1
    assert "refused" in caplog.text and "HTTP 403" in caplog.text


def test_a_webhook_url_s_secrets_never_reach_the_log(
    hook: Hook, caplog: pytest.LogCaptureFixture
) -> None:
    """A chat service's webhook URL holds its secret in its path (``/services/T0/B0/XYZ``), or
    in its query or its credentials: the log lines of a refused, failing or dropped delivery
    name where it went — scheme, host and port — and none of those."""
    secret_url = f"{hook.url}/services/T0/B0/PATHSECRET?token=QUERYSECRET"
    hook.codes = [403, 500, 500]
    with caplog.at_level(logging.WARNING, logger="toolledger"):
        refused = Notifier(secret_url, secret=SECRET, backoff=0.01)
        refused.in_doubt(session_id="s", tool_use_id="t", tool="send", input={}, reason="x")
        assert refused.flush(10)
        failing = Notifier(secret_url, secret=SECRET, attempts=2, backoff=0.01)
        failing.in_doubt(session_id="s", tool_use_id="t2", tool="send", input={}, reason="x")
        assert failing.flush(10)
        wrong = "http://ops:PASSWORDSECRET@127.0.0.1:9/hook"
        unreachable = Notifier(wrong, secret=SECRET, attempts=1, backoff=0.01)
        unreachable.in_doubt(session_id="s", tool_use_id="t3", tool="send", input={}, reason="x")
        assert unreachable.flush(10)
    logged = caplog.text
    assert "refused by Notifier('http://127.0.0.1:" in logged and "/…')" in logged, logged
    assert "given up" in logged and "retrying" in logged, logged
    for secret in ("PATHSECRET", "QUERYSECRET", "PASSWORDSECRET", "services/T0"):
        assert secret not in logged, logged
        assert secret not in repr(refused) + repr(unreachable)


def test_a_webhook_url_s_secrets_stay_out_of_the_log_however_an_error_quotes_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An error may quote the URL as ``repr`` writes it (a control character in the path:
    ``http.client`` refuses it, quoting ``'/…\\t…'``), and credentials have a user name too.
    Neither reaches the log; a password too short to be told from the text around it is
    masked where the URL writes it, and the rest of the line is left readable."""
    urls = {
        "tab": "http://127.0.0.1:9/services/TABSECRET\tT0/B0",
        "user": "http://USERSECRET:pw-long-enough@127.0.0.1:9/hook",
        "short": "http://ops:e@127.0.0.1:9/hook",
    }
    with caplog.at_level(logging.WARNING, logger="toolledger"):
        for name, url in urls.items():
            notify = Notifier(url, secret=SECRET, attempts=1, backoff=0.01)
            notify.in_doubt(session_id="s", tool_use_id=name, tool="send", input={}, reason="x")
            assert notify.flush(10)
    logged = caplog.text
    assert "given up" in logged, logged
    for secret in ("TABSECRET", "USERSECRET", "pw-long-enough", "ops:e@"):
        assert secret not in logged, logged
    assert "Name or service not known" in logged, logged  # the words around stay whole
    assert "r***" not in logged and "***rror" not in logged, logged


def test_a_webhook_url_s_query_stays_out_of_the_log_with_no_path_or_with_a_fragment(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A control character in a URL with a query and no path (the request's is ``/?…``), or in
    one with a fragment (never sent, so not in the path the error quotes): the query and the
    path the error quotes are masked all the same."""
    urls = {
        "no-path": "http://127.0.0.1:9?to\tken=QUERYSECRET",
        "fragment": "http://127.0.0.1:9/services/PATHSECRET\tT0#part",
    }
    with caplog.at_level(logging.WARNING, logger="toolledger"):
        for name, url in urls.items():
            notify = Notifier(url, secret=SECRET, attempts=1, backoff=0.01)
            notify.in_doubt(session_id="s", tool_use_id=name, tool="send", input={}, reason="x")
            assert notify.flush(10)
    logged = caplog.text
    assert logged.count("given up") == 2, logged
    for secret in ("QUERYSECRET", "PATHSECRET"):
        assert secret not in logged, logged


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_webhook_that_redirects_is_refused_not_answered_by_a_get(
    hook: Hook, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    """A receiver that answers with a redirect (``http://`` moved to ``https://``, say) has not
    taken the event. Followed, the POST would arrive as a GET without its event — and its 200
    be taken for a delivery. It is refused instead, not retried, and logged with the place it
    points to (its path and query masked, as the webhook's own)."""
    hook.codes = [code]
    notify = Notifier(hook.url, secret=SECRET, backoff=0.01)
    with caplog.at_level(logging.ERROR, logger="toolledger"):
        notify.in_doubt(session_id="s", tool_use_id="t", tool="send", input={}, reason="crash")
        assert notify.flush(10)
    assert len(hook.requests) == 1 and hook.gets == [], hook.gets
    assert f"HTTP {code}" in caplog.text and "redirects" in caplog.text, caplog.text
    assert "SECRETPATH" not in caplog.text and "SECRETQUERY" not in caplog.text


def test_a_proxy_the_environment_names_after_import_is_used(
    hook: Hook, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``http_proxy`` set once toolledger is imported (``load_dotenv()`` after the imports): a
    delivery goes through it — where the proxy is the only way out, nothing would arrive."""
    seen: list[str] = []

    class Proxy(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(self.path)  # a proxy is asked for the whole URL
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    proxy = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        for name in ("no_proxy", "NO_PROXY"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{proxy.server_address[1]}")
        notify = Notifier(hook.url, secret=SECRET, backoff=0.01)
        notify.in_doubt(session_id="s", tool_use_id="t", tool="send", input={}, reason="x")
        assert notify.flush(10)
    finally:
        proxy.shutdown()
    assert seen == [hook.url] and hook.requests == [], (seen, hook.requests)


def test_a_webhook_that_never_answers_well_is_given_up_and_logged(
    hook: Hook, caplog: pytest.LogCaptureFixture
) -> None:
    hook.codes = [500] * 10
    notify = Notifier(hook.url, secret=SECRET, attempts=3, backoff=0.01)
    with caplog.at_level(logging.ERROR, logger="toolledger"):
        notify.in_doubt(session_id="s", tool_use_id="t", tool="send", input={}, reason="crash")
        assert notify.flush(10)
    assert len(hook.requests) == 3
    assert "failed 3 times" in caplog.text and "given up" in caplog.text


def test_a_slow_receiver_never_holds_the_call_up(hook: Hook, tmp_path: Path) -> None:
    """The receiver holds the request open until after ``run_tool_uses`` has returned: had the
    notification been sent on the caller's thread, the call could not have returned first."""
    hook.gate = threading.Event()

    @tl.tool(high_impact=True)
    def wire_money(to: str) -> str:
        return "wired"

    notify = Notifier(hook.url, secret=SECRET)
    with tl.open_store(f"sqlite:///{tmp_path / 'l.db'}") as store:
        (result,) = tl.run_tool_uses(
            [tool_use("toolu_1", "wire_money", to="x")],
            [wire_money],
            ledger=store.ledger("s"),
            approve=tl.approvals.queue(notify=notify),
        )
    assert result["is_error"] is True  # returned: pending approval
    assert hook.arrived.wait(10)  # the request is being received, and held
    assert not hook.gate.is_set()
    hook.gate.set()
    assert notify.flush(10)
    assert len(hook.requests) == 1


def test_a_call_left_in_doubt_is_told_once_to_a_callable(tmp_path: Path) -> None:
    events: list[dict[str, Any]] = []
    failures = [RuntimeError("pager down")]

    def page(event: dict[str, Any]) -> None:
        if failures:
            raise failures.pop()  # the first delivery fails: it is retried
        events.append(event)

    runs: list[str] = []

    @tl.tool
    def send_email(to: str) -> str:
        runs.append(to)
        raise tl.OutcomeUnknown("the mail server hung up after DATA")

    notify = Notifier(page, backoff=0.01)
    with tl.open_store(f"sqlite:///{tmp_path / 'l.db'}") as store:
        content = [tool_use("toolu_1", "send_email", to="a@b")]
        for _ in range(3):
            (result,) = tl.run_tool_uses(
                content, [send_email], ledger=store.ledger("s"), on_in_doubt=notify
            )
            assert result["is_error"] is True
        assert notify.flush(10)
    assert runs == ["a@b"]  # in doubt: never run again
    (event,) = events
    assert event["type"] == "in_doubt" and event["in_doubt"] is True
    assert event["tool_use_id"] == "toolu_1" and event["tool"] == "send_email"
    assert "mail server hung up" in event["reason"] and event["console"] is None


def test_a_call_in_doubt_again_after_a_person_settled_it_is_told_again(tmp_path: Path) -> None:
    """Told once per attempt, not once per call: after a person said the first attempt did not
    happen, its re-run ended in doubt too — a new question, which the same notifier tells."""
    events: list[dict[str, Any]] = []
    runs: list[str] = []

    @tl.tool
    def send_email(to: str) -> str:
        runs.append(to)
        raise tl.OutcomeUnknown("the mail server hung up after DATA")

    notify = Notifier(events.append, backoff=0.01)
    with tl.open_store(f"sqlite:///{tmp_path / 'l.db'}") as store:
        content = [tool_use("toolu_1", "send_email", to="a@b")]
        ledger = store.ledger("s")
        tl.run_tool_uses(content, [send_email], ledger=ledger, on_in_doubt=notify)
        tl.run_tool_uses(content, [send_email], ledger=ledger, on_in_doubt=notify)  # same attempt
        ledger.resolve("toolu_1", happened=False, by="ana")
        tl.run_tool_uses(content, [send_email], ledger=ledger, on_in_doubt=notify)
        assert notify.flush(10)
        (record,) = ledger.in_doubt()
    assert runs == ["a@b", "a@b"] and record.attempt == 2
    assert [e["tool_use_id"] for e in events] == ["toolu_1", "toolu_1"]


def test_an_agent_tells_of_the_call_it_stops_on(tmp_path: Path) -> None:
    events: list[dict[str, Any]] = []

    @tl.tool
    def send_email(to: str) -> str:
        raise tl.OutcomeUnknown("timeout after the request was sent")

    script = [Reply(text="Sending.", tool_uses=[ToolUse("send_email", {"to": "a@b"})])]
    with (
        ScriptedModel(script) as model,
        tl.open_store(f"sqlite:///{tmp_path / 'l.db'}") as store,
    ):
        agent = tl.Agent(
            client=model.client(),
            model="claude-test",
            tools=[send_email],
            store=store,
            on_in_doubt=events.append,
        )
        run = agent.run(session="s", prompt="mail a@b")
        assert run.status is tl.RunStatus.NEEDS_ATTENTION
        again = agent.run(session="s")  # meets the same call: told once
        assert again.status is tl.RunStatus.NEEDS_ATTENTION
        assert agent.on_in_doubt is not None and agent.on_in_doubt.flush(10)
        (record,) = store.ledger("s").in_doubt()
    (event,) = events
    assert event["session"] == "s" and event["tool_use_id"] == record.tool_use_id
    assert json.loads(event["input"]) == {"to": "a@b"}


@pytest.mark.parametrize(
    ("target", "kwargs", "message"),
    [
        ("http://127.0.0.1:9/hook", {}, "needs a secret"),
        ("file:///etc/passwd", {"secret": "s"}, "http(s) URL"),
        (42, {}, "callable or an http(s) URL"),
        (print, {"attempts": 0}, "attempts must be at least 1"),
    ],
)
def test_bad_targets_are_refused_before_anything_runs(
    target: Any, kwargs: dict[str, Any], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TOOLLEDGER_WEBHOOK_SECRET", raising=False)
    with pytest.raises(tl.ConfigurationError, match=re.escape(message)):
        Notifier(target, **kwargs)


def test_the_queue_itself_is_still_the_plain_approver() -> None:
    assert tl.approvals.queue.notify is None
    with pytest.raises(tl.ConfigurationError, match="notify="):
        tl.approvals.queue()  # type: ignore[call-overload]
