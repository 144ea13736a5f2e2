"""One lineage, one call per id (docs/design.md, rule 19), on every backend: a branch — forked at
any turn, 0 included, a fork of a fork, a rewind — whose model replays its lineage's tool_use ids
(a recorded session replayed, a cached answer) gets the recorded outcomes, never a second run,
and the key it forwards for such a call is the lineage's own. Effects are counted at the
receiver: a mail server that keeps every message it is handed, and drops a repeated
Message-ID."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

import toolledger as tl
from toolledger._verify import Severity, verify
from toolledger.codec import idempotency_key
from toolledger.testing.scripted import Reply, ScriptedModel, Step, ToolUse

PARENT = "mail-1"
SCRIPT = [
    Reply(text="Writing to Ana.", tool_uses=[ToolUse("send_email", {"to": "ana"})]),
    Reply(text="Writing to Bo.", tool_uses=[ToolUse("send_email", {"to": "bo"})]),
    Reply(text="Both told."),
]


@dataclass
class MailServer:
    """What the receiver saw: every message handed to it, and the ones it kept (a repeated
    key is answered with the first message, not sent again)."""

    handed: list[tuple[str, str]] = field(default_factory=list)  # (key, to)
    kept: dict[str, str] = field(default_factory=dict)  # key -> to
    lose_answer_to: str | None = None  # the send to this address goes out, its answer is lost

    def tools(self) -> list[tl.Tool]:
        # High-impact: its intent is recorded before it runs, so a lost answer leaves the call
        # in doubt in the ledger (a key-forwarding tool that is not writes no intent).
        @tl.tool(effect="non_idempotent", forwards_idempotency_key=True, high_impact=True)
        def send_email(to: str, ctx: tl.ToolContext) -> dict[str, Any]:
            """Send an e-mail; its Message-ID is the call's idempotency key."""
            self.handed.append((ctx.idempotency_key, to))
            repeat = ctx.idempotency_key in self.kept
            self.kept.setdefault(ctx.idempotency_key, to)
            if to == self.lose_answer_to and not repeat:
                raise tl.OutcomeUnknown("the mail server took the message; its answer was lost")
            return {"message_id": ctx.idempotency_key, "repeat": repeat}

        return [send_email]

    def keyed_tool(self, before: Callable[[], object] | None = None) -> tl.Tool:
        """A key-forwarding e-mail tool that is not high-impact (it writes no intent and is not
        claimed: the receiver's key is its guard). ``before``: called as it starts."""
        lock = threading.Lock()

        @tl.tool(effect="non_idempotent", forwards_idempotency_key=True, name="send_email")
        def keyed_email(to: str, ctx: tl.ToolContext) -> str:
            """Send an e-mail; its Message-ID is the call's idempotency key."""
            if before is not None:
                before()
            with lock:
                self.handed.append((ctx.idempotency_key, to))
                self.kept.setdefault(ctx.idempotency_key, to)
            return f"sent to {to}"

        return keyed_email

    def sent(self) -> list[str]:
        """Who got a message, once per message kept."""
        return sorted(self.kept.values())


def agent(store: tl.Store, model: ScriptedModel, mail: MailServer) -> tl.Agent:
    return tl.Agent(
        client=model.client(),
        model="claude-test",
        tools=mail.tools(),
        store=store,
        approve=lambda request: True,
    )


def queued_run(
    store: tl.Store, mail: MailServer, script: list[Step], session: str, prompt: str | None
) -> tl.Run:
    """``session`` run on against ``script``, its approvals queued for a person."""
    with ScriptedModel(script) as model:
        return tl.Agent(
            client=model.client(),
            model="claude-test",
            tools=mail.tools(),
            store=store,
            approve=tl.approvals.queue,
        ).run(session=session, prompt=prompt)


def run_parent(store: tl.Store, mail: MailServer) -> list[Step]:
    """Run the parent to its end; return its answers as recorded, ids included (what a
    model that replays it answers: ``ScriptedModel.from_session``)."""
    with ScriptedModel(SCRIPT) as model:
        agent(store, model, mail).run(session=PARENT, prompt="Tell Ana and Bo.")
    recorded = ScriptedModel.from_session(store, PARENT).script
    return [*recorded, *SCRIPT[len(recorded) :]]  # a parent stopped early: the rest, as scripted


def replay(store: tl.Store, session: str, mail: MailServer, recorded: list[Step]) -> tl.Run:
    """Run ``session`` on against a model that answers as the parent did."""
    with ScriptedModel(recorded) as model:
        return agent(store, model, mail).run(session=session)


def lineage_keys(store: tl.Store) -> dict[str, str]:
    """The key of each of the parent's calls, by addressee."""
    out: dict[str, str] = {}
    for m in store.messages(PARENT):
        if m.role != "assistant":
            continue
        for block in m.content:
            if block.get("type") == "tool_use":
                out[block["input"]["to"]] = idempotency_key(PARENT, block["id"])
    return out


def no_errors(store: tl.Store) -> None:
    assert [p.message for p in verify(store) if p.severity is Severity.ERROR] == []


@pytest.mark.parametrize("turn", [0, 1, 2, 3])
def test_a_fork_replaying_its_parent_at_every_turn_sends_nothing_twice(
    store: tl.Store, turn: int
) -> None:
    mail = MailServer()
    recorded = run_parent(store, mail)
    assert store.session(PARENT).status is tl.RunStatus.COMPLETED  # type: ignore[union-attr]
    assert mail.sent() == ["ana", "bo"]
    keys = lineage_keys(store)

    fork = tl.fork(store, PARENT, at_turn=turn, new_session=f"fork-{turn}")
    run = replay(store, fork, mail, recorded)

    assert run.status is tl.RunStatus.COMPLETED
    assert mail.handed == [(keys["ana"], "ana"), (keys["bo"], "bo")], "nothing handed again"
    assert mail.sent() == ["ana", "bo"]
    # The fork's transcript answers the replayed calls with the parent's outcomes.
    for r in store.ledger(PARENT).records():
        copy = store.ledger(fork).get(r.tool_use_id)
        assert copy is not None and copy.status is tl.Status.SUCCEEDED
        assert copy.result == r.result
    no_errors(store)


@pytest.mark.parametrize("turn", [0, 1])
def test_a_call_in_doubt_is_run_again_by_its_origin_alone(store: tl.Store, turn: int) -> None:
    """Bo's e-mail went out but its answer was lost: in doubt on the parent. The fork's replay
    meets it and leaves it to the parent, where the call was made; the parent's next run sends
    it again under its key (the mail server drops the repeat), and the fork then takes that
    outcome: one e-mail to Bo, one key."""
    mail = MailServer(lose_answer_to="bo")
    recorded = run_parent(store, mail)
    keys = lineage_keys(store)
    assert mail.handed == [(keys["ana"], "ana"), (keys["bo"], "bo")]
    (doubt,) = store.in_doubt()
    assert doubt.session_id == PARENT

    fork = tl.fork(store, PARENT, at_turn=turn)
    run = replay(store, fork, mail, recorded)
    assert run.status is tl.RunStatus.NEEDS_ATTENTION
    assert f"resolve {PARENT} {doubt.tool_use_id}" in (run.reason or "")
    assert len(mail.handed) == 2, "the fork sent nothing"

    assert replay(store, PARENT, mail, recorded).status is tl.RunStatus.COMPLETED
    assert replay(store, fork, mail, recorded).status is tl.RunStatus.COMPLETED
    assert mail.sent() == ["ana", "bo"], "the receiver kept one message each"
    assert mail.handed[2:] == [(keys["bo"], "bo")], "sent again once, under the parent's key"
    copy = store.ledger(fork).get(doubt.tool_use_id)
    assert copy is not None and copy.status is tl.Status.SUCCEEDED


def test_a_call_the_parent_had_not_run_yet_runs_there_once(store: tl.Store) -> None:
    """The fork is made while the parent waits for a person to approve Ana's e-mail: nothing is
    recorded of it yet. The fork's replay does not send it — the parent's last turn still asks
    for it, so it runs there — and stops, naming the parent. The parent is approved and sends it;
    the fork then takes that outcome: one e-mail, one key, one approval for the lineage."""
    mail = MailServer()
    waiting = queued_run(store, mail, SCRIPT, PARENT, "Tell Ana and Bo.")
    assert waiting.status is tl.RunStatus.AWAITING_APPROVAL
    recorded = [*ScriptedModel.from_session(store, PARENT).script, *SCRIPT[1:]]
    (request,) = store.approvals(PARENT)
    key = idempotency_key(PARENT, request.tool_use_id)

    fork = tl.fork(store, PARENT, at_turn=0)
    stopped = replay(store, fork, mail, recorded)
    assert stopped.status is tl.RunStatus.NEEDS_ATTENTION and mail.handed == []
    assert f"is the call of session {PARENT!r}" in (stopped.reason or "")

    tl.approvals.decide(store, PARENT, request.tool_use_id, approved=True, by="ana")
    went_on = queued_run(store, mail, recorded, PARENT, None)  # Ana's e-mail, then Bo's asks
    assert (
        went_on.status is tl.RunStatus.AWAITING_APPROVAL and went_on.final_text == "Writing to Bo."
    )
    assert replay(store, fork, mail, recorded).status is tl.RunStatus.COMPLETED
    assert [k for k, to in mail.handed if to == "ana"] == [key], "sent once, by the parent"
    copy = store.ledger(fork).get(request.tool_use_id)
    assert copy is not None and copy.status is tl.Status.SUCCEEDED


def test_a_call_the_parent_will_not_run_runs_on_the_branch_under_the_parent_key(
    store: tl.Store,
) -> None:
    """A rewind took the parent back past Ana's e-mail while it waited for approval: no turn of
    the parent asks for it any more. A fork made before the rewind replays it: the fork runs it
    itself — under the parent's key, the lineage's."""
    mail = MailServer()
    queued_run(store, mail, SCRIPT, PARENT, "Tell Ana and Bo.")
    recorded = [*ScriptedModel.from_session(store, PARENT).script, *SCRIPT[1:]]
    (request,) = store.approvals(PARENT)
    fork = tl.fork(store, PARENT, at_turn=0)
    tl.rewind(store, PARENT, to_turn=0, effects_after_fork="ignore")

    assert replay(store, fork, mail, recorded).status is tl.RunStatus.COMPLETED
    key = idempotency_key(PARENT, request.tool_use_id)
    assert [k for k, to in mail.handed if to == "ana"] == [key]
    copy = store.ledger(fork).get(request.tool_use_id)
    assert copy is not None and copy.status is tl.Status.SUCCEEDED and copy.origin is None
    assert copy.made_in == PARENT, "the branch's own run of the lineage's call"


def test_forks_of_forks_and_a_rewind_replay_nothing(store: tl.Store) -> None:
    mail = MailServer()
    recorded = run_parent(store, mail)
    keys = lineage_keys(store)
    first = tl.fork(store, PARENT, at_turn=0, new_session="first")
    replay(store, first, mail, recorded)
    second = tl.fork(store, first, at_turn=1, new_session="second")
    replay(store, second, mail, recorded)
    third = tl.fork(store, second, at_turn=1, new_session="third")
    replay(store, third, mail, recorded)
    tl.rewind(store, third, to_turn=0)
    assert replay(store, third, mail, recorded).status is tl.RunStatus.COMPLETED
    tl.rewind(store, PARENT, to_turn=0)
    replay(store, PARENT, mail, recorded)

    assert mail.handed == [(keys["ana"], "ana"), (keys["bo"], "bo")]
    for session in (first, second, third):
        for r in store.ledger(session).records():
            assert r.status is tl.Status.SUCCEEDED
    no_errors(store)


def test_a_lineage_id_with_another_input_is_refused_on_a_branch(store: tl.Store) -> None:
    mail = MailServer()
    run_parent(store, mail)
    fork = tl.fork(store, PARENT, at_turn=0)
    (ana, _) = [r.tool_use_id for r in store.ledger(PARENT).records()]
    block = {"type": "tool_use", "id": ana, "name": "send_email", "input": {"to": "mallory"}}
    with pytest.raises(tl.LedgerMismatchError):
        tl.run_tool_uses([block], mail.tools(), ledger=store.ledger(fork))
    assert mail.sent() == ["ana", "bo"]


@pytest.mark.parametrize(
    ("first", "keyed"),
    [("parent", False), ("fork", False), ("parent", True), ("fork", True)],
    ids=[
        "claimed, parent first",
        "claimed, fork first",
        "looked up, parent first",
        "looked up, fork first",
    ],
)
def test_an_id_made_after_the_fork_with_another_input_is_refused_on_every_side(
    store: tl.Store, first: str, keyed: bool
) -> None:
    """The fork is made before either side makes the call; each then meets one id with another
    input (an edited transcript, a model that answers a replay differently). Whichever makes it
    first, the other is refused, as it is for a call copied into the fork: one lineage, one
    call per id — it used to depend on who came first, and the fork sent the second mail. A
    key-forwarding call the fork made first left no record in the parent, which sent the other
    input under the same key: a receiver that honours keys answered it with the fork's outcome,
    its own effect never made, and the parent's ledger recorded a success."""
    mail = MailServer()
    tools = [mail.keyed_tool()] if keyed else mail.tools()
    with ScriptedModel([Reply(text="Hello.")]) as model:
        tl.Agent(client=model.client(), model="claude-test", tools=tools, store=store).run(
            session=PARENT, prompt="Say hello."
        )
    fork = tl.fork(store, PARENT, at_turn=1, new_session="fork")

    def block(to: str) -> list[dict[str, Any]]:
        return [{"type": "tool_use", "id": "toolu_one", "name": "send_email", "input": {"to": to}}]

    maker, other = (PARENT, fork) if first == "parent" else (fork, PARENT)
    tl.run_tool_uses(block("ana"), tools, ledger=store.ledger(maker), approve=lambda r: True)
    with pytest.raises(tl.LedgerMismatchError):
        tl.run_tool_uses(
            block("mallory"), tools, ledger=store.ledger(other), approve=lambda r: True
        )
    assert [to for _, to in mail.handed] == ["ana"], "nothing run for the other input"


def test_a_key_forwarding_id_a_branch_made_with_another_input_is_refused_on_its_sibling(
    store: tl.Store,
) -> None:
    """Two forks made before either makes a key-forwarding call meet one id with another
    input. Both would forward the lineage's key: the second, run, is answered by a receiver
    that honours keys with the first's outcome, its own e-mail never sent, and its ledger
    records a success. The first fork's call is pinned in the lineage's first session, so the
    second is refused before anything runs."""
    mail = MailServer()
    tools = [mail.keyed_tool()]
    with ScriptedModel([Reply(text="Hello.")]) as model:
        tl.Agent(client=model.client(), model="claude-test", tools=tools, store=store).run(
            session=PARENT, prompt="Say hello."
        )
    first = tl.fork(store, PARENT, at_turn=1, new_session="first")
    second = tl.fork(store, PARENT, at_turn=1, new_session="second")

    def block(to: str) -> list[dict[str, Any]]:
        return [{"type": "tool_use", "id": "toolu_one", "name": "send_email", "input": {"to": to}}]

    tl.run_tool_uses(block("ana"), tools, ledger=store.ledger(first))
    with pytest.raises(tl.LedgerMismatchError):
        tl.run_tool_uses(block("mallory"), tools, ledger=store.ledger(second))
    assert [to for _, to in mail.handed] == ["ana"], "nothing run for the other input"
    assert store.ledger(second).get("toolu_one") is None


@dataclass
class Desk:
    """A ticket desk without keys: a plain non-idempotent tool. The answer to ``lose`` gets
    lost once: after the ticket was opened, or — ``open_when_lost=False`` — before."""

    opened: list[str] = field(default_factory=list)
    lose: str | None = None
    open_when_lost: bool = True

    def tools(self) -> list[tl.Tool]:
        @tl.tool(effect="non_idempotent")
        def create_ticket(title: str) -> str:
            """Open a ticket."""
            if title == self.lose:
                self.lose = None
                if self.open_when_lost:
                    self.opened.append(title)
                raise tl.OutcomeUnknown("the desk did not answer")
            self.opened.append(title)
            return f"T-{len(self.opened)}"

        return [create_ticket]


TICKETS = [
    Reply(tool_uses=[ToolUse("create_ticket", {"title": "first"})]),
    Reply(tool_uses=[ToolUse("create_ticket", {"title": "second"})]),
    Reply(text="Both open."),
]


def desk_run(store: tl.Store, session: str, desk: Desk, script: list[Step]) -> tl.Run:
    with ScriptedModel(script) as model:
        agent = tl.Agent(
            client=model.client(), model="claude-test", tools=desk.tools(), store=store
        )
        return agent.run(session=session, prompt="Open two tickets.")


@pytest.mark.parametrize("happened", [True, False])
def test_a_call_in_doubt_when_the_fork_was_made_is_settled_once_in_its_origin(
    store: tl.Store, happened: bool
) -> None:
    """The second ticket's answer was lost: in doubt on the parent when it is forked at turn 0.
    The fork's replay meets it and does not run it: it is the parent's call, settled there —
    once for both — and the fork takes that outcome."""
    desk = Desk(lose="second", open_when_lost=happened)
    assert desk_run(store, PARENT, desk, TICKETS).status is tl.RunStatus.NEEDS_ATTENTION
    (doubt,) = store.in_doubt()
    recorded = [*ScriptedModel.from_session(store, PARENT).script, TICKETS[-1]]
    fork = tl.fork(store, PARENT, at_turn=0, new_session="fork")
    before = list(desk.opened)

    run = desk_run(store, fork, desk, recorded)
    assert desk.opened == before, "the fork ran nothing"
    assert run.status is tl.RunStatus.NEEDS_ATTENTION
    assert f"resolve {PARENT} {doubt.tool_use_id}" in (run.reason or ""), "settled where made"
    assert [r.session_id for r in store.in_doubt()] == [PARENT], "listed once, where it was made"
    with pytest.raises(tl.NotInDoubtError, match="settle it in that session"):
        store.ledger(fork).resolve(doubt.tool_use_id, happened=happened, by="ana")

    store.ledger(PARENT).resolve(doubt.tool_use_id, happened=happened, by="ana")
    assert desk_run(store, PARENT, desk, TICKETS).status is tl.RunStatus.COMPLETED
    assert desk_run(store, fork, desk, recorded).status is tl.RunStatus.COMPLETED
    assert sorted(desk.opened) == ["first", "second"], "each ticket opened once"
    copy = store.ledger(fork).get(doubt.tool_use_id)
    original = store.ledger(PARENT).get(doubt.tool_use_id)
    assert copy is not None and original is not None
    assert (copy.status, copy.result, copy.origin) == (original.status, original.result, PARENT)
    no_errors(store)


# -- calls a lineage makes after its branches were made: claimed once for all of them ------------

GREETED = [Reply(text="Hello.")]
REPLAYED = [
    *GREETED,  # each session holds the greeting: the model answers its next turn
    Reply(tool_uses=[ToolUse("create_ticket", {"title": "outage"}, id="toolu_same")]),
    Reply(text="Opened."),
]


KEYED_SCRIPT = [
    *GREETED,
    Reply(tool_uses=[ToolUse("send_email", {"to": "ana"}, id="toolu_keyed")]),
    Reply(text="Sent."),
]
"""A model that, after the greeting, asks once for a key-forwarding e-mail, every branch alike."""


def lineage_of_three(store: tl.Store, desk: Desk) -> tuple[str, str]:
    """A parent that only said hello, a fork of it and a fork of that fork — all made before
    any of them opened a ticket, so no ledger holds a call to copy."""
    with ScriptedModel(GREETED) as model:
        tl.Agent(client=model.client(), model="claude-test", tools=desk.tools(), store=store).run(
            session=PARENT, prompt="Say hello."
        )
    first = tl.fork(store, PARENT, at_turn=1, new_session="first")
    second = tl.fork(store, first, at_turn=1, new_session="second")
    return first, second


def go_on(store: tl.Store, session: str, desk: Desk) -> tl.Run:
    """``session`` asked to open a ticket, answered by a model that answers every branch alike,
    id included (a replay, a cache, a deterministic model)."""
    with ScriptedModel(REPLAYED) as model:
        agent = tl.Agent(
            client=model.client(), model="claude-test", tools=desk.tools(), store=store
        )
        return agent.run(session=session, prompt="Open a ticket.")


@pytest.mark.parametrize(
    "order",
    [
        ("first", "second", PARENT),
        ("second", "first", PARENT),
        (PARENT, "first", "second"),
        ("second", PARENT, "first"),
    ],
)
def test_a_call_made_after_the_branches_runs_once_for_the_lineage(
    store: tl.Store, order: tuple[str, str, str]
) -> None:
    """Two forks and their parent each meet the same new call id: the first session to make it
    makes it for the lineage, the others take its outcome — one ticket, under one key."""
    desk = Desk()
    lineage_of_three(store, desk)
    runs = {session: go_on(store, session, desk) for session in order}
    assert desk.opened == ["outage"], "one ticket for the lineage"
    assert {s: r.status for s, r in runs.items()} == dict.fromkeys(order, tl.RunStatus.COMPLETED)
    made = store.ledger(order[0]).get("toolu_same")
    assert made is not None and made.status is tl.Status.SUCCEEDED and not made.copied
    for session in order[1:]:
        held = store.ledger(session).get("toolu_same")
        assert held is not None and held.copied, session
        assert (held.status, held.result) == (made.status, made.result)
        assert held.key_session == made.key_session == order[0], "one key for the lineage"
    # What each model was told: the same ticket.
    for session in order:
        (result,) = [
            b
            for m in store.messages(session)
            if m.role == "user" and isinstance(m.content, list)
            for b in m.content
            if b.get("type") == "tool_result"
        ]
        assert result["content"] == "T-1", session
    no_errors(store)


def test_a_branch_waits_for_the_call_its_sibling_is_running(store: tl.Store) -> None:
    """While the first fork's ticket is being opened, the second meets the same id: it does not
    open another — it says the call is in progress — and once the first is done it takes its
    outcome."""
    inside, release = threading.Event(), threading.Event()
    opened: list[str] = []

    @tl.tool(effect="non_idempotent", name="create_ticket")
    def slow_ticket(title: str) -> str:
        """Open a ticket, slowly."""
        opened.append(title)
        inside.set()
        assert release.wait(30)
        return f"T-{len(opened)}"

    desk = Desk()
    first, second = lineage_of_three(store, desk)
    errors: list[BaseException] = []

    def run_first() -> None:
        try:
            with ScriptedModel(REPLAYED) as model:
                tl.Agent(
                    client=model.client(), model="claude-test", tools=[slow_ticket], store=store
                ).run(session=first, prompt="Open a ticket.")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    worker = threading.Thread(target=run_first)
    worker.start()
    try:
        assert inside.wait(30)
        with (
            pytest.raises(tl.EffectInProgressError, match="first"),
            ScriptedModel(REPLAYED) as model,
        ):
            tl.Agent(
                client=model.client(), model="claude-test", tools=[slow_ticket], store=store
            ).run(session=second, prompt="Open a ticket.")
    finally:
        release.set()
        worker.join(30)
    assert errors == []
    with ScriptedModel(REPLAYED) as model:
        run = tl.Agent(
            client=model.client(), model="claude-test", tools=[slow_ticket], store=store
        ).run(session=second)
    assert run.status is tl.RunStatus.COMPLETED
    assert opened == ["outage"]
    held = store.ledger(second).get("toolu_same")
    assert held is not None and held.status is tl.Status.SUCCEEDED and held.origin == first


def test_one_approval_for_the_lineage(store: tl.Store) -> None:
    """A high-impact call both forks meet: the first asks a person; the second asks no one and
    stops, naming the session where it is decided; one yes, one e-mail, both forks answered."""
    mail = MailServer()
    first, second = lineage_of_three(store, Desk())
    script = [
        *GREETED,
        Reply(tool_uses=[ToolUse("send_email", {"to": "ana"}, id="toolu_mail")]),
        Reply(text="Sent."),
    ]

    def run(session: str, prompt: str | None) -> tl.Run:
        return queued_run(store, mail, script, session, prompt)

    assert run(first, "Tell Ana.").status is tl.RunStatus.AWAITING_APPROVAL
    stopped = run(second, "Tell Ana.")
    assert stopped.status is tl.RunStatus.NEEDS_ATTENTION
    assert f"is the call of session {first!r}" in (stopped.reason or "")
    assert [a.session_id for s in (PARENT, first, second) for a in store.approvals(s)] == [first]
    tl.approvals.decide(store, first, "toolu_mail", approved=True, by="ana")
    assert run(first, None).status is tl.RunStatus.COMPLETED
    assert run(second, None).status is tl.RunStatus.COMPLETED
    assert mail.handed == [(idempotency_key(first, "toolu_mail"), "ana")]
    no_errors(store)


@pytest.mark.parametrize("approved", [True, False])
def test_a_call_the_root_asked_a_person_about_is_not_claimed_by_a_branch(
    store: tl.Store, approved: bool
) -> None:
    """The lineage's first session asks a person about a high-impact call (it claims nothing:
    its ledger is where claims land), then a branch meets the same call: the branch does not
    claim it and ask a second person — it stops, naming the root — and the root's decision is
    the lineage's: a yes sends one e-mail, a no sends none, on both sessions."""
    mail = MailServer()
    first, _ = lineage_of_three(store, Desk())
    script = [
        *GREETED,
        Reply(tool_uses=[ToolUse("send_email", {"to": "ana"}, id="toolu_mail")]),
        Reply(text="Done."),
    ]

    def run(session: str, prompt: str | None) -> tl.Run:
        return queued_run(store, mail, script, session, prompt)

    assert run(PARENT, "Tell Ana.").status is tl.RunStatus.AWAITING_APPROVAL
    stopped = run(first, "Tell Ana.")
    assert stopped.status is tl.RunStatus.NEEDS_ATTENTION
    assert f"is the call of session {PARENT!r}" in (stopped.reason or "")
    assert [a.session_id for s in (PARENT, first) for a in store.approvals(s)] == [PARENT]
    tl.approvals.decide(store, PARENT, "toolu_mail", approved=approved, by="ana")
    assert run(PARENT, None).status is tl.RunStatus.COMPLETED
    assert run(first, None).status is tl.RunStatus.COMPLETED
    assert mail.handed == ([(idempotency_key(PARENT, "toolu_mail"), "ana")] if approved else [])
    assert tl.approvals.pending(store) == []
    no_errors(store)


def test_a_branch_that_only_delivers_its_calls_again_claims_them_too(store: tl.Store) -> None:
    """``run_tool_uses`` on a branch's ledger, with no agent: the same claim, the same one run."""
    desk = Desk()
    first, second = lineage_of_three(store, desk)
    block = {"type": "tool_use", "id": "toolu_same", "name": "create_ticket"}
    block["input"] = {"title": "x"}
    (one,) = tl.run_tool_uses([block], desk.tools(), ledger=store.ledger(first))
    (two,) = tl.run_tool_uses([block], desk.tools(), ledger=store.ledger(second))
    (three,) = tl.run_tool_uses([block], desk.tools(), ledger=store.ledger(PARENT))
    assert desk.opened == ["x"]
    assert one["content"] == two["content"] == three["content"] == "T-1"
    claim = store.ledger(PARENT).get("toolu_same")
    assert claim is not None and claim.origin == first


def test_branches_racing_on_one_new_id_make_it_once(store: tl.Store) -> None:
    """Four branches' models ask for the same new call at the same instant, each run in a
    thread of its own: one claim lands, one ticket is opened; a run that meets it running says
    so (``EffectInProgressError``) and, run again, takes its outcome."""
    first, second = lineage_of_three(store, Desk())
    third = tl.fork(store, PARENT, at_turn=1, new_session="third")
    fourth = tl.fork(store, second, at_turn=1, new_session="fourth")
    branches = (first, second, third, fourth)
    opened: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(len(branches))

    @tl.tool(effect="non_idempotent")
    def create_ticket(title: str) -> str:
        """Open a ticket (slowly: the others arrive while it runs)."""
        with lock:
            opened.append(title)
        threading.Event().wait(0.3)
        return f"T-{len(opened)}"

    def run(session: str, prompt: str | None) -> tl.Run:
        with ScriptedModel(REPLAYED) as model:
            agent = tl.Agent(
                client=model.client(), model="claude-test", tools=[create_ticket], store=store
            )
            return agent.run(session=session, prompt=prompt)

    outcomes: dict[str, object] = {}

    def race(session: str) -> None:
        start.wait(10)
        try:
            outcomes[session] = run(session, "Open a ticket.").status
        except tl.EffectInProgressError as exc:
            outcomes[session] = exc
        except BaseException as exc:  # pragma: no cover - reported below
            outcomes[session] = repr(exc)

    threads = [threading.Thread(target=race, args=(s,)) for s in branches]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(
        o is tl.RunStatus.COMPLETED or isinstance(o, tl.EffectInProgressError)
        for o in outcomes.values()
    ), outcomes
    for session, o in outcomes.items():
        if o is not tl.RunStatus.COMPLETED:
            assert run(session, None).status is tl.RunStatus.COMPLETED
    assert opened == ["outage"], "one ticket for four branches"
    records = {s: store.ledger(s).get("toolu_same") for s in branches}
    assert all(r is not None and r.status is tl.Status.SUCCEEDED for r in records.values())
    made = [s for s, r in records.items() if r is not None and not r.copied]
    assert len(made) == 1, records
    claim = store.ledger(PARENT).get("toolu_same")
    assert claim is not None and claim.origin == made[0]
    no_errors(store)


def test_the_async_twin_claims_the_same_way(store: tl.Store) -> None:
    desk = Desk()
    first, second = lineage_of_three(store, desk)
    block = {"type": "tool_use", "id": "toolu_async", "name": "create_ticket"}
    block["input"] = {"title": "async"}

    async def deliver(session: str) -> list[dict[str, object]]:
        return await tl.arun_tool_uses([block], desk.tools(), ledger=store.ledger(session))

    (one,) = asyncio.run(deliver(second))
    (two,) = asyncio.run(deliver(first))
    assert desk.opened == ["async"] and one["content"] == two["content"] == "T-1"
    held = store.ledger(first).get("toolu_async")
    assert held is not None and held.origin == second


def test_a_call_its_maker_gave_up_is_taken_over_by_one_branch(store: tl.Store) -> None:
    """A branch asked a person about an e-mail and was then rewound past it: it gave the call
    up. Two forks made while it waited both replay the call: the first takes the lineage's
    claim over and asks for itself; the second finds the claim moved and waits on that fork —
    one approval, one e-mail."""
    mail = MailServer()
    lineage_of_three(store, Desk())
    maker = tl.fork(store, PARENT, at_turn=1, new_session="maker")
    script = [
        *GREETED,
        Reply(tool_uses=[ToolUse("send_email", {"to": "ana"}, id="toolu_mail")]),
        Reply(text="Sent."),
    ]

    def run(session: str, prompt: str | None) -> tl.Run:
        return queued_run(store, mail, script, session, prompt)

    assert run(maker, "Tell Ana.").status is tl.RunStatus.AWAITING_APPROVAL
    left = tl.fork(store, maker, at_turn=1, new_session="left")
    right = tl.fork(store, maker, at_turn=1, new_session="right")
    tl.rewind(store, maker, to_turn=1, effects_after_fork="ignore")  # the maker gives it up

    assert run(left, "Tell Ana.").status is tl.RunStatus.AWAITING_APPROVAL
    claim = store.ledger(PARENT).get("toolu_mail")
    assert claim is not None and claim.origin == left, "the claim moved to the first to go on"
    stopped = run(right, "Tell Ana.")
    assert stopped.status is tl.RunStatus.NEEDS_ATTENTION
    assert f"is the call of session {left!r}" in (stopped.reason or "")
    pending = [a.session_id for s in (maker, left, right) for a in store.approvals(s)]
    assert [s for s in pending if s != maker] == [left], "one question for the lineage"

    tl.approvals.decide(store, left, "toolu_mail", approved=True, by="ana")
    assert run(left, None).status is tl.RunStatus.COMPLETED
    assert run(right, None).status is tl.RunStatus.COMPLETED
    assert [to for _, to in mail.handed] == ["ana"], "one e-mail"
    key = mail.handed[0][0]
    assert key == idempotency_key(maker, "toolu_mail"), (
        "under the key of the session it was made in"
    )
    no_errors(store)


def test_forks_written_before_roots_were_kept_find_theirs(store: tl.Store) -> None:
    """A fork made by 0.1 names its source, not its lineage's first session: the store follows
    the sources back (``Store.lineage_root``), and a claim lands where a fork made now puts it."""
    from dataclasses import replace

    from toolledger.ops import PutSession

    lineage_of_three(store, Desk())
    for sid in ("first", "second"):
        state = store.session(sid)
        assert state is not None and state.lineage[-1].root == PARENT  # kept by this release
        old = tuple(replace(b, root=None) for b in state.lineage)
        store.apply(
            sid, [PutSession(replace(state, lineage=old, version=state.version + 1), state.version)]
        )
    with tl.open_store(store.url) as fresh:  # nothing known yet: read from the states
        assert fresh.lineage_root("second") == PARENT
        assert fresh.lineage_root("first") == PARENT
        assert fresh.lineage_root(PARENT) is None
        assert fresh.lineage_root("no-such-session") is None


def test_a_pruned_branch_hands_its_calls_outcomes_to_the_lineage(store: tl.Store) -> None:
    """The branch that made the lineage's call is removed (``toolledger prune``) while its
    source and its sibling are held by a worker: the outcome it held is written into its claim
    first, so those two, meeting the id later, take it — nothing is run again."""
    from toolledger.ops import DropLease, TakeLease
    from toolledger.records import Lease

    desk = Desk()
    first, second = lineage_of_three(store, desk)
    assert go_on(store, first, desk).status is tl.RunStatus.COMPLETED
    made = store.ledger(first).get("toolu_same")
    assert made is not None and made.status is tl.Status.SUCCEEDED

    held: list[Lease] = []
    for session in (PARENT, second):  # a worker holds them: prune keeps them
        now = store.lease(session)
        lease = Lease(
            session_id=session,
            owner="elsewhere:1:w",
            token=(now.token if now else 0) + 1,
            expires_at=store.now() + 600,
        )
        take = TakeLease(
            lease,
            expect_token=now.token if now else 0,
            expect_expires_at=now.expires_at if now else None,
            expect_renewals=now.renewals if now else None,
        )
        assert store.apply(session, [take]) == [True]
        held.append(lease)
    report = store.prune(older_than=0)
    assert [p.session_id for p in report.removed] == [first]
    assert store.session(first) is None and store.ledger(first).get("toolu_same") is None
    claim = store.ledger(PARENT).get("toolu_same")
    assert claim is not None and (claim.status, claim.result) == (made.status, made.result)
    for lease in held:
        store.apply(lease.session_id, [DropLease(lease.session_id, lease.token)])

    for session in (second, PARENT):
        assert go_on(store, session, desk).status is tl.RunStatus.COMPLETED
    assert desk.opened == ["outage"], "made once, by the branch that is gone"


def test_prune_keeps_a_lineage_s_first_session_while_a_branch_of_it_remains(
    store: tl.Store,
) -> None:
    """The second fork made the lineage's call and ended; the parent ended too; the first fork
    waits to be run. A prune removes the second fork (its outcome handed to its claim in the
    parent) but keeps the parent, whose ledger answers the claim: the first fork, meeting the
    id, takes the outcome — one ticket. Once no branch remains, the parent goes too."""
    desk = Desk()
    first, second = lineage_of_three(store, desk)
    assert go_on(store, second, desk).status is tl.RunStatus.COMPLETED

    report = store.prune(older_than=0)
    assert [p.session_id for p in report.removed] == [second]
    kept = {k.session_id: k.why for k in report.kept}
    assert f"first session of the lineage of {first!r}" in kept[PARENT]
    assert store.ledger(PARENT).get("toolu_same") is not None

    assert go_on(store, first, desk).status is tl.RunStatus.COMPLETED
    assert desk.opened == ["outage"], "made once, by the branch that is gone"
    assert [p.session_id for p in store.prune(older_than=0).removed] == [first, PARENT]


def test_which_calls_a_branch_claims() -> None:
    """Calls whose intent is written before they run: a second run would add an effect, and
    the lineage's first session claims with its own intent. Not read-only, idempotent or
    key-forwarding calls (the receiver's key is their guard)."""
    from toolledger.engine._claims import claims

    def kind(**declared: object) -> tl.Tool:
        @tl.tool(**declared)  # type: ignore[call-overload]
        def act(x: int) -> int:
            """Act."""
            return x

        return act

    assert claims(kind(effect="non_idempotent"))
    assert claims(kind(effect="non_idempotent", forwards_idempotency_key=True, high_impact=True))
    assert claims(kind(effect="idempotent", high_impact=True))
    assert not claims(kind(effect="non_idempotent", forwards_idempotency_key=True))
    assert not claims(kind(effect="idempotent"))
    assert not claims(kind(effect="read_only"))
    assert not claims(None)


def test_a_key_forwarding_call_its_root_made_since_answers_a_branch_from_that_record(
    store: tl.Store,
) -> None:
    """A key-forwarding call writes no intent and is not claimed. Made in the lineage's first
    session after a fork was made, and then met on the fork (a model that answers every branch
    alike), it is the lineage's recorded call: the fork answers from that record, under its
    key — it ran again under the fork's own key, and a receiver that honours keys took it
    twice."""
    mail = MailServer()

    keyed_email = mail.keyed_tool()

    script = KEYED_SCRIPT
    with ScriptedModel(GREETED) as model:
        tl.Agent(client=model.client(), model="m", tools=[keyed_email], store=store).run(
            session=PARENT, prompt="Say hello."
        )
    first = tl.fork(store, PARENT, at_turn=1, new_session="first")
    second = tl.fork(store, first, at_turn=1, new_session="second")
    for session in (PARENT, first, second):
        with ScriptedModel(script) as model:
            agent = tl.Agent(client=model.client(), model="m", tools=[keyed_email], store=store)
            assert agent.run(session=session, prompt="Tell Ana.").status is tl.RunStatus.COMPLETED
    key = idempotency_key(PARENT, "toolu_keyed")
    assert mail.handed == [(key, "ana")], "sent once, under the lineage's key"
    for session in (first, second):
        held = store.ledger(session).get("toolu_keyed")
        assert held is not None and held.copied and held.key_session == PARENT, session
        assert held.result == store.ledger(PARENT).get("toolu_keyed").result  # type: ignore[union-attr]
    no_errors(store)


@pytest.mark.parametrize(
    "order",
    [("first", "second", PARENT), ("second", "first", PARENT), ("first", PARENT, "second")],
)
def test_a_key_forwarding_call_made_first_on_branches_forwards_the_lineage_key(
    store: tl.Store, order: tuple[str, str, str]
) -> None:
    """A key-forwarding call writes no intent and is not claimed: made first on a branch, its
    lineage's first session holds no record of it, and it runs where it is asked. On every
    session of the lineage it forwards one key, the first session's — it ran under each
    branch's own, and a receiver that honours keys sent the e-mail once per branch."""
    mail = MailServer()

    keyed_email = mail.keyed_tool()

    script = KEYED_SCRIPT
    with ScriptedModel(GREETED) as model:
        tl.Agent(client=model.client(), model="m", tools=[keyed_email], store=store).run(
            session=PARENT, prompt="Say hello."
        )
    first = tl.fork(store, PARENT, at_turn=1, new_session="first")
    tl.fork(store, first, at_turn=1, new_session="second")
    for session in order:
        with ScriptedModel(script) as model:
            agent = tl.Agent(client=model.client(), model="m", tools=[keyed_email], store=store)
            assert agent.run(session=session, prompt="Tell Ana.").status is tl.RunStatus.COMPLETED
    key = idempotency_key(PARENT, "toolu_keyed")
    assert {k for k, _ in mail.handed} == {key}, "one key for the lineage"
    assert mail.sent() == ["ana"], "one e-mail"
    for session in order:
        held = store.ledger(session).get("toolu_keyed")
        assert held is not None and held.status is tl.Status.SUCCEEDED, session
        assert held.key_session == PARENT, session
    no_errors(store)


def test_a_fork_s_copy_of_a_key_forwarding_call_handed_back_forwards_the_lineage_key(
    store: tl.Store,
) -> None:
    """A branch (``first``) is asked for a key-forwarding call it cannot make (its tool is
    missing: answered with an error, nothing recorded); a fork of it made after that turn
    (``second``) holds a copy of the call as not run, standing for ``first``'s. Both are rewound
    and replayed with the tool, the fork first: handed the call back (its origin no longer asks
    for it), the fork makes it — under the lineage's key, as ``first`` then does. It ran under
    ``first``'s key there, and a receiver that honours keys sent two e-mails."""
    mail = MailServer()

    keyed_email = mail.keyed_tool()

    @tl.tool(effect="read_only")
    def look(q: str) -> str:
        """Look something up."""
        return q

    ask = Reply(tool_uses=[ToolUse("send_email", {"to": "ana"}, id="toolu_keyed")])
    with ScriptedModel(GREETED) as model:
        tl.Agent(client=model.client(), model="m", tools=[keyed_email], store=store).run(
            session=PARENT, prompt="Say hello."
        )
    first = tl.fork(store, PARENT, at_turn=1, new_session="first")
    with ScriptedModel([*GREETED, ask, Reply(text="Cannot.")]) as model:
        tl.Agent(client=model.client(), model="m", tools=[look], store=store).run(
            session=first, prompt="Tell Ana."
        )
    assert store.ledger(first).get("toolu_keyed") is None
    second = tl.fork(store, first, at_turn=2, new_session="second")
    copy = store.ledger(second).get("toolu_keyed")
    assert copy is not None and copy.copied and copy.status is tl.Status.NOT_HAPPENED
    tl.rewind(store, first, to_turn=1)
    tl.rewind(store, second, to_turn=1)
    for session in (second, first):
        with ScriptedModel([*GREETED, ask, Reply(text="Sent.")]) as model:
            agent = tl.Agent(client=model.client(), model="m", tools=[keyed_email], store=store)
            assert agent.run(session=session, prompt="Tell Ana.").status is tl.RunStatus.COMPLETED
    key = idempotency_key(PARENT, "toolu_keyed")
    assert mail.handed == [(key, "ana"), (key, "ana")], "both made it, under one key"
    assert mail.sent() == ["ana"], "one e-mail"
    for session in (first, second):
        made = store.ledger(session).get("toolu_keyed")
        assert made is not None and made.key_session == PARENT, session
    no_errors(store)


def test_two_branches_making_a_key_forwarding_call_at_once_forward_one_key(
    store: tl.Store,
) -> None:
    """Two branches' runs, on two threads, make the same new key-forwarding call at the same
    moment (both are inside the tool together): neither ledger can see the other's run, and
    both forward the lineage's key — one e-mail."""
    mail = MailServer()
    inside = threading.Barrier(2, timeout=20)

    keyed_email = mail.keyed_tool(before=inside.wait)  # both runs are making the call now
    script = KEYED_SCRIPT
    with ScriptedModel(GREETED) as model:
        tl.Agent(client=model.client(), model="m", tools=[keyed_email], store=store).run(
            session=PARENT, prompt="Say hello."
        )
    first = tl.fork(store, PARENT, at_turn=1, new_session="first")
    second = tl.fork(store, PARENT, at_turn=1, new_session="second")
    runs: dict[str, tl.RunStatus] = {}

    def go(session: str) -> None:
        with ScriptedModel(script) as model:
            agent = tl.Agent(client=model.client(), model="m", tools=[keyed_email], store=store)
            runs[session] = agent.run(session=session, prompt="Tell Ana.").status

    threads = [threading.Thread(target=go, args=(s,)) for s in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert runs == {first: tl.RunStatus.COMPLETED, second: tl.RunStatus.COMPLETED}
    key = idempotency_key(PARENT, "toolu_keyed")
    assert mail.handed == [(key, "ana"), (key, "ana")], "both ran it, under one key"
    assert mail.sent() == ["ana"], "one e-mail"
    no_errors(store)


def test_a_copy_whose_origin_makes_the_call_while_the_copy_reads_it_takes_its_outcome(
    store: tl.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A branch (``first``) asks for a high-impact call, which waits for a person's approval;
    a fork of it (``second``) holds a copy standing for ``first``'s call. ``second`` reads
    ``first``'s record — none yet — and then ``first``'s transcript. In between, ``first`` is
    approved, makes the call and ends its turn: its transcript no longer asks for it. The copy
    must not take that for ``first`` giving the call up: it reads the record again and takes
    its outcome. It made the call a second time, under the same approval (found by the
    simulator with more branches)."""
    from toolledger.engine import _copies

    mail = MailServer()
    with ScriptedModel(GREETED) as model:
        tl.Agent(client=model.client(), model="m", tools=mail.tools(), store=store).run(
            session=PARENT, prompt="Say hello."
        )
    first = tl.fork(store, PARENT, at_turn=1, new_session="first")
    asked = [*GREETED, *SCRIPT]
    queued_run(store, mail, asked, first, "Tell Ana and Bo.")
    (request,) = store.approvals(first)
    recorded = [
        *ScriptedModel.from_session(store, first, branched=True).script,
        *SCRIPT[1:],
    ]
    second = tl.fork(store, first, at_turn=1, new_session="second")
    copy = store.ledger(second).get(request.tool_use_id)
    assert copy is not None and copy.origin == first
    real = _copies.still_to_run
    raced: list[bool] = []

    def racing(origin: str, tool_use_id: str) -> Any:
        if not raced:
            raced.append(True)
            tl.approvals.decide(store, first, request.tool_use_id, approved=True, by="ana")
            assert replay(store, first, mail, recorded).status is tl.RunStatus.COMPLETED
        return (yield from real(origin, tool_use_id))

    monkeypatch.setattr(_copies, "still_to_run", racing)
    with ScriptedModel(recorded) as model:
        run = agent(store, model, mail).run(session=second, prompt="Tell Ana and Bo.")
    assert raced and run.status is tl.RunStatus.COMPLETED, run.reason
    # Bo's call is asked afresh on each (a new id): the call the two share went out once.
    assert [to for _, to in mail.handed].count("ana") == 1, mail.handed
    made = store.ledger(first).get(request.tool_use_id)
    held = store.ledger(second).get(request.tool_use_id)
    assert made is not None and held is not None and held.result == made.result
    no_errors(store)


def test_a_branch_stopped_for_a_call_not_run_yet_names_no_resolve(store: tl.Store) -> None:
    """The parent's last turn asks for a call not run there yet (it waits for a person's
    approval): the fork that meets it stops, and its reason says to run the parent (deciding
    its approval) — not to `resolve` a call that is in doubt nowhere, which `resolve` refuses
    (the commands printed for a person are ones that work: design rule 21)."""
    mail = MailServer()
    queued_run(store, mail, SCRIPT, PARENT, "Tell Ana and Bo.")
    recorded = [*ScriptedModel.from_session(store, PARENT).script, *SCRIPT[1:]]
    (request,) = store.approvals(PARENT)
    fork = tl.fork(store, PARENT, at_turn=0)
    stopped = replay(store, fork, mail, recorded)
    assert stopped.status is tl.RunStatus.NEEDS_ATTENTION and mail.handed == []
    reason = stopped.reason or ""
    assert f"is the call of session {PARENT!r}" in reason
    assert "resolve" not in reason, reason
    assert "run that session" in reason and "approve" in reason
    with pytest.raises(tl.NotInDoubtError):  # what the reason named before
        store.ledger(PARENT).resolve(request.tool_use_id, happened=True, by="ana")
