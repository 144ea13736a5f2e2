"""The straight path (``toolledger.engine._straight``) and the general path do the same thing.

Every scenario runs twice on a fresh store of each backend, once with the straight path on and
once with it off, and everything observable is compared: what the caller got back, how many
times the tool really ran and with which context, every commit the store was sent (the ops,
their records field by field except the clock's times), the crash points reached in order, and
the rows left in the ledger. The scenarios are the common call and each way it stops being
common: a record already there, a failed or unconfirmed intent, a tool that raises or may have
taken effect, bad input, an approval, a safe tool. The whole suite also runs with the general
path forced (``TOOLLEDGER_GENERAL_PATH=1``, ``make pytest``), so each guarantee's tests hold on
both.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
import toolledger._crash
from toolledger import _switches as switches
from toolledger.engine import _straight as straight
from toolledger.errors import OutcomeUnknown, StoreUnavailableError
from toolledger.ops import AppendMessages, InsertEffect, Op, UpdateEffect
from toolledger.records import EffectRecord, Status

from .conftest import BACKENDS, drop_schema, tool_use, url_for, with_params
from .helpers import spy_store

_TIMES = ("created_at", "updated_at", "deadline", "boot_deadline")


def _plain(record: EffectRecord | None) -> dict[str, Any] | None:
    """A record without the times the clock gave it and the store's worker name (each store
    opened has its own)."""
    if record is None:
        return None
    fields = dataclasses.asdict(record)
    for name in _TIMES:
        fields[name] = fields[name] is not None
    fields["worker"] = fields["worker"] is not None
    fields["history"] = [
        {k: v for k, v in past.items() if k not in ("at", "deadline", "worker")}
        for past in fields["history"]
    ]
    return fields


def _op(op: Op) -> tuple[Any, ...]:
    if isinstance(op, InsertEffect):
        return ("insert", _plain(op.record))
    if isinstance(op, UpdateEffect):
        return ("update", _plain(op.record), op.expect_status, op.expect_attempt, op.guard)
    return (type(op).__name__,)


@dataclasses.dataclass
class World:
    """What one scenario left behind."""

    answer: Any
    ran: list[dict[str, Any]]
    commits: list[list[tuple[Any, ...]]]
    rows: dict[str, dict[str, Any] | None]
    points: list[str]
    took_straight: int


Scenario = Callable[[tl.Store, list[dict[str, Any]]], Any]
# Counted in each world (``World.took_straight``): the agent's generator, ``run_tool_uses``'
# synchronous twin.
_STRAIGHT_CALL = straight.call
_STRAIGHT_RUN = straight.run


def _world(
    kind: str,
    directory: Path,
    scenario: Scenario,
    *,
    on: bool,
    monkeypatch: pytest.MonkeyPatch,
    fail_when: Callable[[Sequence[Op]], bool] | None = None,
) -> World:
    monkeypatch.setattr(switches, "STRAIGHT", on)
    taken: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        taken.append(1)
        return (yield from _STRAIGHT_CALL(*args, **kwargs))

    def counted_now(*args: Any, **kwargs: Any) -> Any:
        taken.append(1)
        return _STRAIGHT_RUN(*args, **kwargs)

    monkeypatch.setattr(straight, "call", counted)
    monkeypatch.setattr(straight, "run", counted_now)
    directory.mkdir()
    points: list[str] = []  # the crash points reached, in order
    monkeypatch.setattr(toolledger._crash, "watchers", [points.append])
    ran: list[dict[str, Any]] = []
    with tl.open_store(_url(kind, directory)) as store:
        spied, spy = spy_store(store, fail_when=fail_when)
        # Whether "s" is a branch is read once per store, on its first call that could be
        # claimed; here it is known up front, as it is after a session's first call.
        assert spied.lineage_root("s") is None
        try:
            answer: Any = scenario(spied, ran)
        except tl.ToolLedgerError as exc:
            answer = (type(exc).__name__, str(exc))
        rows = {r.tool_use_id: _plain(r) for r in store.ledger("s").records()}
        commits = [[_op(op) for op in ops] for ops in spy.commits]
    return World(answer, ran, commits, rows, points, len(taken))


def _with_checkpoint_a(commits: list[list[tuple[Any, ...]]]) -> list[list[tuple[Any, ...]]]:
    """The general path's commits as the straight path sends them: an intent committed right
    after checkpoint A (the assistant message and the session) rides in A's commit."""
    out: list[list[tuple[Any, ...]]] = []
    for ops in commits:
        alone = [op[0] for op in ops[:-1]] == ["HoldLease"] and ops[-1][0] == "insert"
        if alone and out and [op[0] for op in out[-1][-2:]] == ["AppendMessages", "PutSession"]:
            out[-1] = [*out[-1], ops[-1]]
        else:
            out.append(ops)
    return out


def _both(
    kind: str,
    tmp_path: Path,
    scenario: Scenario,
    monkeypatch: pytest.MonkeyPatch,
    *,
    folds: int = 0,
    **kwargs: Any,
) -> tuple[World, World]:
    """Both paths' worlds, the same in everything; ``folds``: how many checkpoints A the
    straight path wrote with their turn's intent, one commit instead of two."""
    on = _world(kind, tmp_path / "straight", scenario, on=True, monkeypatch=monkeypatch, **kwargs)
    off = _world(kind, tmp_path / "general", scenario, on=False, monkeypatch=monkeypatch, **kwargs)
    assert off.took_straight == 0
    assert on.answer == off.answer
    assert on.ran == off.ran
    assert on.commits == (_with_checkpoint_a(off.commits) if folds else off.commits)
    assert len(on.commits) == len(off.commits) - folds
    assert on.rows == off.rows
    assert on.points == off.points
    return on, off


def _ticket(ran: list[dict[str, Any]], *, fails: BaseException | None = None) -> tl.Tool[Any, Any]:
    @tl.tool(effect="non_idempotent", timeout=30)
    def create_ticket(title: str, ctx: tl.ToolContext) -> dict[str, Any]:
        ran.append(
            {
                "title": title,
                "key": ctx.idempotency_key,
                "attempt": ctx.attempt,
                "in_doubt": ctx.in_doubt,
            }
        )
        if fails is not None:
            raise fails
        return {"ticket": len(ran), "title": title}

    return create_ticket


def _once(content: list[dict[str, Any]], **kwargs: Any) -> Scenario:
    def scenario(store: tl.Store, ran: list[dict[str, Any]]) -> Any:
        return tl.run_tool_uses(content, [_ticket(ran)], ledger=store.ledger("s"), **kwargs)

    return scenario


TICKET = tool_use("toolu_1", "create_ticket", title="outage")


@pytest.fixture(params=BACKENDS)
def kind(request: pytest.FixtureRequest) -> Iterator[str]:
    """A backend; for PostgreSQL, ``_world`` puts each path's store in a schema of its own."""
    if request.param != "postgres":
        yield str(request.param)
        return
    server = str(request.getfixturevalue("postgres_url"))
    prefix = f"tl_test_{uuid.uuid4().hex[:12]}"
    _SCHEMAS[prefix] = server
    yield f"postgres:{prefix}"
    for path in ("straight", "general"):
        drop_schema(server, f"{prefix}_{path}")
    del _SCHEMAS[prefix]


_SCHEMAS: dict[str, str] = {}


def _url(kind: str, directory: Path) -> str:
    if kind.startswith("postgres:"):
        prefix = kind.split(":", 1)[1]
        return with_params(_SCHEMAS[prefix], schema=f"{prefix}_{directory.name}")
    return url_for(kind, directory)


def test_the_common_call_is_the_same_on_both_paths(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    on, _ = _both(kind, tmp_path, _once([TICKET]), monkeypatch)
    assert on.took_straight == 1
    assert [c[0][0] for c in on.commits] == ["insert", "update"]
    assert on.points == ["after_intent", "before_record", "after_record"]
    row = on.rows["toolu_1"]
    assert row is not None and row["status"] is Status.SUCCEEDED and row["attempt"] == 1
    assert len(on.ran) == 1


def test_a_replay_is_the_same_on_both_paths(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def twice(store: tl.Store, ran: list[dict[str, Any]]) -> Any:
        first = _once([TICKET])(store, ran)
        return first, _once([TICKET])(store, ran)

    on, _ = _both(kind, tmp_path, twice, monkeypatch)
    assert len(on.ran) == 1, "the second run answered from the ledger"
    assert on.answer[0] == on.answer[1]
    assert on.took_straight == 2, "the replay's intent met the record and was handed over"


def test_the_same_id_with_other_input_is_refused_on_both_paths(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tool_use("toolu_1", "create_ticket", title="another")

    def edited(store: tl.Store, ran: list[dict[str, Any]]) -> Any:
        _once([TICKET])(store, ran)
        return _once([other])(store, ran)

    on, _ = _both(kind, tmp_path, edited, monkeypatch)
    assert on.answer[0] == "LedgerMismatchError"
    assert len(on.ran) == 1


@pytest.mark.parametrize("raised", ["failed", "in_doubt"])
def test_a_tool_that_raises_is_the_same_on_both_paths(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raised: str
) -> None:
    exc = ValueError("no such queue") if raised == "failed" else OutcomeUnknown("timed out")

    def failing(store: tl.Store, ran: list[dict[str, Any]]) -> Any:
        tool = _ticket(ran, fails=exc)
        return tl.run_tool_uses([TICKET], [tool], ledger=store.ledger("s"))

    on, _ = _both(kind, tmp_path, failing, monkeypatch)
    row = on.rows["toolu_1"]
    assert row is not None
    assert row["status"] is (Status.FAILED if raised == "failed" else Status.STARTED)
    assert on.answer[0]["is_error"] is True and len(on.ran) == 1


def test_a_failed_intent_is_the_same_on_both_paths(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def intents(ops: Sequence[Op]) -> bool:
        return any(isinstance(op, InsertEffect) for op in ops)

    on, _ = _both(kind, tmp_path, _once([TICKET]), monkeypatch, fail_when=intents)
    assert on.ran == [], "nothing ran without its intent"
    assert on.answer[0] == "StoreUnavailableError", "neither the intent nor the answer landed"
    assert on.rows == {}


def test_a_failed_intent_answered_not_executed_is_the_same_on_both_paths(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def intents(ops: Sequence[Op]) -> bool:
        return any(
            isinstance(op, InsertEffect) and op.record.status is Status.STARTED for op in ops
        )

    on, _ = _both(kind, tmp_path, _once([TICKET]), monkeypatch, fail_when=intents)
    assert on.ran == [], "nothing ran without its intent"
    assert on.answer[0]["content"].startswith("not executed: ")
    row = on.rows["toolu_1"]
    assert row is not None and row["status"] is Status.DENIED
    assert row["error"] == on.answer[0]["content"]


def _answer_lost(scenario: Scenario, which: Callable[[Sequence[Op]], bool]) -> Scenario:
    """``scenario``, with the answer to the first commit ``which`` picks lost: the commit lands,
    and the store says the connection went during COMMIT (the outcome unknown)."""

    def lost_answer(store: tl.Store, ran: list[dict[str, Any]]) -> Any:
        backend = store.backend
        apply = backend.apply
        lost: list[int] = []

        def once_lost(session_id: str, ops: Sequence[Op]) -> list[bool]:
            flags = apply(session_id, ops)
            if not lost and which(ops):
                lost.append(1)
                raise StoreUnavailableError(
                    "injected: connection lost during COMMIT", url=store.url, outcome_unknown=True
                )
            return flags

        backend.apply = once_lost  # type: ignore[method-assign]
        return scenario(store, ran)

    return lost_answer


def test_an_intent_whose_commit_went_unconfirmed_is_the_same_on_both_paths(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The intent lands but its answer is lost: the read-back finds it, and the call runs."""

    def intent(ops: Sequence[Op]) -> bool:
        return any(isinstance(op, InsertEffect) for op in ops)

    on, _ = _both(kind, tmp_path, _answer_lost(_once([TICKET]), intent), monkeypatch)
    assert len(on.ran) == 1
    row = on.rows["toolu_1"]
    assert row is not None and row["status"] is Status.SUCCEEDED


def _outcome(ops: Sequence[Op]) -> bool:
    return any(isinstance(op, UpdateEffect) and op.record.status is Status.SUCCEEDED for op in ops)


def test_an_outcome_whose_commit_failed_is_the_same_on_both_paths(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tool took effect and its outcome cannot be written: the real result, an alert, and
    the intent left on disk — the same whichever path ran it (the straight path hands the
    failed commit to the general path's ``flush``)."""
    alerts: list[tl.LedgerWriteError] = []
    on, _ = _both(
        kind, tmp_path, _once([TICKET], on_alert=alerts.append), monkeypatch, fail_when=_outcome
    )
    assert len(on.ran) == 1 and "is_error" not in on.answer[0]
    row = on.rows["toolu_1"]
    assert row is not None and row["status"] is Status.STARTED
    assert [a.tool_use_id for a in alerts] == ["toolu_1", "toolu_1"], "one alert on each path"


def test_an_outcome_whose_commit_went_unconfirmed_is_the_same_on_both_paths(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outcome lands but its answer is lost: the read-back finds it written, no alert."""
    on, _ = _both(kind, tmp_path, _answer_lost(_once([TICKET]), _outcome), monkeypatch)
    assert len(on.ran) == 1 and "is_error" not in on.answer[0]
    row = on.rows["toolu_1"]
    assert row is not None and row["status"] is Status.SUCCEEDED
    assert on.points == ["after_intent", "before_record", "after_record"]


def _yes(request: tl.ApprovalRequest) -> tl.Decision:
    return tl.Decision(approved=True, by="ops")


def test_a_call_that_is_not_the_common_one_takes_the_general_path(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bad input, an unknown tool, a safe tool, a high-impact call and a batch: the straight
    path never sees them, and both settings write the same."""
    read = tool_use("toolu_2", "read_file", path="/etc/motd")
    mail = tool_use("toolu_3", "send_email", to="a@b.c")
    cases = [
        [tool_use("toolu_1", "create_ticket", title=7)],
        [tool_use("toolu_1", "no_such_tool")],
        [read],
        [mail],
        [TICKET, read],
    ]

    def unusual(store: tl.Store, ran: list[dict[str, Any]]) -> Any:
        @tl.tool(effect="read_only")
        def read_file(path: str) -> str:
            ran.append({"read": path})
            return "hello"

        @tl.tool(effect="non_idempotent", high_impact=True)
        def send_email(to: str) -> str:
            ran.append({"mail": to})
            return "sent"

        tools = [_ticket(ran), read_file, send_email]
        out = []
        for n, content in enumerate(cases):
            ledger = store.ledger("s" if n == len(cases) - 1 else f"s{n}")
            out.append(
                tl.run_tool_uses(
                    content,
                    tools,
                    ledger=ledger,
                    approve=_yes,
                )
            )
        return out

    on, _ = _both(kind, tmp_path, unusual, monkeypatch)
    assert on.took_straight == 0
    assert {"mail": "a@b.c"} in on.ran and {"read": "/etc/motd"} in on.ran


def _turns(*replies: Any) -> Scenario:
    """An agent run on the scripted model, answering ``replies``: what it returned (or raised,
    by ``_world``), the transcript left, and what the model was sent."""
    from toolledger.testing.scripted import ScriptedModel

    def scenario(store: tl.Store, ran: list[dict[str, Any]]) -> Any:
        with ScriptedModel(list(replies)) as model:
            agent = tl.Agent(client=model.client(), model="m", tools=[_ticket(ran)], store=store)
            try:
                result: Any = agent.run(session="s", prompt="open a ticket").final_text
            except tl.ToolLedgerError as exc:
                result = (type(exc).__name__, str(exc))
            return result, [m.content for m in store.messages("s")], model.requests

    return scenario


def test_an_agent_turn_is_the_same_on_both_paths(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn's call goes straight; its checkpoint rides the outcome's commit, as before."""
    from toolledger.testing.scripted import Reply, ToolUse

    use = ToolUse("create_ticket", {"title": "outage"}, id="toolu_9")
    on, _ = _both(
        kind, tmp_path, _turns(Reply(tool_uses=[use]), Reply(text="done")), monkeypatch, folds=1
    )
    assert on.took_straight == 1
    assert len(on.ran) == 1 and on.answer[0] == "done"
    held = [c for c in on.commits if ("AppendMessages",) in c and c[-1][0] == "insert"]
    assert len(held) == 1, "checkpoint A and the intent were one commit"
    assert on.points[:2] == ["after_checkpoint_a", "after_intent"]


def _assistant(ops: Sequence[Op]) -> bool:
    return any(isinstance(op, AppendMessages) and op.messages[0].role == "assistant" for op in ops)


def test_a_checkpoint_a_that_fails_is_the_same_on_both_paths(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoint A cannot be written: on the straight path its commit held the intent too, and
    the failure is A's — raised, nothing ran, no record, the transcript without the turn."""
    from toolledger.testing.scripted import Reply, ToolUse

    use = ToolUse("create_ticket", {"title": "outage"}, id="toolu_1")
    scenario = _turns(Reply(tool_uses=[use]))
    on, _ = _both(kind, tmp_path, scenario, monkeypatch, fail_when=_assistant)
    assert on.answer[0][0] == "StoreUnavailableError"
    assert on.ran == [] and on.rows == {}
    assert [m[0]["text"] if isinstance(m, list) else m for m in on.answer[1]] == ["open a ticket"]
    assert on.points == []


def test_a_checkpoint_a_whose_answer_was_lost_is_the_same_on_both_paths(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's commit (with the intent, on the straight path) lands but its answer is lost: the
    read-back finds it, and the call runs once."""
    from toolledger.testing.scripted import Reply, ToolUse

    use = ToolUse("create_ticket", {"title": "x"}, id="toolu_1")
    scenario = _answer_lost(_turns(Reply(tool_uses=[use]), Reply(text="ok")), _assistant)
    on, _ = _both(kind, tmp_path, scenario, monkeypatch, folds=1)
    assert len(on.ran) == 1 and on.answer[0] == "ok"
    row = on.rows["toolu_1"]
    assert row is not None and row["status"] is Status.SUCCEEDED


@pytest.mark.parametrize("same", [True, False], ids=["same input", "other input"])
def test_a_turn_reusing_a_call_id_of_its_transcript_is_the_same_on_both_paths(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, same: bool
) -> None:
    """The model answers with a call id an earlier turn of the transcript has (a server that
    numbers its calls ``call_0`` in every reply): refused before checkpoint A on both paths —
    nothing of the reply stored or run, not replayed from the earlier call's record (same
    input) nor stuck on it (another input)."""
    from toolledger.testing.scripted import Reply, ToolUse

    title = "outage" if same else "another"
    scenario = _turns(
        Reply(tool_uses=[ToolUse("create_ticket", {"title": "outage"}, id="toolu_7")]),
        Reply(tool_uses=[ToolUse("create_ticket", {"title": title}, id="toolu_7")]),
        Reply(text="done"),
    )
    on, _ = _both(kind, tmp_path, scenario, monkeypatch, folds=1)
    assert len(on.ran) == 1, "the call ran once"
    assert on.took_straight == 1
    kind_of_error, said = on.answer[0]
    assert kind_of_error == "MalformedContentError" and "'toolu_7'" in said
    assert len(on.answer[1]) == 3, "prompt, the first turn, its results: the reply not stored"


@pytest.mark.parametrize(("value", "on"), [(None, True), ("0", True), ("1", False)])
def test_the_general_path_can_be_forced_for_a_whole_process(value: str | None, on: bool) -> None:
    """``make pytest`` runs the guarantees' suites again with ``TOOLLEDGER_GENERAL_PATH=1``."""
    env = {k: v for k, v in os.environ.items() if k != "TOOLLEDGER_GENERAL_PATH"}
    if value is not None:
        env["TOOLLEDGER_GENERAL_PATH"] = value
    code = "import toolledger._switches as s; print(s.STRAIGHT)"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == str(on)
