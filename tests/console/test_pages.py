"""The console's pages and actions, through Starlette's test client, against a store written by
real agent runs: what each page shows, and that each action does what the command line does —
and the next run of the session goes on from it."""

from __future__ import annotations

import contextlib
import html
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from markupsafe import escape
from starlette.testclient import TestClient

import toolledger as tl
from toolledger._invisible import escape_char
from toolledger.console import create_app
from toolledger.ops import InsertEffect, PutApproval, UpdateEffect
from toolledger.records import ApprovalStatus, Status
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

from .scene import MAIL, PAY, SECRET, XSS_SESSION, Scene, browser, build, forms_of

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def scene(tmp_path: Path) -> Scene:
    return build(tmp_path)


@pytest.fixture
def client(scene: Scene) -> TestClient:
    return browser(create_app(scene.url))


def form_for(client: TestClient, page: str, session: str) -> dict[str, str]:
    (form,) = [f for f in forms_of(client.get(page).text) if f["session"] == session]
    return form


def test_the_sessions_page_lists_every_session_and_filters_by_status(
    client: TestClient,
) -> None:
    page = client.get("/")
    assert page.status_code == 200
    for sid in ("pay-1", "pay-2", "mail-1", "batch", XSS_SESSION):
        assert escape(sid) in page.text
    assert "awaiting_approval" in page.text and "ledger_only" in page.text
    assert 'hx-trigger="every 2s"' in page.text, "the list refreshes itself"
    waiting = client.get("/sessions/rows", params={"status": "awaiting_approval"})
    assert "pay-1" in waiting.text and "pay-2" in waiting.text
    assert "mail-1" not in waiting.text and "<html" not in waiting.text  # a fragment
    done = client.get("/", params={"status": "completed"}).text
    assert "2 shown" not in done and "1 shown of 5" in done


def test_a_stop_reason_s_commands_are_shown_each_on_a_line_of_its_own(
    client: TestClient, scene: Scene
) -> None:
    """Rule 21: the reason's words name each command by what it does, and each command follows
    whole in a block of its own (never wrapped), on the session's page and in the sessions
    table; once settled, none is offered."""
    with tl.open_store(scene.url) as store:
        state = store.session("pay-1")
    assert state is not None and state.reason is not None
    commands = re.findall(r"`(toolledger [^`]*)`", state.reason)
    assert len(commands) == 2
    page = client.get("/session", params={"id": "pay-1"}).text
    shown = [html.unescape(c) for c in re.findall(r'<pre class="command">([^<]*)</pre>', page)]
    assert shown == commands
    assert "Decide with `approve` or `deny`" in html.unescape(page) and "`toolledger" not in page
    rows = client.get("/sessions/rows", params={"status": "awaiting_approval"}).text
    cells = [html.unescape(c) for c in re.findall(r'<code class="command">([^<]*)</code>', rows)]
    assert all(c in cells for c in commands), rows
    assert "1 turn ·" in page, "one turn, not '1 turns'"
    with tl.open_store(scene.url) as store:
        (request,) = [a for a in store.approvals("pay-1") if a.status is ApprovalStatus.PENDING]
        tl.approvals.decide(store, "pay-1", request.tool_use_id, approved=False, by="ana")
    page = client.get("/session", params={"id": "pay-1"}).text
    assert "settled since" in page and 'class="command"' not in page


def test_a_session_page_shows_its_calls_with_secrets_masked(client: TestClient) -> None:
    page = client.get("/session", params={"id": "pay-1"})
    assert page.status_code == 200
    text = page.text
    assert SECRET not in text, "masked as the command line masks it"
    assert "&#34;api_key&#34;: &#34;***&#34;" in text
    assert "approval pending" in text and "model asks: wire" in text
    assert client.get("/session", params={"id": "nobody"}).status_code == 404


def test_in_doubt_lists_doubtful_and_in_progress_calls_and_only_the_first_can_be_settled(
    client: TestClient,
) -> None:
    page = client.get("/in-doubt").text
    assert "mail-1" in page and "ops@example.com" in page
    assert "in progress: its worker holds no lease" in page and "toolu_running" in page
    forms = forms_of(page)
    assert [f["session"] for f in forms] == ["mail-1"], "no form for a call in progress"


def test_resolving_happened_is_recorded_with_who_and_the_next_run_goes_on(
    client: TestClient, scene: Scene
) -> None:
    form = form_for(client, "/in-doubt", "mail-1")
    done = client.post(
        "/in-doubt/resolve",
        data={**form, "by": "ana", "happened": "yes", "result": '{"message_id": "m-1"}'},
    )
    assert done.status_code == 200 and "recorded succeeded by ana" in done.text
    with tl.open_store(scene.url) as store:
        record = store.ledger("mail-1").get(form["tool_use_id"])
    assert record is not None and record.status is Status.SUCCEEDED
    assert record.error == "resolved by ana: happened" and json.loads(record.result or "") == {
        "message_id": "m-1"
    }
    assert scene.run("mail-1", "send_email", MAIL).status is tl.RunStatus.COMPLETED
    assert scene.ran["send_email"] == 1, "the interrupted attempt only: never run again"


def test_resolving_not_happened_lets_the_next_run_run_it(client: TestClient, scene: Scene) -> None:
    form = form_for(client, "/in-doubt", "mail-1")
    done = client.post("/in-doubt/resolve", data={**form, "by": "bo", "happened": "no"})
    assert done.status_code == 200 and "recorded not_happened by bo" in done.text
    assert scene.run("mail-1", "send_email", MAIL).status is tl.RunStatus.COMPLETED
    assert scene.ran["send_email"] == 2, "it did not happen, so it ran once more"


def test_a_stop_reason_settled_since_says_so(client: TestClient, scene: Scene) -> None:
    """The session stopped for a person (its call awaits approval): its stored reason is shown
    as it was. Once the request is decided, the session's page and the sessions list say that
    reason was so when the run stopped, and that running the session again goes on."""
    settled = "settled since: that was so when the run stopped"
    before = html.unescape(client.get("/session?id=pay-1").text)
    assert "awaiting" in before and settled not in before
    form = form_for(client, "/approvals", "pay-1")
    done = client.post("/approvals/decide", data={**form, "by": "ana", "decision": "deny"})
    assert done.status_code == 200
    page = html.unescape(client.get("/session?id=pay-1").text)
    assert settled in page and "Run the session again to go on" in page
    listed = html.unescape(client.get("/").text)
    assert listed.count(settled) == 1, "the settled session alone"


def test_a_card_settles_only_the_attempt_it_showed(client: TestClient, scene: Scene) -> None:
    """An in-doubt card shows attempt 1. Meanwhile someone says it did not happen, the next run
    runs it again, and that attempt is lost too: the call is in doubt again, for attempt 2. "It
    happened" from the old card was a word about attempt 1: refused, nothing written."""
    form = form_for(client, "/in-doubt", "mail-1")
    assert form["attempt"] == "1"
    with tl.open_store(scene.url) as store:
        (record,) = [r for r in store.ledger("mail-1").records() if r.tool == "send_email"]
        lost_again = replace(record, attempt=2, updated_at=record.updated_at + 1)
        ops = [UpdateEffect(lost_again, record.status, record.attempt)]
        assert store.apply("mail-1", ops) == [True]
    before = scene.dump()
    refused = client.post("/in-doubt/resolve", data={**form, "by": "ana", "happened": "yes"})
    text = html.unescape(refused.text)
    assert refused.status_code == 409 and "in doubt for attempt 2 now, not the attempt 1" in text
    assert scene.dump() == before


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"happened": "yes", "result": "{nope"}, "not JSON"),
        ({"happened": "yes", "result": "NaN"}, "NaN is not JSON"),
        ({"happened": "no", "result": "{}"}, "has no result"),
        ({"happened": "maybe"}, "say whether it happened"),
        ({"happened": "yes", "by": ""}, "has no by"),
        ({"happened": "yes", "by": "x" * 101}, "at most 100"),
        # A name prints as the record keeps it: none that looks like another, or like nothing.
        ({"happened": "yes", "by": "\u202eana"}, "no control, formatting or invisible"),
        ({"happened": "yes", "by": "ana\u0085bob"}, "no control, formatting or invisible"),
        ({"happened": "yes", "by": "ana\u200d"}, "no control, formatting or invisible"),
        ({"happened": "yes", "by": "ana\u00a0silva"}, "no control, formatting or invisible"),
        ({"happened": "yes", "by": "ana  silva"}, "single spaces between words"),
    ],
)
def test_a_refused_resolution_changes_nothing(
    client: TestClient, scene: Scene, fields: dict[str, str], why: str
) -> None:
    form = form_for(client, "/in-doubt", "mail-1")
    before = scene.dump()
    refused = client.post("/in-doubt/resolve", data={**form, "by": "ana", **fields})
    assert refused.status_code == 409 and why in html.unescape(refused.text)
    assert scene.dump() == before


def test_a_call_in_progress_cannot_be_settled(client: TestClient, scene: Scene) -> None:
    form = form_for(client, "/in-doubt", "mail-1")
    before = scene.dump()
    refused = client.post(
        "/in-doubt/resolve",
        data={**form, "session": "batch", "tool_use_id": "toolu_running", "by": "ana"}
        | {"happened": "no"},
    )
    assert refused.status_code == 409 and "EffectInProgress" not in refused.text
    assert "may still be running" in refused.text or "in progress" in refused.text
    assert scene.dump() == before


def test_approvals_show_the_input_masked_and_approve_lets_the_next_run_run_it(
    client: TestClient, scene: Scene
) -> None:
    page = client.get("/approvals").text
    assert SECRET not in page and "<dt>amount</dt>\n  <dd><code>5</code></dd>" in page
    assert "<dt>api_key</dt>\n  <dd><code>&#34;***&#34;</code></dd>" in page, "masked"
    assert "may already have run" not in page, "neither request is in doubt"
    form = form_for(client, "/approvals", "pay-1")
    done = client.post("/approvals/decide", data={**form, "by": "ana", "decision": "approve"})
    assert done.status_code == 200 and "approved by ana" in done.text
    assert "pay-1" not in "".join(f["session"] for f in forms_of(done.text))
    assert scene.ran["wire"] == 0, "approving runs nothing by itself"
    assert scene.run("pay-1", "wire", PAY).status is tl.RunStatus.COMPLETED
    assert scene.ran["wire"] == 1
    with tl.open_store(scene.url) as store:
        record = store.ledger("pay-1").get(form["tool_use_id"])
    assert record is not None and record.approved_by == "ana"


def test_deny_is_told_to_the_model_and_nothing_runs(client: TestClient, scene: Scene) -> None:
    form = form_for(client, "/approvals", "pay-2")
    done = client.post("/approvals/decide", data={**form, "by": "bo", "decision": "deny"})
    assert done.status_code == 200 and "denied by bo" in done.text
    assert scene.run("pay-2", "wire", PAY).status is tl.RunStatus.COMPLETED
    assert scene.ran["wire"] == 0
    with tl.open_store(scene.url) as store:
        (decided,) = store.approvals("pay-2")
    assert decided.status is ApprovalStatus.DENIED and decided.decided_by == "bo"


def test_a_changed_request_is_refused_not_approved(client: TestClient, scene: Scene) -> None:
    form = form_for(client, "/approvals", "pay-1")
    with tl.open_store(scene.url) as store:  # the request changes after the page was shown
        (shown,) = store.approvals("pay-1")
        changed = tl.ApprovalRecord(
            session_id="pay-1",
            tool_use_id=shown.tool_use_id,
            tool="wire",
            input_hash="sha256:" + "0" * 64,
            input={"amount": 5000, "api_key": SECRET},
            in_doubt=False,
            reason=shown.reason,
            status=ApprovalStatus.PENDING,
            requested_at=shown.requested_at + 1,
        )
        assert store.apply("pay-1", [PutApproval(changed, ApprovalStatus.PENDING)]) == [True]
    before = scene.dump()
    refused = client.post("/approvals/decide", data={**form, "by": "ana", "decision": "approve"})
    assert refused.status_code == 409 and "is not the one you were shown" in refused.text
    assert scene.dump() == before
    with tl.open_store(scene.url) as store:
        (still,) = store.approvals("pay-1")
    assert still.status is ApprovalStatus.PENDING and still.decided_by is None


@pytest.mark.parametrize("now", ["in doubt", "another attempt"])
def test_a_first_runs_card_cannot_approve_a_re_run(
    client: TestClient, scene: Scene, now: str
) -> None:
    """A card shown for a call's first run (no red warning) stays open while the request
    becomes another question with the same input: a re-run of the call in doubt — which may
    already have happened — or one about another attempt. Approving from the old card is
    refused, and the request stays pending for a person who sees what it now asks."""
    form = form_for(client, "/approvals", "pay-1")
    assert form["in_doubt"] == "no" and form["attempt"] == "0"
    with tl.open_store(scene.url) as store:  # asked again after an attempt was lost
        (shown,) = store.approvals("pay-1")
        again = replace(
            shown,
            in_doubt=now == "in doubt",
            attempt=1 if now == "in doubt" else 2,
            requested_at=shown.requested_at + 1,
        )
        assert store.apply("pay-1", [PutApproval(again, ApprovalStatus.PENDING)]) == [True]
    before = scene.dump()
    refused = client.post("/approvals/decide", data={**form, "by": "ana", "decision": "approve"})
    text = html.unescape(refused.text)
    assert refused.status_code == 409 and "is not the one you were shown" in text
    if now == "in doubt":
        assert "may already have happened" in text
    assert scene.dump() == before
    with tl.open_store(scene.url) as store:
        (still,) = store.approvals("pay-1")
    assert still.status is ApprovalStatus.PENDING and still.decided_by is None


def test_a_form_that_does_not_say_which_request_it_showed_decides_nothing(
    client: TestClient, scene: Scene
) -> None:
    form = form_for(client, "/approvals", "pay-1")
    before = scene.dump()
    for dropped in ("in_doubt", "attempt"):
        partial = {k: v for k, v in form.items() if k != dropped}
        refused = client.post(
            "/approvals/decide", data={**partial, "by": "ana", "decision": "approve"}
        )
        assert refused.status_code == 409 and f"the form has no {dropped}" in refused.text
    assert scene.dump() == before


def test_deciding_twice_is_refused(client: TestClient, scene: Scene) -> None:
    form = form_for(client, "/approvals", "pay-1")
    client.post("/approvals/decide", data={**form, "by": "ana", "decision": "approve"})
    before = scene.dump()
    again = client.post("/approvals/decide", data={**form, "by": "bo", "decision": "deny"})
    assert again.status_code == 409 and "already approved by ana" in again.text
    assert scene.dump() == before


def test_verify_shows_the_findings_of_the_command(client: TestClient, scene: Scene) -> None:
    page = client.get("/verify").text
    with tl.open_store(scene.url) as store:
        from toolledger._verify import verify

        problems = verify(store)
    assert problems, "the in-doubt call is a finding"
    for p in problems:
        assert escape(p.message) in page


def test_the_library_refuses_a_decision_about_another_input(scene: Scene) -> None:
    with tl.open_store(scene.url) as store:
        (request,) = store.approvals("pay-1")
        with pytest.raises(tl.SessionConflictError, match="not the one you were shown"):
            tl.approvals.decide(
                store, "pay-1", request.tool_use_id, approved=True, by="a", input_hash="sha256:x"
            )
        decided = tl.approvals.decide(
            store,
            "pay-1",
            request.tool_use_id,
            approved=True,
            by="a",
            input_hash=request.input_hash,
        )
    assert decided.status is ApprovalStatus.APPROVED


@pytest.mark.parametrize("kind", ["anthropic", "chat", "responses"])
def test_a_session_of_every_provider_shows_its_calls_with_secrets_masked(
    tmp_path: Path, kind: str
) -> None:
    from ..cli.test_show_transcripts import SECRETS, _run_kind

    url = f"sqlite:///{tmp_path / 'kinds.db'}"
    _run_kind(kind, url)
    client = browser(create_app(url))
    page = client.get("/session", params={"id": "s"}).text
    calls = re.findall(r'<table class="calls">.*?</table>', page, re.S)[0]
    assert calls.count("<tr>") == 3, "a header and the two calls"
    assert "sign_in" in calls and "audit" in calls and "&#34;password&#34;: &#34;***&#34;" in calls
    assert "model asks: sign_in" in page and "→ model: tool_result" in page
    for secret in SECRETS:
        assert secret not in page


def test_a_request_for_a_call_that_may_have_run_says_so_in_red(
    client: TestClient, scene: Scene
) -> None:
    (first,) = [f for f in forms_of(client.get("/approvals").text) if f["session"] == "pay-1"]
    client.post("/approvals/decide", data={**first, "by": "ana", "decision": "approve"})
    scene.crash = True  # the approved call starts, and its process stops before it returns
    with contextlib.suppress(KeyboardInterrupt):
        scene.run("pay-1", "wire", PAY)
    scene.crash = False
    assert scene.run("pay-1", "wire", PAY).status is tl.RunStatus.AWAITING_APPROVAL
    page = client.get("/approvals").text
    (card,) = [c for c in page.split('<section class="card approval">') if "pay-1" in c]
    assert '<p class="danger">This call may already have run' in card
    assert "pay-2" not in card
    (again,) = [f for f in forms_of(page) if f["session"] == "pay-1"]
    done = client.post("/approvals/decide", data={**again, "by": "bo", "decision": "approve"})
    assert done.status_code == 200
    assert scene.run("pay-1", "wire", PAY).status is tl.RunStatus.COMPLETED
    assert scene.ran["wire"] == 2, "run again only because a person approved it, in doubt"


def test_denying_a_re_run_of_a_call_in_doubt_says_it_is_still_in_doubt(
    client: TestClient, scene: Scene
) -> None:
    """A no to running a call in doubt again leaves it in doubt: the notice says so, not that
    a run goes on, and the session's page does not call its stop settled."""
    (first,) = [f for f in forms_of(client.get("/approvals").text) if f["session"] == "pay-1"]
    client.post("/approvals/decide", data={**first, "by": "ana", "decision": "approve"})
    scene.crash = True  # the approved call starts, and its process stops before it returns
    with contextlib.suppress(KeyboardInterrupt):
        scene.run("pay-1", "wire", PAY)
    scene.crash = False
    assert scene.run("pay-1", "wire", PAY).status is tl.RunStatus.AWAITING_APPROVAL
    (again,) = [f for f in forms_of(client.get("/approvals").text) if f["session"] == "pay-1"]
    done = html.unescape(
        client.post("/approvals/decide", data={**again, "by": "bo", "decision": "deny"}).text
    )
    assert "denied by bo" in done and "It is still in doubt" in done
    assert "Run the session again to go on" not in done
    page = html.unescape(client.get("/session?id=pay-1").text)
    assert "settled since" not in page
    assert scene.run("pay-1", "wire", PAY).status is tl.RunStatus.NEEDS_ATTENTION
    assert scene.ran["wire"] == 1, "not run again"


def test_a_forked_and_a_rewound_session_show_what_they_left_behind(
    client: TestClient, scene: Scene
) -> None:
    with tl.open_store(scene.url) as store:
        fork = tl.fork(store, XSS_SESSION, at_turn=0, new_session=XSS_SESSION + "~fork")
        tl.rewind(store, "mail-1", to_turn=0, by="<b>ana</b>")
    text = client.get("/session", params={"id": fork}).text
    assert "Forks and rewinds" in text and "forked at turn 0 from" in text
    assert f'href="/session?id={quote(XSS_SESSION)}"' in text, "the parent, linked"
    assert str(escape(XSS_SESSION)) in text and "<script>window.__pwned" not in text
    assert "fetch_page" in text and "told to the model" in text
    text = client.get("/session", params={"id": "mail-1"}).text
    assert "rewound to turn 0: later turns kept as abandoned branch 1" in text
    assert "by &lt;b&gt;ana&lt;/b&gt;" in text and "<b>ana</b>" not in text
    assert "send_email" in text and "ops@example.com" in text


TRICK = "pay-\u202emoc.elpmaxe\u2066-\x9b31m"  # a right-to-left override, an isolate, a C1 CSI
INVISIBLE = ("\u202e", "\u2066", "\x9b")


def test_invisible_characters_from_the_store_are_shown_escaped(scene: Scene) -> None:
    """A session id and an input holding bidirectional overrides and C1 controls would reorder
    what a person reads (U+202E shows "moc.elpmaxe" as "example.com") or drive a terminal that
    copies it: every page shows them escaped, as ``\\u202e``; the forms still post the real id."""
    assert scene.run(TRICK, "wire", {"amount": 5, "api_key": "k\u2067x\x9b"}).status.value == (
        "awaiting_approval"
    )
    client = browser(create_app(scene.url))
    for path, params in (
        ("/", {}),
        ("/session", {"id": TRICK}),
        ("/approvals", {}),
        ("/sessions/rows", {}),
    ):
        page = client.get(path, params=params)
        assert page.status_code == 200, path
        shown = re.sub(r'<input type="hidden"[^>]*>', "", page.text)  # posted back, not shown
        for c in (*INVISIBLE, "\u2067"):
            assert c not in shown, (path, c)
        assert "\\u202e" in shown and "\\x9b" in shown, path
        assert "\\x0a" not in shown, "line breaks lay out the inputs"
    (form,) = [f for f in forms_of(client.get("/approvals").text) if f["session"] == TRICK]
    decided = client.post("/approvals/decide", data={**form, "by": "ana", "decision": "deny"})
    assert decided.status_code == 200
    with tl.open_store(scene.url) as store:
        (request,) = store.approvals(TRICK)
    assert request.status is tl.ApprovalStatus.DENIED, "the real id was posted back"


LETTER = {
    "to": "ops@example.com",
    "subject": "Refund",
    "body": "Dear customer,\n" + "we are sorry for the outage. " * 40,
    "cc": "audit@example.com",
}


def test_an_approval_card_shows_the_arguments_in_the_models_order_long_ones_folded(
    scene: Scene,
) -> None:
    """The card used to sort the arguments, so a long body came first and pushed ``to`` — the
    field the approver most needs — out of view. Now: the model's order, each field's name and
    the start of its value on one line, a long value folded (opened on a click)."""

    @tl.tool(effect="non_idempotent", high_impact=True)
    def send_email(to: str, subject: str, body: str, cc: str) -> str:
        """Send an e-mail."""
        return "sent"

    script = [Reply(tool_uses=[ToolUse("send_email", LETTER)]), Reply(text="done")]
    with ScriptedModel(script) as model, tl.open_store(scene.url) as store:
        agent = tl.Agent(
            client=model.client(),
            model="claude-test",
            tools=[send_email],
            store=store,
            approve=tl.approvals.queue,
        )
        assert agent.run(session="letter", prompt="write").status.value == "awaiting_approval"
    page = browser(create_app(scene.url)).get("/approvals").text
    card = next(c for c in re.findall(r"<section.*?</section>", page, re.S) if "letter" in c)
    names = re.findall(r"<dt>(.*?)</dt>", card)
    assert names == ["to", "subject", "body", "cc"], "as the model wrote them"
    starts = re.findall(r"<summary><code>(.*?)</code></summary>", card, re.S)
    assert len(starts) == 1 and starts[0].startswith("&#34;Dear customer,\\n")
    assert starts[0].endswith("…") and len(starts[0]) < 120, "the body folded to its start"
    assert "we are sorry for the outage. " * 40 in html.unescape(card), "whole, unfolded"
    assert "<code>&#34;ops@example.com&#34;</code>" in card


def test_a_form_settles_the_very_session_it_names(tmp_path: Path) -> None:
    """Sessions ``"s"`` and ``"s "`` each have a call in doubt: the form of ``"s "``, posted
    as the page wrote it, settles that session's call — the ids are not trimmed."""
    from ..cli.test_widths import started

    url = f"sqlite:///{tmp_path / 'c.db'}"
    with tl.open_store(url) as store:
        for sid in ("s", "s "):
            store.backend.apply(sid, [InsertEffect(started(sid, "toolu_1"))])
    client = browser(create_app(url))
    padded = next(f for f in forms_of(client.get("/in-doubt").text) if f["session"] == "s ")
    done = client.post("/in-doubt/resolve", data={**padded, "by": "alice", "happened": "no"})
    assert done.status_code == 200
    with tl.open_store(url) as store:
        spaced, plain = store.ledger("s ").get("toolu_1"), store.ledger("s").get("toolu_1")
    assert spaced is not None and spaced.status is Status.NOT_HAPPENED, "the clicked call"
    assert plain is not None and plain.status is Status.STARTED, "another session's call"
    (notice,) = re.findall(r'<p class="notice ok" id="notice">(.*?)</p>', done.text, re.S)
    assert "in s\\x20:" in html.unescape(notice), "the notice names the session it settled"


def test_a_notice_names_ids_as_ids(tmp_path: Path) -> None:
    """The notice after a person's decision names the call's session as every page does: a
    character nobody sees is shown escaped, so ``pay-9`` and ``pay-9`` + U+2060 never read
    alike there either."""
    from ..cli.test_widths import started

    url = f"sqlite:///{tmp_path / 'n.db'}"
    sid = "pay-9\u2060"
    with tl.open_store(url) as store:
        store.backend.apply(sid, [InsertEffect(started(sid, "toolu_1"))])
    client = browser(create_app(url))
    (form,) = forms_of(client.get("/in-doubt").text)
    done = client.post("/in-doubt/resolve", data={**form, "by": "alice", "happened": "no"})
    (notice,) = re.findall(r'<p class="notice ok" id="notice">(.*?)</p>', done.text, re.S)
    assert "\u2060" not in notice and "in pay-9\\u2060:" in html.unescape(notice), notice


@pytest.mark.parametrize("ch", ["\u200b", "\u200c", "\u200d", "\ufeff", "\u2060", "\u00ad"])
def test_ids_that_differ_by_a_zero_width_character_never_show_alike(
    tmp_path: Path, ch: str
) -> None:
    from ..cli.test_widths import started

    url = f"sqlite:///{tmp_path / 'z.db'}"
    with tl.open_store(url) as store:
        for sid in ("prod", "prod" + ch):
            store.backend.apply(sid, [InsertEffect(started(sid, "toolu_1"))])
    client = browser(create_app(url))
    for path in ("/sessions/rows", "/in-doubt"):
        page = client.get(path).text
        shown = re.sub(r'<input type="hidden"[^>]*>', "", page)  # posted back, not shown
        assert ch not in shown, f"U+{ord(ch):04X} shown raw on {path}"
        assert escape_char(ch) in shown, path  # \u200b, or \xad below U+0100


@pytest.mark.parametrize(
    ("one", "other"), [("s", "s "), ("café", "cafe\u0301"), ("a b", "a\u00a0b"), ("a b", "a  b")]
)
def test_ids_that_print_like_each_other_never_show_alike(
    tmp_path: Path, one: str, other: str
) -> None:
    """A page drops a space at the end and makes two one; a no-break space looks like a space;
    a decomposed ``é`` like a composed one. The page shows the second id escaped."""
    from ..cli.test_widths import started

    url = f"sqlite:///{tmp_path / 'z.db'}"
    with tl.open_store(url) as store:
        for sid in (one, other):
            store.backend.apply(sid, [InsertEffect(started(sid, "toolu_1"))])
    client = browser(create_app(url))
    for path in ("/sessions/rows", "/in-doubt"):
        page = re.sub(r'<input type="hidden"[^>]*>', "", client.get(path).text)
        assert html.escape(one) in page, path
        # The other id, as the page shows it: no character of it a person could not see.
        escaped = re.findall(r'<span class="esc">([^<]*)</span>', page)
        assert escaped, f"{other!r} not escaped on {path}"
        assert all(e.startswith("\\") and e.isascii() for e in escaped), escaped


def test_the_title_filter_shows_an_id_as_the_command_line_does() -> None:
    from toolledger._shell import shown_id
    from toolledger.console.app import _text_id

    for sid in ("\x9e", "\\x9e", "a\u00a0b", "a\\u00a0b", "cafe\u0301", "plain"):
        assert _text_id(sid) == shown_id(sid)
    assert _text_id("\x9e") != _text_id("\\x9e")


def test_a_pages_title_shows_its_session_id_escaped_as_text(tmp_path: Path) -> None:
    """A ``<title>`` holds text, not markup: the session's id is escaped there as text, never
    shown as the markup of the page's escapes."""
    from ..cli.test_widths import started

    sid = "inv\u202eoice\x9b2J"
    url = f"sqlite:///{tmp_path / 't.db'}"
    with tl.open_store(url) as store:
        store.backend.apply(sid, [InsertEffect(started(sid, "toolu_1"))])
    client = browser(create_app(url))
    page = client.get("/session", params={"id": sid}).text
    assert "toolu_1" in page, "the session's page"
    (title,) = re.findall(r"<title>(.*?)</title>", page, re.S)
    assert "<" not in html.unescape(title.replace("&lt;", "")), title
    assert "esc" not in title and "\u202e" not in title and "\x9b" not in title, title
    assert "inv\\u202eoice\\x9b2J" in html.unescape(title), title


def test_an_id_is_shown_in_the_order_it_is_stored(tmp_path: Path) -> None:
    """A browser reorders right-to-left letters with what is around them: ``run-אב-7`` would read
    like ``run-7-אב``. Every id is shown left to right, as stored."""
    from ..cli.test_widths import started

    url = f"sqlite:///{tmp_path / 'b.db'}"
    with tl.open_store(url) as store:
        for sid in ("run-\u05d0\u05d1-7", "run-7-\u05d0\u05d1"):
            store.backend.apply(sid, [InsertEffect(started(sid, "toolu_1"))])
    client = browser(create_app(url))
    for path in ("/sessions/rows", "/in-doubt"):
        page = client.get(path).text
        for sid in ("run-\u05d0\u05d1-7", "run-7-\u05d0\u05d1"):
            assert f'<bdo dir="ltr">{sid}</bdo>' in page, (path, sid)


@pytest.mark.parametrize(
    "attempt",
    [
        "\u00b2",  # a digit to str.isdigit, not to int(): SUPERSCRIPT TWO
        "\u0663",  # ARABIC-INDIC DIGIT THREE: int() reads it as 3
        "9" * 5000,  # past the interpreter's limit on converting a decimal string
    ],
)
@pytest.mark.parametrize("action", ["/approvals/decide", "/in-doubt/resolve"])
def test_an_attempt_that_is_not_one_the_page_writes_is_refused_not_a_crash(
    client: TestClient, scene: Scene, attempt: str, action: str
) -> None:
    """The page writes an attempt in ASCII digits; anything else is a form it did not write:
    refused, saying so, with nothing changed — not an error page (500)."""
    page, session = ("/approvals", "pay-1") if "decide" in action else ("/in-doubt", "mail-1")
    form = form_for(client, page, session)
    before = scene.dump()
    data = {**form, "attempt": attempt, "by": "ana", "decision": "deny", "happened": "no"}
    refused = client.post(action, data=data)
    assert refused.status_code == 409, refused.status_code
    assert "load the page again" in refused.text
    assert scene.dump() == before


def test_a_lone_surrogate_from_the_store_is_shown_escaped_not_a_crash(tmp_path: Path) -> None:
    """Python text a tool returns may hold a lone surrogate (``os.listdir`` names a file that is
    not UTF-8 ``caf\\udce9``), and the store keeps it; UTF-8 cannot write it, so the page that
    showed it was an error page (500). It is shown escaped, as the other characters nothing
    draws are."""
    url = f"sqlite:///{tmp_path / 'surrogate.db'}"

    @tl.tool(effect="read_only")
    def list_dir(path: str) -> list[str]:
        """List a directory."""
        return ["caf\udce9.txt"]

    script = [Reply(tool_uses=[ToolUse("list_dir", {"path": "/srv"})]), Reply(text="done")]
    with ScriptedModel(script) as model, tl.open_store(url) as store:
        agent = tl.Agent(client=model.client(), model="claude-test", tools=[list_dir], store=store)
        assert agent.run(session="ls-1", prompt="go").status.value == "completed"
    client = browser(create_app(url))
    page = client.get("/session", params={"id": "ls-1"})
    assert page.status_code == 200
    assert "caf\\udce9.txt" in page.text


def test_a_result_a_person_gives_with_a_lone_surrogate_leaves_the_pages_readable(
    client: TestClient, scene: Scene
) -> None:
    form = form_for(client, "/in-doubt", "mail-1")
    data = {**form, "by": "ana", "happened": "yes", "result": '"sent \\ud800"'}
    assert client.post("/in-doubt/resolve", data=data).status_code in (200, 409)
    for path in ("/", "/in-doubt", "/session?id=mail-1"):
        assert client.get(path).status_code == 200, path


OLD_STORE = Path(__file__).parents[1] / "upgrade" / "fixtures" / "v0_1_0" / "v0_1_0.db"


def test_looking_at_an_older_releases_store_leaves_it_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages only read — and so does starting the console: it opened the store with write
    access, and every page did again, so an earlier release's store was migrated by a person
    looking at it, and that release's workers still running on it stopped at their next write
    (SchemaVersionError). The command line's reading commands never migrate; neither do the
    console's pages. Its actions write, as ``resolve`` and ``approve`` do."""
    import uvicorn

    from toolledger.console import serve

    path = tmp_path / "old.db"
    path.write_bytes(OLD_STORE.read_bytes())
    url = f"sqlite:///{path}"
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: None)
    serve(url, port=0)  # any free port: it is not served
    client = browser(create_app(url))
    for page in ("/", "/sessions/rows", "/in-doubt", "/approvals", "/verify"):
        assert client.get(page).status_code == 200, page
    with tl.open_store(url, read_only=True) as store:
        sessions = store.sessions()
    for sid in sessions:
        assert client.get("/session", params={"id": sid}).status_code == 200, sid
    assert path.read_bytes() == OLD_STORE.read_bytes(), "not a byte changed"
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0
    # An action writes, as `toolledger deny` does (the store is migrated first).
    forms = forms_of(client.get("/approvals").text)
    assert forms, "the store of 0.1.0 has a pending approval"
    denied = client.post("/approvals/decide", data={**forms[0], "by": "ana", "decision": "deny"})
    assert denied.status_code == 200 and "denied by ana" in denied.text
    with tl.open_store(url, read_only=True) as store:
        decided = store.approvals(forms[0]["session"])
    assert [a.status for a in decided] == [ApprovalStatus.DENIED]


def test_a_store_that_cannot_be_read_says_so_on_the_page(scene: Scene, tmp_path: Path) -> None:
    """A store gone from under a running console (moved, its disk unmounted) answered every
    page with a bare "Internal Server Error" (500), nothing saying what was wrong."""
    client = TestClient(create_app(scene.url), base_url="http://127.0.0.1")
    assert client.get("/").status_code == 200
    scene.path.rename(tmp_path / "moved.db")
    for path in ("/", "/sessions/rows", "/in-doubt", "/approvals", "/verify", "/session?id=a"):
        page = client.get(path)
        assert page.status_code == 503, path
        assert "no store at" in page.text and "Content-Security-Policy" in page.headers


@pytest.mark.parametrize("action", ["/approvals/decide", "/in-doubt/resolve"])
def test_a_decision_whose_commit_was_not_answered_is_not_said_to_have_changed_nothing(
    scene: Scene, monkeypatch: pytest.MonkeyPatch, action: str
) -> None:
    """The store took the write and the answer was lost (a connection cut during COMMIT): the
    notice said "Nothing changed", and a person who believed it decided again, or told the
    operator the call was still open."""
    with tl.open_store(scene.url) as store:
        client = browser(create_app(store))
        page, session = ("/approvals", "pay-1") if "decide" in action else ("/in-doubt", "mail-1")
        form = form_for(client, page, session)
        real = store.apply

        def lost(session_id: str, ops: Any) -> list[bool]:
            real(session_id, ops)
            raise tl.StoreError("the connection was cut during COMMIT", outcome_unknown=True)

        monkeypatch.setattr(store, "apply", lost)
        data = {**form, "by": "ana", "decision": "deny", "happened": "no"}
        answer = client.post(action, data=data)
        monkeypatch.undo()
        assert "Nothing changed" not in answer.text
        assert "may have been recorded" in answer.text


@pytest.mark.parametrize("named", ["file", "link"])
def test_an_earlier_release_s_store_is_copied_again_only_when_it_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, named: str
) -> None:
    """A 0.1.0 SQLite store is read through a copy migrated in memory, the file untouched. The
    pages (and their refresh, every 2 s) do not copy the whole file again each time: the copy
    is kept while nothing was committed to the file, and a commit is on the next page — also
    one still in the write-ahead log of a worker that keeps its connection (no checkpoint has
    touched the file), with the store named by a symbolic link (the log is beside the file)."""
    import shutil
    import sqlite3

    from toolledger.stores import sqlite as sqlite_store

    fixture = Path(__file__).parents[1] / "upgrade" / "fixtures" / "v0_1_0" / "v0_1_0.db"
    (tmp_path / "real").mkdir()
    db = tmp_path / "real" / "old.db"
    shutil.copy(fixture, db)
    named_as = db if named == "file" else tmp_path / "old.db"
    if named == "link":
        named_as.symlink_to(db)
    copies = 0
    real = sqlite_store.open_read_only

    def counted(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        nonlocal copies
        conn = real(*args, **kwargs)
        copies += conn.execute("PRAGMA database_list").fetchone()[2] == ""
        return conn

    monkeypatch.setattr(sqlite_store, "open_read_only", counted)
    client = browser(create_app(f"sqlite:///{named_as}"))
    for _ in range(6):
        page = client.get("/sessions/rows")
        assert page.status_code == 200 and "needs-attention" in page.text
    assert copies == 2, "the first page finds it is a copy, the second keeps one"
    assert "renamed-by-0.1.0" not in page.text
    worker = sqlite3.connect(db, isolation_level=None)  # a 0.1.0 worker, its connection kept
    try:
        worker.execute(
            "UPDATE sessions SET session_id = 'renamed-by-0.1.0' WHERE session_id = 'leased'"
        )
        page = client.get("/sessions/rows")
        assert "renamed-by-0.1.0" in page.text and copies == 3
        client.get("/sessions/rows")
        assert copies == 3
        worker.execute("UPDATE sessions SET session_id = 'again' WHERE session_id = 'completed'")
        assert "again" in client.get("/sessions/rows").text and copies == 4
    finally:
        worker.close()
    assert sqlite3.connect(db).execute("PRAGMA user_version").fetchone()[0] == 3, "never migrated"
    tl.open_store(f"sqlite:///{db}").close()  # this release writes it: migrated
    for _ in range(3):
        assert "renamed-by-0.1.0" in client.get("/sessions/rows").text
    assert copies == 4, "a migrated store is read as it is"


def test_a_branch_s_commands_for_a_call_its_sibling_settles_are_shown_each_on_its_own(
    tmp_path: Path,
) -> None:
    """Two forks of one session meet the same new call id: the first makes it for the lineage
    (its answer lost: in doubt there), and the second's stop names the first — a sibling, not
    a session it was branched from — as where the call is settled. The second's page and the
    sessions table show those commands each in a block of its own, as for any session of the
    lineage, the sibling's id escaped in the words and in the commands."""
    from ..test_lineage_calls import GREETED, Desk, go_on

    url = f"sqlite:///{tmp_path / 'r.db'}"
    left = "left <i>'it'</i> \u202e"
    desk = Desk(lose="outage")
    with tl.open_store(url) as store:
        with ScriptedModel(GREETED) as model:
            tl.Agent(client=model.client(), model="x", tools=desk.tools(), store=store).run(
                session="root", prompt="Say hello."
            )
        tl.fork(store, "root", at_turn=1, new_session=left)
        tl.fork(store, "root", at_turn=1, new_session="right")
        assert go_on(store, left, desk).status is tl.RunStatus.NEEDS_ATTENTION
        assert go_on(store, "right", desk).status is tl.RunStatus.NEEDS_ATTENTION
        state = store.session("right")
    assert state is not None and state.reason is not None
    commands = re.findall(r"`(toolledger [^`]*)`", state.reason)
    assert len(commands) == 2 and all(" resolve $'left " in c for c in commands)
    client = browser(create_app(url))
    page = client.get("/session", params={"id": "right"}).text
    shown = [html.unescape(c) for c in re.findall(r'<pre class="command">([^<]*)</pre>', page)]
    assert shown == commands, page
    (words,) = re.findall(r'<p class="reason">([^<]*)</p>', page)
    assert "`toolledger" not in html.unescape(words) and "<i>" not in page
    rows = client.get("/sessions/rows", params={"status": "needs_attention"}).text
    cells = [html.unescape(c) for c in re.findall(r'<code class="command">([^<]*)</code>', rows)]
    assert all(c in cells for c in commands), rows
    assert "`toolledger resolve" not in html.unescape(rows)
