"""The PostgreSQL server's clock check meets the other faults of a write: a slow process between
building an intent and sending it, a reply lost and the write sent again, a commit whose outcome
is unknown and is reconciled. None of them is a clock that moved; a refusal there would answer
"not executed" for a call that should run, or call one in doubt that never ran. Effects are
counted as calls of the tool."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

import toolledger as tl
from toolledger.errors import StoreUnavailableError
from toolledger.ops import InsertEffect, Op, TakeLease
from toolledger.records import Lease, Status
from toolledger.stores.postgres import call as pg_call

from .conftest import tool_use


def _ticket_tool(made: list[str]) -> tl.Tool[Any, Any]:
    @tl.tool(effect="non_idempotent", timeout=60)
    def create_ticket(title: str) -> str:
        made.append(title)
        return f"made {title}"

    return create_ticket


@pytest.fixture
def url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("postgres_store_url"))


def _reply_lost_once(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The first one-statement write's reply is lost after it landed (the connection drops):
    the driver sends it again. The list says whether that happened."""
    real_carry = pg_call.Call.carry
    lost: list[bool] = []

    def carry(self: pg_call.Call[Any], conn: Any) -> Any:
        value = yield from real_carry(self, conn)
        if self.write and self.single and self.attempt == 0 and not lost:
            lost.append(True)
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return value

    monkeypatch.setattr(pg_call.Call, "carry", carry)
    return lost


def _cut_then_refused(
    monkeypatch: pytest.MonkeyPatch, store: tl.Store, url: str, tool_use_id: str
) -> list[bool]:
    """The first commit holding ``tool_use_id``'s intent is cut before it reaches the server
    (its outcome unknown), and the resend that reconciles it is refused by the clock check (a
    step of 120 s meanwhile). The list has two items once both happened."""
    real_clock = pg_call.Carried.__call__
    real_apply = store.backend.apply
    cut: list[bool] = []

    def stepped(self: pg_call.Carried, at: tuple[float, float]) -> float:
        return real_clock(self, at) + (120.0 if len(cut) == 1 else 0.0)

    def apply(session_id: str, ops: list[Op]) -> list[bool]:
        mine = any(isinstance(o, InsertEffect) and o.record.tool_use_id == tool_use_id for o in ops)
        if mine and not cut:
            cut.append(True)
            raise StoreUnavailableError("cut", url=url, outcome_unknown=True)
        try:
            return real_apply(session_id, ops)
        finally:
            if mine and len(cut) == 1:
                cut.append(True)  # the reconciling resend was sent (and refused)

    monkeypatch.setattr(pg_call.Carried, "__call__", stepped)
    monkeypatch.setattr(store.backend, "apply", apply)
    return cut


def test_a_process_slow_to_send_its_intent_is_not_taken_for_a_clock_that_moved(url: str) -> None:
    """1.2 s pass between building the intent and handing it to the store (a slow ``redact``
    hook; a busy event loop would do the same): the server's clock moved on by as much, and so
    did the reading carried forward with it. The intent lands at its first sending and the
    tool runs once."""
    made: list[str] = []
    slept: list[float] = []

    def slow(text: str) -> str:
        if text.startswith("in doubt: started"):  # the intent's, each time it is written
            slept.append(1.2)
            time.sleep(1.2)
        return text

    with tl.open_store(url, redact=slow) as store:
        block = tool_use("t", "create_ticket", title="a slow hook")
        (result,) = tl.run_tool_uses([block], [_ticket_tool(made)], ledger=store.ledger("s"))
        assert slept == [1.2] and not result.get("is_error"), (slept, result)  # sent once
        assert store.backend.read_effects("s")["t"].status is Status.SUCCEEDED
    assert made == ["a slow hook"]


def test_an_intent_whose_reply_was_lost_and_whose_resend_the_clock_refuses_is_found_landed(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lone intent INSERT lands and its reply is lost; by the resend the server's clock has
    stepped, so the resend is refused by its check. The intent is read back: it is ours, it
    landed, and the tool runs once — not "in doubt" for a call that never ran, not "not
    executed" for one whose intent is durable."""
    lost = _reply_lost_once(monkeypatch)
    real_clock = pg_call.Carried.__call__

    def stepped(self: pg_call.Carried, at: tuple[float, float]) -> float:
        return real_clock(self, at) + (120.0 if lost else 0.0)  # the resend: 120 s off

    monkeypatch.setattr(pg_call.Carried, "__call__", stepped)
    made: list[str] = []
    with tl.open_store(url) as store:
        block = tool_use("t", "create_ticket", title="once")
        (result,) = tl.run_tool_uses([block], [_ticket_tool(made)], ledger=store.ledger("s"))
        assert lost and not result.get("is_error"), result
        record = store.backend.read_effects("s")["t"]
        assert (record.status, record.attempt) == (Status.SUCCEEDED, 1)
        assert store.in_doubt() == []
    assert made == ["once"]


def test_a_reconciled_commit_the_clock_refuses_keeps_the_outcomes_it_carried(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two calls: the first's outcome rides the second's intent commit, whose outcome is
    unknown (cut before it reached the server); the reconciling resend is refused by the
    clock check. Nothing of it landed: the outcome is sent again with the intent built anew —
    no alert, both calls run once, both records settled."""
    made: list[str] = []
    alerts: list[tl.LedgerWriteError] = []
    with tl.open_store(url) as store:
        cut = _cut_then_refused(monkeypatch, store, url, "b")
        blocks = [tool_use(i, "create_ticket", title=i) for i in ("a", "b")]
        results = tl.run_tool_uses(
            blocks, [_ticket_tool(made)], ledger=store.ledger("s"), on_alert=alerts.append
        )
        assert [r.get("is_error", False) for r in results] == [False, False], results
        assert len(cut) == 2, "the resend was refused by the clock check"
        records = store.backend.read_effects("s")
        assert {k: r.status for k, r in records.items()} == {
            "a": Status.SUCCEEDED,
            "b": Status.SUCCEEDED,
        }
    assert alerts == []
    assert made == ["a", "b"]


def test_a_lease_take_whose_reply_was_lost_is_found_taken_with_the_expiry_the_server_wrote(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A take set on a reading 5 s stale lands with the expiry the server's clock sets; its
    reply is lost and it is sent again. The lease read back is ours whatever its expiry: the
    take is reported done, not the session busy with our own lease."""
    lost = _reply_lost_once(monkeypatch)
    with tl.open_store(url) as store:
        sent = store.now() - 5 + 30
        lease = Lease(session_id="s", owner="me/abc", token=1, expires_at=sent, ttl=30.0)
        assert store.apply("s", [TakeLease(lease, expect_token=0)]) == [True]
        found = store.lease("s")
        assert lost and found is not None and (found.owner, found.token) == ("me/abc", 1)
        assert found.expires_at > sent + 4  # the server's, not the one sent


def test_an_intent_late_in_a_slow_transaction_is_not_taken_for_a_clock_that_moved(
    request: pytest.FixtureRequest,
) -> None:
    """Two calls: the first's outcome rides the second's intent commit, and its UPDATE waits
    1.5 s on a row lock another connection holds (as a large result would take to arrive). The
    intent statement runs 1.5 s into its transaction; the server compares its reading with
    the transaction's start, so it lands at its first sending, and both calls run once."""
    import threading

    url = str(request.getfixturevalue("postgres_store_url"))
    schema = str(request.getfixturevalue("postgres_schema"))
    base = str(request.getfixturevalue("postgres_url"))
    made: list[str] = []
    refused: list[str] = []
    locker = psycopg.connect(base, autocommit=False)

    @tl.tool(effect="non_idempotent", timeout=60)
    def create_ticket(title: str) -> str:
        made.append(title)
        if title == "a":  # hold the row the outcome of this very call is about to update
            locker.execute(f"SET search_path TO {schema}")
            locker.execute("SELECT 1 FROM effects WHERE tool_use_id = 'a' FOR UPDATE")
            threading.Timer(1.5, locker.commit).start()
        return f"made {title}"

    try:
        with tl.open_store(url) as store:
            real_apply = store.backend.apply

            def apply(session_id: str, ops: list[Op]) -> list[bool]:
                try:
                    return real_apply(session_id, ops)
                except tl.StoreError as exc:
                    refused.append(type(exc).__name__)
                    raise

            store.backend.apply = apply  # type: ignore[method-assign]
            blocks = [tool_use(i, "create_ticket", title=i) for i in ("a", "b")]
            results = tl.run_tool_uses(blocks, [create_ticket], ledger=store.ledger("s"))
            assert [r.get("is_error", False) for r in results] == [False, False], results
            records = store.backend.read_effects("s")
            assert {k: r.status for k, r in records.items()} == {
                "a": Status.SUCCEEDED,
                "b": Status.SUCCEEDED,
            }
    finally:
        locker.close()
    assert refused == [] and made == ["a", "b"]


@pytest.mark.parametrize("general", [False, True], ids=["straight", "general"])
def test_one_call_whose_reconciled_intent_the_clock_refuses_is_sent_anew(
    url: str, monkeypatch: pytest.MonkeyPatch, general: bool
) -> None:
    """One call: its intent commit's outcome is unknown (cut before it reached the server) and
    the reconciling resend is refused by the clock check. Nothing landed: the intent is built
    anew and lands, and the tool runs once — on the straight path as on the general one."""
    from toolledger import _switches as switches

    monkeypatch.setattr(switches, "STRAIGHT", not general)
    made: list[str] = []
    with tl.open_store(url) as store:
        tool = _ticket_tool(made)
        tl.run_tool_uses(
            [tool_use("w", "create_ticket", title="w")], [tool], ledger=store.ledger("s")
        )
        cut = _cut_then_refused(monkeypatch, store, url, "a")
        (result,) = tl.run_tool_uses(
            [tool_use("a", "create_ticket", title="a")], [tool], ledger=store.ledger("s")
        )
        assert len(cut) == 2 and not result.get("is_error"), result
        assert store.backend.read_effects("s")["a"].status is Status.SUCCEEDED
    assert made == ["w", "a"]
