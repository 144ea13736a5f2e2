"""docs/design.md, rule 6: a call found ``started`` (the process died while it ran) is settled, in
order, by a safe re-run, the tool's own ``check``, the approver, or a person. It never re-runs
silently.

The in-doubt state is set up exactly as a crash leaves it: a ``started`` record and nothing else.
(The real ``SIGKILL`` versions of these live in the agent's crash matrix.)
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

import toolledger as tl
from toolledger._liveness import Over, Running
from toolledger.codec import idempotency_key, input_hash
from toolledger.ops import DropSession, InsertEffect, UpdateEffect
from toolledger.records import EffectRecord, PastAttempt, Status
from toolledger.testing import Counter

from .conftest import Runner, tool_use


def crash_left_started(ledger: tl.Ledger, tool: str, tool_use_id: str, **input: Any) -> None:
    """Write what a process killed while running the tool leaves: the intent, no outcome."""
    record = EffectRecord(
        session_id=ledger.session_id,
        tool_use_id=tool_use_id,
        tool=tool,
        input_hash=input_hash(input),
        status=Status.STARTED,
        attempt=1,
        error="in doubt: started, outcome not recorded",
        created_at=1.0,
        updated_at=1.0,
        approved_by="earlier-approver",
        worker="dead-worker",
    )
    assert ledger.store.backend.apply(ledger.session_id, [InsertEffect(record)]) == [True]


def queue_request(
    ledger: tl.Ledger,
    tool: str,
    tool_use_id: str,
    *,
    in_doubt: bool,
    attempt: int = 0,
    **input: Any,
) -> None:
    """Write a pending approval request for ``tool_use_id`` straight into the store, as the
    queue would (``attempt`` 0: one written by toolledger 0.1)."""
    from toolledger.ops import PutApproval
    from toolledger.records import ApprovalRecord, ApprovalStatus

    request = ApprovalRecord(
        session_id=ledger.session_id,
        tool_use_id=tool_use_id,
        tool=tool,
        input_hash=input_hash(input),
        input=input,
        in_doubt=in_doubt,
        reason="in doubt" if in_doubt else "high impact",
        status=ApprovalStatus.PENDING,
        requested_at=1.0,
        attempt=attempt,
    )
    assert ledger.store.apply(ledger.session_id, [PutApproval(request, None)]) == [True]


def test_plain_non_idempotent_call_in_doubt_is_never_rerun_silently(
    run: Runner, ledger: tl.Ledger
) -> None:
    calls = Counter()

    @tl.tool
    def send_email(to: str) -> str:
        calls.hit("send_email")
        return "sent"

    crash_left_started(ledger, "send_email", "toolu_1", to="a@b")
    for _ in range(2):
        (result,) = run([tool_use("toolu_1", "send_email", to="a@b")], [send_email], ledger=ledger)
        assert result["is_error"] is True
        assert "may already have happened" in result["content"]
        assert "toolledger resolve" in result["content"]
    assert calls["send_email"] == 0
    record = ledger.get("toolu_1")
    assert record is not None and record.status is Status.STARTED
    assert [r.tool_use_id for r in ledger.in_doubt()] == ["toolu_1"]


@pytest.mark.parametrize("effect", ["read_only", "idempotent"])
def test_safe_tools_are_rerun_and_told_they_are_in_doubt(
    run: Runner, ledger: tl.Ledger, effect: str
) -> None:
    contexts: list[tl.ToolContext] = []

    @tl.tool(effect=effect)  # type: ignore[call-overload]
    def set_config(key: str, value: str, ctx: tl.ToolContext) -> str:
        contexts.append(ctx)
        return f"{key}={value}"

    crash_left_started(ledger, "set_config", "toolu_1", key="k", value="v")
    (result,) = run(
        [tool_use("toolu_1", "set_config", key="k", value="v")], [set_config], ledger=ledger
    )
    assert result == {"type": "tool_result", "tool_use_id": "toolu_1", "content": "k=v"}
    (ctx,) = contexts
    assert ctx.in_doubt is True and ctx.attempt == 2
    record = ledger.get("toolu_1")
    assert record is not None and record.status is Status.SUCCEEDED and record.attempt == 2


def test_key_forwarding_tool_is_rerun_with_the_same_key(run: Runner, ledger: tl.Ledger) -> None:
    downstream: dict[str, str] = {}  # a payment API that honours Idempotency-Key
    calls = Counter()

    @tl.tool(forwards_idempotency_key=True)
    def charge(amount: int, ctx: tl.ToolContext) -> str:
        calls.hit("charge")
        return downstream.setdefault(ctx.idempotency_key, f"charge-{len(downstream) + 1}")

    # The first attempt reached the payment API, then the process died.
    expected_key = idempotency_key(ledger.session_id, "toolu_1")
    downstream[expected_key] = "charge-1"
    crash_left_started(ledger, "charge", "toolu_1", amount=100)
    (result,) = run([tool_use("toolu_1", "charge", amount=100)], [charge], ledger=ledger)
    assert result["content"] == "charge-1"
    assert calls["charge"] == 1 and len(downstream) == 1


def test_check_that_finds_the_effect_is_trusted(run: Runner, ledger: tl.Ledger) -> None:
    created = Counter()
    tickets = {"ext-toolu_1": {"id": 77}}

    @tl.tool
    def create_ticket(title: str, ctx: tl.ToolContext) -> dict[str, int]:
        created.hit("create_ticket")
        return {"id": 1}

    @create_ticket.check
    def _(title: str, ctx: tl.ToolContext) -> dict[str, int] | None:
        return tickets.get(f"ext-{ctx.tool_use_id}")

    crash_left_started(ledger, "create_ticket", "toolu_1", title="t")
    (result,) = run(
        [tool_use("toolu_1", "create_ticket", title="t")], [create_ticket], ledger=ledger
    )
    assert json.loads(result["content"]) == {"id": 77}
    assert created["create_ticket"] == 0
    record = ledger.get("toolu_1")
    assert record is not None and record.status is Status.SUCCEEDED


def test_check_that_finds_nothing_lets_the_call_run(run: Runner, ledger: tl.Ledger) -> None:
    created = Counter()

    @tl.tool
    def create_ticket(title: str, ctx: tl.ToolContext) -> dict[str, Any]:
        created.hit("create_ticket")
        return {"id": 1, "in_doubt": ctx.in_doubt, "attempt": ctx.attempt}

    @create_ticket.check
    async def _(title: str) -> None:
        return None

    crash_left_started(ledger, "create_ticket", "toolu_1", title="t")
    (result,) = run(
        [tool_use("toolu_1", "create_ticket", title="t")], [create_ticket], ledger=ledger
    )
    assert json.loads(result["content"]) == {"id": 1, "in_doubt": False, "attempt": 2}
    assert created["create_ticket"] == 1


def test_check_that_raises_leaves_the_call_in_doubt(run: Runner, ledger: tl.Ledger) -> None:
    @tl.tool
    def create_ticket(title: str) -> str:
        raise AssertionError("must not run")

    @create_ticket.check
    def _(title: str) -> None:
        raise ConnectionError("ticket API down")

    crash_left_started(ledger, "create_ticket", "toolu_1", title="t")
    (result,) = run(
        [tool_use("toolu_1", "create_ticket", title="t")], [create_ticket], ledger=ledger
    )
    assert result["is_error"] and "its check raised ConnectionError" in result["content"]
    record = ledger.get("toolu_1")
    assert record is not None and record.in_doubt


def test_high_impact_check_none_asks_as_a_first_run(run: Runner, ledger: tl.Ledger) -> None:
    asked: list[tl.ApprovalRequest] = []

    @tl.tool(high_impact=True)
    def wire(amount: int) -> str:
        return "wired"

    @wire.check
    def _(amount: int) -> None:
        return None

    crash_left_started(ledger, "wire", "toolu_1", amount=5)
    run(
        [tool_use("toolu_1", "wire", amount=5)],
        [wire],
        ledger=ledger,
        approve=lambda r: asked.append(r) or True,
    )
    (req,) = asked
    assert req.in_doubt is False and "no trace" in req.reason


def test_approver_is_asked_whether_to_rerun(run: Runner, ledger: tl.Ledger) -> None:
    """Only a yes that names the re-run runs a call in doubt again."""
    calls = Counter()
    asked: list[tl.ApprovalRequest] = []

    @tl.tool
    def send_email(to: str) -> str:
        calls.hit("send_email")
        return "sent again"

    crash_left_started(ledger, "send_email", "toolu_1", to="a@b")
    (result,) = run(
        [tool_use("toolu_1", "send_email", to="a@b")],
        [send_email],
        ledger=ledger,
        approve=lambda r: asked.append(r) or tl.Decision(approved=True, by="ana", rerun=True),
    )
    (req,) = asked
    assert req.in_doubt is True and "may already have happened" in req.reason
    assert result["content"] == "sent again" and calls["send_email"] == 1
    record = ledger.get("toolu_1")
    assert record is not None and record.status is Status.SUCCEEDED and record.attempt == 2


def test_a_plain_yes_does_not_rerun_a_call_in_doubt(run: Runner, ledger: tl.Ledger) -> None:
    """The approver people write first — yes to everything — keeps working for first runs,
    and is warned that its yes no longer re-runs a call in doubt (before 0.2 it did)."""
    calls = Counter()

    @tl.tool
    def send_email(to: str) -> str:
        calls.hit("send_email")
        return "sent again"

    crash_left_started(ledger, "send_email", "toolu_1", to="a@b")
    with pytest.warns(FutureWarning, match="does not re-run a call in doubt"):
        (result,) = run(
            [tool_use("toolu_1", "send_email", to="a@b")],
            [send_email],
            ledger=ledger,
            approve=lambda r: True,
        )
    assert calls["send_email"] == 0
    assert result["is_error"] and "plain yes" in result["content"]
    record = ledger.get("toolu_1")
    assert record is not None and record.status is Status.STARTED and record.attempt == 1


def test_declining_a_rerun_keeps_the_call_in_doubt(run: Runner, ledger: tl.Ledger) -> None:
    @tl.tool
    def send_email(to: str) -> str:
        raise AssertionError("must not run")

    crash_left_started(ledger, "send_email", "toolu_1", to="a@b")
    (result,) = run(
        [tool_use("toolu_1", "send_email", to="a@b")],
        [send_email],
        ledger=ledger,
        approve=lambda r: tl.Decision(approved=False, by="ana"),
    )
    assert result["is_error"] and "declined by ana" in result["content"]
    record = ledger.get("toolu_1")
    assert record is not None and record.status is Status.STARTED, "not denied: it may have run"


def test_outcome_unknown_leaves_the_call_in_doubt(run: Runner, ledger: tl.Ledger) -> None:
    calls = Counter()

    @tl.tool
    def transfer(amount: int) -> str:
        calls.hit("transfer")
        raise tl.OutcomeUnknown("bank timed out after the request was sent")

    use = tool_use("toolu_1", "transfer", amount=10)
    (first,) = run([use], [transfer], ledger=ledger)
    assert first["is_error"] and "bank timed out" in first["content"]
    record = ledger.get("toolu_1")
    assert record is not None and record.in_doubt
    (second,) = run([use], [transfer], ledger=ledger)
    assert second["is_error"] and calls["transfer"] == 1


def test_resolved_as_happened_answers_with_the_persons_result(
    run: Runner, ledger: tl.Ledger
) -> None:
    @tl.tool
    def send_email(to: str) -> str:
        raise AssertionError("must not run")

    crash_left_started(ledger, "send_email", "toolu_1", to="a@b")
    ledger.resolve("toolu_1", happened=True, result="it was sent at 10:02", by="ana")
    (result,) = run([tool_use("toolu_1", "send_email", to="a@b")], [send_email], ledger=ledger)
    assert result == {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": "it was sent at 10:02",
    }


def test_resolved_as_not_happened_runs_it(run: Runner, ledger: tl.Ledger) -> None:
    calls = Counter()

    @tl.tool
    def send_email(to: str) -> str:
        calls.hit("send_email")
        return "sent"

    crash_left_started(ledger, "send_email", "toolu_1", to="a@b")
    ledger.resolve("toolu_1", happened=False, by="ana")
    (result,) = run([tool_use("toolu_1", "send_email", to="a@b")], [send_email], ledger=ledger)
    assert result["content"] == "sent" and calls["send_email"] == 1
    record = ledger.get("toolu_1")
    assert record is not None and record.status is Status.SUCCEEDED and record.attempt == 2


def test_in_doubt_call_whose_tool_disappeared_stays_in_doubt(
    run: Runner, ledger: tl.Ledger
) -> None:
    crash_left_started(ledger, "send_email", "toolu_1", to="a@b")
    (result,) = run([tool_use("toolu_1", "send_email", to="a@b")], [], ledger=ledger)
    assert result["is_error"] and "may already have happened" in result["content"]
    assert "not in this toolset" in result["content"]


# -- a listing reads again before it calls a call in doubt ----------------------------------------


def _finishes_when_judged(store: tl.Store, then: EffectRecord) -> list[str]:
    """Make the attempt behind the stale record finish — ``then`` written — in the instant
    between a listing's read and its judgement, as a worker that commits its outcome and exits
    does; returns the ids judged."""
    judged: list[str] = []
    real = store.judge

    def judge(record: EffectRecord, lease: Any = None) -> Any:
        if not judged:
            update = UpdateEffect(then, expect_status=record.status, expect_attempt=record.attempt)
            assert store.backend.apply(record.session_id, [update]) == [True]
        judged.append(record.tool_use_id)
        return real(record, lease)  # the stale record, judged as it was read: over

    store.judge = judge  # type: ignore[method-assign]
    return judged


def _as_done(ledger: tl.Ledger, tool_use_id: str) -> EffectRecord:
    record = ledger.get(tool_use_id)
    assert record is not None
    return replace(record, status=Status.SUCCEEDED, result='{"id": 1}', error=None, updated_at=2.0)


@pytest.mark.parametrize("listing", ["ledger", "store"])
def test_a_call_that_finishes_while_it_is_listed_is_not_listed_in_doubt(
    store: tl.Store, listing: str
) -> None:
    ledger = store.ledger("session-1")
    crash_left_started(ledger, "send_email", "toolu_race", to="a@example.com")
    list_it = ledger.in_doubt if listing == "ledger" else store.in_doubt
    assert [r.tool_use_id for r in list_it()] == ["toolu_race"]  # without the race: in doubt
    judged = _finishes_when_judged(store, _as_done(ledger, "toolu_race"))
    assert list_it() == []
    assert judged == ["toolu_race"]  # judged over from the stale read, then read again
    assert [(r.status, r.attempt) for r in store.ledger("session-1").records()] == [
        (Status.SUCCEEDED, 1)
    ]
    assert [r for r, _ in store.started()] == []


def test_a_call_that_moved_to_a_live_attempt_while_listed_is_in_progress(store: tl.Store) -> None:
    """The stale attempt was settled and a second one began, the instant after the listing
    read it: it is listed as running, with the record as it is now, and not as in doubt."""
    ledger = store.ledger("session-1")
    crash_left_started(ledger, "send_email", "toolu_again", to="a@example.com")
    stale = ledger.get("toolu_again")
    assert stale is not None
    # Written as toolledger 0.1 wrote an intent: in progress for 5 minutes after its time.
    second = replace(stale, attempt=2, updated_at=store.clock())
    judged = _finishes_when_judged(store, second)
    assert store.in_doubt() == []
    listed = store.started()
    assert [(r.attempt, type(v).__name__) for r, v in listed] == [(2, "Running")]
    assert judged[:2] == ["toolu_again", "toolu_again"]  # the stale one, then the one now


def test_verify_reads_a_call_again_before_it_calls_it_in_doubt(store: tl.Store) -> None:
    ledger = store.ledger("session-1")
    crash_left_started(ledger, "send_email", "toolu_verified", to="a@example.com")
    assert any("in doubt" in p.message for p in tl.verify(store))  # without the race
    _finishes_when_judged(store, _as_done(ledger, "toolu_verified"))
    assert [p.message for p in tl.verify(store) if "toolu_verified" in p.message] == []


def test_verify_still_reports_a_late_effect_of_a_call_that_finished_as_it_was_read(
    store: tl.Store,
) -> None:
    """The record read again is the one reported on: its attempt 1, replaced and then
    reporting success late, is still an error once attempt 2 finishes between the two reads."""
    ledger = store.ledger("session-1")
    crash_left_started(ledger, "send_email", "toolu_late", to="a@example.com")
    first = ledger.get("toolu_late")
    assert first is not None
    late = PastAttempt(
        attempt=1,
        worker="dead-worker",
        holder=None,
        at=1.0,
        deadline=None,
        settled="an approver allowed a re-run",
        late="succeeded",
    )
    second = replace(first, attempt=2, history=(late,))
    update = UpdateEffect(second, expect_status=Status.STARTED, expect_attempt=1)
    assert store.backend.apply("session-1", [update]) == [True]
    _finishes_when_judged(store, _as_done(ledger, "toolu_late"))
    problems = [p for p in tl.verify(store) if "toolu_late" in p.message]
    assert [p.severity for p in problems] == [tl.Severity.ERROR], problems
    assert "Both may have taken effect" in problems[0].message


def test_a_view_of_a_call_that_finished_as_it_was_read_shows_it_still_going(
    store: tl.Store,
) -> None:
    """``Store.shown`` (history, timelines, the console's call view, a fork's effects left
    behind): the record as it was read, over by its judgement, is read once more; one that moved
    on was still going when it was read, and is not shown in doubt."""
    ledger = store.ledger("session-1")
    crash_left_started(ledger, "send_email", "toolu_shown", to="a@example.com")
    stale = ledger.get("toolu_shown")
    assert stale is not None
    assert isinstance(store.shown(stale), Over)  # unchanged: in doubt
    _finishes_when_judged(store, _as_done(ledger, "toolu_shown"))
    verdict = store.shown(stale)
    assert isinstance(verdict, Running) and "moved on" in verdict.why


def test_current_gives_the_record_as_it_is_now(store: tl.Store) -> None:
    """``Store.current`` (verify, history, a fork's effects left behind): a record judged over
    and unchanged is in doubt; one that finished meanwhile comes back finished, unjudged."""
    ledger = store.ledger("session-1")
    crash_left_started(ledger, "send_email", "toolu_now", to="a@example.com")
    stale = ledger.get("toolu_now")
    assert stale is not None
    same, verdict = store.current(stale)
    assert same == stale and isinstance(verdict, Over)
    _finishes_when_judged(store, _as_done(ledger, "toolu_now"))
    reads: list[list[str]] = []
    read_effects = store.backend.read_effects

    def counted(session_id: str, ids: Any = None) -> Any:
        reads.append(list(ids or []))
        return read_effects(session_id, ids)

    store.backend.read_effects = counted  # type: ignore[method-assign]
    now, verdict = store.current(stale)
    assert (now.status, now.result, verdict) == (Status.SUCCEEDED, '{"id": 1}', None)
    assert reads == [["toolu_now"]], "what it is now comes from the one read again"


def test_a_call_that_keeps_moving_as_it_is_read_is_listed_running(store: tl.Store) -> None:
    """Each read finds another attempt, each judged over as it was read: after three rounds the
    listing stops reading and lists it running — never in doubt, and never left out."""
    ledger = store.ledger("session-1")
    crash_left_started(ledger, "send_email", "toolu_moving", to="a@example.com")
    real = store.judge

    def judge(record: EffectRecord, lease: Any = None) -> Any:
        moved = replace(record, attempt=record.attempt + 1)
        update = UpdateEffect(moved, expect_status=Status.STARTED, expect_attempt=record.attempt)
        assert store.backend.apply(record.session_id, [update]) == [True]
        return real(record, lease)

    store.judge = judge  # type: ignore[method-assign]
    assert store.in_doubt() == []
    listed = store.started()
    assert [(type(v).__name__, "kept moving" in v.why) for _, v in listed] == [("Running", True)]


def test_a_call_removed_as_it_is_read_is_not_called_in_doubt(store: tl.Store) -> None:
    """Its attempt finished and a prune removed its session in the instant after the read:
    neither listed in doubt nor shown finished — it is gone, and a view says to look again."""
    ledger = store.ledger("session-1")
    crash_left_started(ledger, "send_email", "toolu_gone", to="a@example.com")
    stale = ledger.get("toolu_gone")
    assert stale is not None
    real = store.judge
    done = _as_done(ledger, "toolu_gone")

    def judge(record: EffectRecord, lease: Any = None) -> Any:
        if store.backend.read_effects("session-1", ["toolu_gone"]):
            update = UpdateEffect(done, expect_status=Status.STARTED, expect_attempt=1)
            assert store.backend.apply("session-1", [update]) == [True]
            drop = DropSession("session-1", expect_version=None, now=store.clock())
            store.backend.apply("session-1", [drop])
        return real(record, lease)

    store.judge = judge  # type: ignore[method-assign]
    now, verdict = store.current(stale)
    assert now == stale and isinstance(verdict, Running) and "removed" in verdict.why
    assert store.backend.read_effects("session-1") == {}
    crash_left_started(ledger, "send_email", "toolu_gone", to="a@example.com")
    assert store.in_doubt() == [] and ledger.in_doubt() == []


def test_a_call_in_doubt_in_the_queue_says_so_and_a_settled_one_cannot_be_approved(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The approval queue holds a call in doubt: the run's reason says it may already have
    happened, gives the commands that settle it first, and says approving runs it again. Once a
    person settled it (``resolve --happened``), approving the stale request is refused — and the
    e-mail is sent once."""
    from toolledger.cli.app import main
    from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

    url = f"sqlite:///{tmp_path / 'q.db'}"
    sent = Counter()

    @tl.tool
    def send_email(to: str) -> str:
        """Send."""
        if sent.hit(to) == 1:
            raise tl.OutcomeUnknown("the mail server did not answer")
        return "sent"

    script = [Reply(tool_uses=[ToolUse("send_email", {"to": "a@b.c"}, id="toolu_01")])]
    with ScriptedModel(script + [Reply(text="done")] * 3) as model, tl.open_store(url) as store:
        agent = tl.Agent(
            client=model.client(),
            model="m",
            tools=[send_email],
            store=store,
            approve=tl.approvals.queue,
        )
        first = agent.run(session="s3", prompt="mail")
        assert first.status is tl.RunStatus.NEEDS_ATTENTION and sent["a@b.c"] == 1
        again = agent.run(session="s3")
    assert again.status is tl.RunStatus.AWAITING_APPROVAL
    reason = again.reason or ""
    assert reason.startswith("in doubt, awaiting a person:"), reason
    assert "may already have happened" in reason and "runs it again" in reason
    assert f"toolledger --store {url} resolve s3 toolu_01 --happened`" in reason, reason
    assert f"toolledger --store {url} resolve s3 toolu_01 --not-happened`" in reason, reason
    assert reason.index("resolve") < reason.index("approve"), "settling comes first"

    assert main(["--store", url, "resolve", "s3", "toolu_01", "--happened", "--by", "ana"]) == 0
    capsys.readouterr()
    # The resolve closed the request in its own commit: nobody is left asked about a call
    # that is settled, and the session can be pruned one day.
    with tl.open_store(url) as store:
        (request,) = store.approvals("s3")
        assert request.status is tl.ApprovalStatus.DENIED
        assert request.decided_by == "ana (resolved: happened)"
        assert tl.approvals.pending(store) == []
        assert store.ledger("s3").get("toolu_01").status is tl.Status.SUCCEEDED  # type: ignore[union-attr]
    assert main(["--store", url, "approve", "s3", "toolu_01", "--by", "ana"]) != 0
    assert "denied" in capsys.readouterr().err
    assert main(["--store", url, "approvals"]) == 0
    assert "toolu_01" not in capsys.readouterr().out
    with ScriptedModel([*script, Reply(text="done")]) as model, tl.open_store(url) as store:
        agent = tl.Agent(
            client=model.client(),
            model="m",
            tools=[send_email],
            store=store,
            approve=tl.approvals.queue,
        )
        assert agent.run(session="s3").status is tl.RunStatus.COMPLETED
        assert "ana confirmed it happened" in json.dumps(model.requests[-1]["messages"][-1])
    assert sent["a@b.c"] == 1, "the e-mail went once"


def test_a_stale_in_doubt_request_cannot_be_approved_and_a_no_closes_it(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A request about a call in doubt that was settled without closing it (by a store written
    before resolve closed requests, or by the call's own late outcome): a yes is refused,
    naming the deny that closes it; a no is taken."""
    from toolledger.cli.app import main
    from toolledger.ops import PutApproval, UpdateEffect
    from toolledger.records import ApprovalRecord, ApprovalStatus

    url = f"sqlite:///{tmp_path / 'q.db'}"
    with tl.open_store(url) as store:
        ledger = store.ledger("s3")
        crash_left_started(ledger, "send_email", "toolu_01", to="a@b.c")
        record = ledger.get("toolu_01")
        assert record is not None
        request = ApprovalRecord(
            session_id="s3",
            tool_use_id="toolu_01",
            tool="send_email",
            input_hash=record.input_hash,
            input={"to": "a@b.c"},
            in_doubt=True,
            reason="in doubt",
            status=ApprovalStatus.PENDING,
            requested_at=store.clock(),
            attempt=record.attempt,
        )
        done = replace(record, status=tl.Status.SUCCEEDED, result='"sent"', updated_at=2.0)
        ops = [PutApproval(request, None), UpdateEffect(done, tl.Status.STARTED, record.attempt)]
        assert store.apply("s3", ops) == [True, True]
    assert main(["--store", url, "approve", "s3", "toolu_01", "--by", "ana"]) != 0
    err = capsys.readouterr().err
    assert "no longer the call in doubt" in err and "succeeded" in err, err
    assert "`deny` closes the request; `show` says what happened to the call:" in err, err
    lines = err.splitlines()  # each command whole, on a line of its own, as rule 21 asks
    assert f"toolledger --store {url} deny s3 toolu_01" in lines, err
    assert f"toolledger --store {url} show s3" in lines, err
    with tl.open_store(url) as store:
        (request,) = store.approvals("s3")
        assert request.status is tl.ApprovalStatus.PENDING, "nothing was decided"
    # A no is always taken: it closes the stale request, so nothing is left pending.
    assert main(["--store", url, "deny", "s3", "toolu_01", "--by", "ana"]) == 0
    with tl.open_store(url) as store:
        (request,) = store.approvals("s3")
        assert request.status is tl.ApprovalStatus.DENIED
        assert tl.approvals.pending(store) == []


@pytest.mark.parametrize("happened", [True, False])
def test_a_first_run_request_is_closed_by_happened_and_kept_by_not_happened(
    ledger: tl.Ledger, happened: bool
) -> None:
    """A request about running the call (not one about a call in doubt) is pending while the
    call is in doubt. "It happened": the call will not run again, so the request is closed with
    the resolve. "It did not happen": the next run asks it still, so it stays pending."""
    from toolledger.records import ApprovalStatus

    crash_left_started(ledger, "send", "toolu_9", to="x")
    queue_request(ledger, "send", "toolu_9", in_doubt=False, to="x")
    ledger.resolve("toolu_9", happened=happened, by="ana")
    (after,) = ledger.store.approvals(ledger.session_id)
    if happened:
        assert after.status is ApprovalStatus.DENIED
        assert after.decided_by == "ana (resolved: happened)"
    else:
        assert after.status is ApprovalStatus.PENDING and after.decided_by is None


def test_a_resolve_that_loses_its_race_closes_no_request(ledger: tl.Ledger) -> None:
    """The request is closed in the resolve's commit, and only with it: a resolve whose call
    moved on meanwhile (its late outcome landed) writes nothing, and the request stays."""
    from toolledger.ops import UpdateEffect
    from toolledger.records import ApprovalStatus

    store = ledger.store
    crash_left_started(ledger, "send", "toolu_9", to="x")
    record = ledger.get("toolu_9")
    assert record is not None
    queue_request(ledger, "send", "toolu_9", in_doubt=True, attempt=record.attempt, to="x")
    real = store.judge

    def judge(r: Any, lease: Any = None) -> Any:
        verdict = real(r, lease)
        late = replace(r, status=tl.Status.SUCCEEDED, result='"late"', updated_at=r.updated_at + 1)
        store.apply(ledger.session_id, [UpdateEffect(late, tl.Status.STARTED, r.attempt)])
        return verdict

    store.judge = judge  # type: ignore[method-assign]
    with pytest.raises(tl.SessionConflictError, match="changed while it was being resolved"):
        ledger.resolve("toolu_9", happened=False, by="ana")
    store.judge = real  # type: ignore[method-assign]
    assert ledger.get("toolu_9").result == '"late"'  # type: ignore[union-attr]
    (kept,) = store.approvals(ledger.session_id)
    assert kept.status is ApprovalStatus.PENDING


def test_a_request_toolledger_0_1_wrote_can_still_be_approved(ledger: tl.Ledger) -> None:
    """Requests written by 0.1 carry no attempt (0): while the call is in doubt, a person's yes
    to one is taken, as it was."""
    from toolledger.records import ApprovalStatus

    crash_left_started(ledger, "send", "toolu_9", to="x")
    queue_request(ledger, "send", "toolu_9", in_doubt=True, to="x")
    decided = tl.approvals.decide(
        ledger.store, ledger.session_id, "toolu_9", approved=True, by="ana"
    )
    assert decided.status is ApprovalStatus.APPROVED
