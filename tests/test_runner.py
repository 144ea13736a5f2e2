"""run_tool_uses / arun_tool_uses: docs/design.md, rules 1-7, on every embedded store, sync and
async.

Every test counts real executions with its own counter, never with toolledger's records.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Annotated, Any

import pydantic
import pytest

import toolledger as tl
from toolledger import _switches as switches
from toolledger.records import Status
from toolledger.stores.memory import MemoryBackend
from toolledger.testing import Counter

from .conftest import Runner, tool_use
from .helpers import spy_store


@pytest.fixture
def counter() -> Counter:
    return Counter()


@pytest.fixture
def tools(counter: Counter) -> tl.ToolSet:
    @tl.tool(effect="non_idempotent")
    def create_ticket(title: str, ctx: tl.ToolContext) -> dict[str, Any]:
        """Open a support ticket."""
        n = counter.hit("create_ticket")
        return {"ticket": n, "title": title, "key": ctx.idempotency_key}

    @tl.tool(effect="read_only")
    def read_file(path: Annotated[str, "the file to read"]) -> str:
        """Read a file."""
        counter.hit("read_file")
        return f"contents of {path}"

    @tl.tool(effect="non_idempotent", high_impact=True)
    def send_email(to: str, body: str) -> str:
        """Send an e-mail."""
        counter.hit("send_email")
        return f"sent to {to}"

    return tl.ToolSet([create_ticket, read_file, send_email])


TICKET = tool_use("toolu_T", "create_ticket", title="outage")


# -- rule 1: the ledger gate comes first --------------------------------------------------------


def test_second_run_returns_the_stored_result_without_executing(
    run: Runner, tools: tl.ToolSet, ledger: tl.Ledger, counter: Counter
) -> None:
    first = run([TICKET], tools, ledger=ledger)
    second = run([TICKET], tools, ledger=ledger)
    assert counter["create_ticket"] == 1
    assert second == first
    content = json.loads(first[0]["content"])
    assert content["ticket"] == 1 and content["title"] == "outage"
    assert "is_error" not in first[0]
    record = ledger.get("toolu_T")
    assert record is not None and record.status is Status.SUCCEEDED and record.attempt == 1


def test_a_call_keeps_the_time_its_intent_was_written(run: Runner) -> None:
    """``created_at`` is when the call was first recorded — its intent — on every path: the
    outcome of a fresh call does not overwrite it with the outcome's time (it used to on
    success; the failure path kept it)."""
    ticks = iter(range(1000, 2000))
    store = tl.Store(MemoryBackend(), clock=lambda: float(next(ticks)))
    ledger = store.ledger("s")
    seen: dict[str, float] = {}

    @tl.tool(effect="non_idempotent")
    def create_ticket(title: str) -> str:
        intent = ledger.get("toolu_T")
        assert intent is not None and intent.status is Status.STARTED
        seen["intent"] = intent.created_at
        return title

    @tl.tool(effect="non_idempotent")
    def fail(title: str) -> str:
        intent = ledger.get("toolu_F")
        assert intent is not None
        seen["failing intent"] = intent.created_at
        raise RuntimeError("no")

    tools = tl.ToolSet([create_ticket, fail])
    run([TICKET, tool_use("toolu_F", "fail", title="x")], tools, ledger=ledger)
    done, failed = ledger.get("toolu_T"), ledger.get("toolu_F")
    assert done is not None and done.status is Status.SUCCEEDED
    assert done.created_at == seen["intent"] < done.updated_at
    assert failed is not None and failed.status is Status.FAILED
    assert failed.created_at == seen["failing intent"] < failed.updated_at


def test_ledger_hit_never_asks_the_approver_again(
    run: Runner, tools: tl.ToolSet, ledger: tl.Ledger, counter: Counter
) -> None:
    asked: list[tl.ApprovalRequest] = []

    def approve(req: tl.ApprovalRequest) -> bool:
        asked.append(req)
        return True

    email = tool_use("toolu_E", "send_email", to="a@example.com", body="hi")
    first = run([email], tools, ledger=ledger, approve=approve)
    second = run([email], tools, ledger=ledger, approve=approve)
    assert (
        first
        == second
        == [{"type": "tool_result", "tool_use_id": "toolu_E", "content": "sent to a@example.com"}]
    )
    assert counter["send_email"] == 1
    assert len(asked) == 1
    req = asked[0]
    assert (req.session_id, req.tool_use_id, req.tool) == ("session-1", "toolu_E", "send_email")
    assert req.input == {"to": "a@example.com", "body": "hi"}
    assert req.in_doubt is False and "high-impact" in req.reason
    record = ledger.get("toolu_E")
    assert record is not None and record.approved_by is not None and "approve" in record.approved_by


def test_results_come_back_in_order_and_other_blocks_are_skipped(
    run: Runner, tools: tl.ToolSet, ledger: tl.Ledger
) -> None:
    content = [
        {"type": "text", "text": "Let me look."},
        tool_use("toolu_2", "read_file", path="/b"),
        {"type": "thinking", "thinking": "…", "signature": "x"},
        tool_use("toolu_1", "read_file", path="/a"),
    ]
    results = run(content, tools, ledger=ledger)
    assert [r["tool_use_id"] for r in results] == ["toolu_2", "toolu_1"]
    assert [r["content"] for r in results] == ["contents of /b", "contents of /a"]


def test_sdk_objects_and_whole_messages_are_accepted(
    run: Runner, tools: tl.ToolSet, ledger: tl.Ledger, counter: Counter
) -> None:
    from anthropic.types import Message, TextBlock, ToolUseBlock, Usage

    message = Message(
        id="msg_1",
        type="message",
        role="assistant",
        model="claude-test",
        content=[
            TextBlock(type="text", text="Opening a ticket."),
            ToolUseBlock(
                type="tool_use", id="toolu_T", name="create_ticket", input={"title": "outage"}
            ),
        ],
        stop_reason="tool_use",
        stop_sequence=None,
        usage=Usage(input_tokens=1, output_tokens=1),
    )
    by_content = run(message.content, tools, ledger=ledger)
    by_message = run(message, tools, ledger=ledger)
    by_dict = run([TICKET], tools, ledger=ledger)
    assert by_content == by_message == by_dict
    assert counter["create_ticket"] == 1


# -- results ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Ticket(pydantic.BaseModel):
    id: int
    tags: list[str]


@pytest.mark.parametrize(
    ("value", "content"),
    [
        ("plain", "plain"),
        ({"a": [1, 2.5, None]}, '{"a": [1, 2.5, null]}'),
        (42, "42"),
        (None, "null"),
        (Point(1, 2), '{"x": 1, "y": 2}'),
        (Ticket(id=3, tags=["p1"]), '{"id": 3, "tags": ["p1"]}'),
        ("naïve ✓", "naïve ✓"),
    ],
)
def test_results_are_sent_as_strings(
    run: Runner, ledger: tl.Ledger, value: Any, content: str
) -> None:
    @tl.tool(effect="idempotent")
    def produce() -> Any:
        return value

    results = run([tool_use("toolu_1", "produce")], [produce], ledger=ledger)
    assert results == [{"type": "tool_result", "tool_use_id": "toolu_1", "content": content}]
    # and a replay sends exactly the same bytes
    assert run([tool_use("toolu_1", "produce")], [produce], ledger=ledger) == results


def test_unserialisable_result_is_recorded_as_a_note(
    run: Runner, ledger: tl.Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    calls = Counter()

    @tl.tool
    def make_thing() -> object:
        calls.hit("make_thing")
        return {1, 2, 3}  # a set: not JSON

    first = run([tool_use("toolu_1", "make_thing")], [make_thing], ledger=ledger)
    second = run([tool_use("toolu_1", "make_thing")], [make_thing], ledger=ledger)
    assert calls["make_thing"] == 1, "the effect happened; its record must not be lost"
    assert first == second
    note = json.loads(first[0]["content"])
    assert note["preview"] == "{1, 2, 3}" and "not JSON-serialisable" in note["reason"]
    record = ledger.get("toolu_1")
    assert record is not None and record.status is Status.SUCCEEDED
    assert "not JSON-serialisable" in caplog.text


def test_recursive_result_is_recorded_as_a_note(run: Runner, ledger: tl.Ledger) -> None:
    loop: list[Any] = []
    loop.append(loop)

    @tl.tool
    def recurse() -> Any:
        return loop

    result = run([tool_use("toolu_1", "recurse")], [recurse], ledger=ledger)
    assert "not JSON-serialisable" in json.loads(result[0]["content"])["reason"]
    record = ledger.get("toolu_1")
    assert record is not None and record.status is Status.SUCCEEDED


def test_oversized_result_keeps_its_effect_as_a_note(
    run: Runner, ledger: tl.Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    calls = Counter()

    @tl.tool
    def dump() -> str:
        calls.hit("dump")
        return "y" * 5000

    tools = tl.ToolSet([dump], max_result_bytes=1000)
    first = run([tool_use("toolu_1", "dump")], tools, ledger=ledger)
    second = run([tool_use("toolu_1", "dump")], tools, ledger=ledger)
    assert calls["dump"] == 1 and first == second
    note = json.loads(first[0]["content"])
    assert note["size_bytes"] == 5002 and len(note["sha256"]) == 64
    assert note["preview"].startswith('"yyyy')
    assert "over the 1,000-byte limit" in caplog.text


# -- rule 3: a tool that raises -----------------------------------------------------------------


def test_a_failing_tool_answers_is_error_and_is_recorded_failed(
    run: Runner, ledger: tl.Ledger
) -> None:
    calls = Counter()

    @tl.tool
    def charge(amount: int) -> str:
        calls.hit("charge")
        raise RuntimeError("card declined")

    use = tool_use("toolu_1", "charge", amount=5)
    first = run([use], [charge], ledger=ledger)
    assert first == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_1",
            "content": "'charge' failed: RuntimeError: card declined",
            "is_error": True,
        }
    ]
    record = ledger.get("toolu_1")
    assert record is not None and record.status is Status.FAILED and record.result is None
    assert run([use], [charge], ledger=ledger) == first
    assert calls["charge"] == 1, "the failure is the answer for this id; it is not retried"


def test_a_failing_read_only_tool_is_not_recorded_and_may_run_again(
    run: Runner, ledger: tl.Ledger
) -> None:
    calls = Counter()

    @tl.tool(effect="read_only")
    def lookup() -> str:
        calls.hit("lookup")
        raise LookupError("not yet")

    use = tool_use("toolu_1", "lookup")
    assert run([use], [lookup], ledger=ledger)[0]["is_error"] is True
    assert ledger.get("toolu_1") is None
    run([use], [lookup], ledger=ledger)
    assert calls["lookup"] == 2


# -- the intent ---------------------------------------------------------------------------------


def test_intent_is_durable_before_an_unsafe_tool_runs(
    run: Runner, store: tl.Store, ledger: tl.Ledger
) -> None:
    seen: list[tl.EffectRecord | None] = []

    @tl.tool
    def send(to: str) -> str:
        seen.append(store.ledger(ledger.session_id).get("toolu_1"))
        return "ok"

    run([tool_use("toolu_1", "send", to="x")], [send], ledger=ledger)
    (during,) = seen
    assert during is not None and during.status is Status.STARTED and during.attempt == 1


def test_safe_tools_write_no_intent(run: Runner, ledger: tl.Ledger) -> None:
    seen: list[tl.EffectRecord | None] = []

    @tl.tool(effect="idempotent")
    def set_config(key: str, value: str) -> str:
        seen.append(ledger.get("toolu_1"))
        return "set"

    run([tool_use("toolu_1", "set_config", key="k", value="v")], [set_config], ledger=ledger)
    assert seen == [None]
    record = ledger.get("toolu_1")
    assert record is not None and record.status is Status.SUCCEEDED


def test_durable_writes_per_call(run: Runner, store: tl.Store, tools: tl.ToolSet) -> None:
    spied, spy = spy_store(store)
    ledger = spied.ledger("s")
    run([TICKET], tools, ledger=ledger)
    assert len(spy.commits) == 2, "a non-idempotent call: intent, then outcome"
    spy.commits.clear()
    run([tool_use("toolu_R", "read_file", path="/x")], tools, ledger=ledger)
    assert len(spy.commits) == 1, "a read-only call: its outcome only"
    spy.commits.clear()
    content = [
        tool_use("toolu_a", "create_ticket", title="a"),
        tool_use("toolu_r1", "read_file", path="/1"),
        tool_use("toolu_b", "create_ticket", title="b"),
        tool_use("toolu_r2", "read_file", path="/2"),
    ]
    run(content, tools, ledger=ledger)
    # intent a | outcome a (before r1 runs) | r1 + intent b | outcome b (before r2 runs) | r2
    assert [len(c) for c in spy.commits] == [1, 1, 2, 1, 1]
    assert {r.tool_use_id for r in ledger.records()} >= {
        "toolu_a",
        "toolu_b",
        "toolu_r1",
        "toolu_r2",
    }


def test_each_unsafe_outcome_is_durable_before_the_next_tool_runs(
    run: Runner, store: tl.Store
) -> None:
    seen: list[tl.EffectRecord | None] = []

    @tl.tool
    def first() -> str:
        return "one"

    @tl.tool(effect="read_only")
    def second() -> str:
        seen.append(store.ledger("s").get("toolu_1"))
        return "two"

    run(
        [tool_use("toolu_1", "first"), tool_use("toolu_2", "second")],
        [first, second],
        ledger=store.ledger("s"),
    )
    (during,) = seen
    assert during is not None and during.status is Status.SUCCEEDED


# -- rule 7: same id, other tool or input -------------------------------------------------------


def test_same_id_with_other_input_raises_before_anything_runs(
    run: Runner, tools: tl.ToolSet, ledger: tl.Ledger, counter: Counter
) -> None:
    run([TICKET], tools, ledger=ledger)
    content = [
        tool_use("toolu_new", "read_file", path="/x"),
        tool_use("toolu_T", "create_ticket", title="something else"),
    ]
    with pytest.raises(tl.LedgerMismatchError) as info:
        run(content, tools, ledger=ledger)
    err = info.value
    assert err.tool_use_id == "toolu_T" and err.session_id == "session-1"
    assert err.recorded_input_hash != err.input_hash
    assert counter["read_file"] == 0 and counter["create_ticket"] == 1
    record = ledger.get("toolu_T")
    assert record is not None and json.loads(record.result or "")["title"] == "outage"


def test_same_id_with_other_tool_raises(run: Runner, tools: tl.ToolSet, ledger: tl.Ledger) -> None:
    run([TICKET], tools, ledger=ledger)
    with pytest.raises(tl.LedgerMismatchError, match="recorded for tool 'create_ticket'"):
        run([tool_use("toolu_T", "read_file", path="/x")], tools, ledger=ledger)


def test_input_key_order_does_not_matter(run: Runner, ledger: tl.Ledger) -> None:
    calls = Counter()

    @tl.tool
    def send(to: str, body: str) -> str:
        calls.hit("send")
        return "ok"

    run(
        [{"type": "tool_use", "id": "t", "name": "send", "input": {"to": "a", "body": "b"}}],
        [send],
        ledger=ledger,
    )
    run(
        [{"type": "tool_use", "id": "t", "name": "send", "input": {"body": "b", "to": "a"}}],
        [send],
        ledger=ledger,
    )
    assert calls["send"] == 1


# -- approvals ----------------------------------------------------------------------------------


def test_high_impact_without_approver_is_declined_and_recorded(
    run: Runner, tools: tl.ToolSet, ledger: tl.Ledger, counter: Counter
) -> None:
    email = tool_use("toolu_E", "send_email", to="a@b", body="x")
    (result,) = run([email], tools, ledger=ledger)
    assert result["is_error"] is True and "no approver is configured" in result["content"]
    assert counter["send_email"] == 0
    record = ledger.get("toolu_E")
    assert record is not None and record.status is Status.DENIED
    # An approver appearing later does not reopen a decided call.
    assert run([email], tools, ledger=ledger, approve=lambda r: True) == [result]
    assert counter["send_email"] == 0


def test_declined_call_is_recorded_and_not_asked_again(
    run: Runner, tools: tl.ToolSet, ledger: tl.Ledger, counter: Counter
) -> None:
    asked = Counter()

    def no(req: tl.ApprovalRequest) -> tl.Decision:
        asked.hit("no")
        return tl.Decision(approved=False, by="ana")

    email = tool_use("toolu_E", "send_email", to="a@b", body="x")
    first = run([email], tools, ledger=ledger, approve=no)
    assert first[0]["is_error"] is True
    assert (
        first[0]["content"].startswith("declined by ana") and "not executed" in first[0]["content"]
    )
    assert run([email], tools, ledger=ledger, approve=no) == first
    assert asked["no"] == 1 and counter["send_email"] == 0


def test_async_approver(tools: tl.ToolSet, ledger: tl.Ledger, counter: Counter) -> None:
    async def approve(req: tl.ApprovalRequest) -> tl.Decision:
        await asyncio.sleep(0)
        return tl.Decision(approved=True, by="async-bot")

    email = tool_use("toolu_E", "send_email", to="a@b", body="x")
    asyncio.run(tl.arun_tool_uses([email], tools, ledger=ledger, approve=approve))
    tl.run_tool_uses([email], tools, ledger=ledger, approve=approve)
    assert counter["send_email"] == 1
    record = ledger.get("toolu_E")
    assert record is not None and record.approved_by == "async-bot"


def test_approver_returning_garbage_is_a_loud_error(
    run: Runner, tools: tl.ToolSet, ledger: tl.Ledger, counter: Counter
) -> None:
    email = tool_use("toolu_E", "send_email", to="a@b", body="x")
    with pytest.raises(TypeError, match="must return a bool or a Decision"):
        run([email], tools, ledger=ledger, approve=lambda r: "yes")
    assert counter["send_email"] == 0


# -- bad input ----------------------------------------------------------------------------------


def test_unknown_tool_is_an_error_result_naming_the_tools(
    run: Runner, tools: tl.ToolSet, ledger: tl.Ledger
) -> None:
    (result,) = run([tool_use("toolu_X", "launch_rockets")], tools, ledger=ledger)
    assert result["is_error"] is True
    assert "unknown tool 'launch_rockets'" in result["content"]
    assert "create_ticket, read_file, send_email" in result["content"]
    assert ledger.get("toolu_X") is None


def test_schema_invalid_input_is_an_error_result_and_nothing_runs(
    run: Runner, tools: tl.ToolSet, ledger: tl.Ledger, counter: Counter
) -> None:
    bad = [
        tool_use("toolu_1", "create_ticket"),
        tool_use("toolu_2", "create_ticket", title=["not", "a", "string"]),
        tool_use("toolu_3", "create_ticket", title="ok", priority="p0"),
    ]
    results = run(bad, tools, ledger=ledger)
    assert all(r["is_error"] for r in results)
    assert "title: Field required" in results[0]["content"]
    assert "title: Input should be a valid string" in results[1]["content"]
    assert "priority: Extra inputs are not permitted" in results[2]["content"]
    assert counter.total == 0
    assert ledger.records() == []


def test_duplicate_ids_in_one_message_are_refused(
    run: Runner, tools: tl.ToolSet, ledger: tl.Ledger, counter: Counter
) -> None:
    with pytest.raises(tl.MalformedContentError, match="appears twice"):
        run([TICKET, TICKET], tools, ledger=ledger)
    assert counter.total == 0


@pytest.mark.parametrize(
    "content",
    [
        "just a string",
        [{"no": "type"}],
        [{"type": "tool_use", "name": "x", "input": {}}],
        [{"type": "tool_use", "id": "t", "input": {}}],
        [{"type": "tool_use", "id": "t", "name": "x", "input": ["not", "an", "object"]}],
        [{"type": "tool_use", "id": 5, "name": "x", "input": {}}],
        [{"type": "tool_use", "id": "t", "name": "x", "input": {"v": float("nan")}}],
    ],
)
def test_malformed_content_is_refused(
    run: Runner, tools: tl.ToolSet, ledger: tl.Ledger, content: Any
) -> None:
    with pytest.raises(tl.MalformedContentError):
        run(content, tools, ledger=ledger)


def test_ledger_argument_must_be_a_ledger(run: Runner, tools: tl.ToolSet) -> None:
    with pytest.raises(tl.ConfigurationError, match=r"store\.ledger"):
        run([TICKET], tools, ledger="session-1")


# -- async tools --------------------------------------------------------------------------------


def test_async_tools_run_in_both_runners(run: Runner, ledger: tl.Ledger) -> None:
    calls = Counter()

    @tl.tool
    async def notify(who: str, ctx: tl.ToolContext) -> str:
        await asyncio.sleep(0)
        calls.hit("notify")
        return f"notified {who} ({ctx.tool_use_id})"

    use = tool_use("toolu_1", "notify", who="ops")
    assert run([use], [notify], ledger=ledger)[0]["content"] == "notified ops (toolu_1)"
    assert run([use], [notify], ledger=ledger)[0]["content"] == "notified ops (toolu_1)"
    assert calls["notify"] == 1


def test_sync_runner_inside_an_event_loop_refuses_async_tools(ledger: tl.Ledger) -> None:
    @tl.tool
    async def notify() -> str:
        return "x"

    async def main() -> None:
        with pytest.raises(tl.ConfigurationError, match="arun_tool_uses"):
            tl.run_tool_uses([tool_use("toolu_1", "notify")], [notify], ledger=ledger)

    asyncio.run(main())
    assert ledger.records() == [], "refused before anything was written"


def test_an_error_message_the_api_could_not_encode_is_made_valid(
    run: Runner, ledger: tl.Ledger
) -> None:
    @tl.tool
    def broken() -> str:
        raise ValueError("bad byte \udc80 in the reply")

    (result,) = run([tool_use("toolu_1", "broken")], [broken], ledger=ledger)
    assert result["is_error"] is True
    assert result["content"] == "'broken' failed: ValueError: bad byte \ufffd in the reply"
    result["content"].encode("utf-8")


def test_a_failure_whose_message_holds_a_nul_is_recorded_on_every_store(
    run: Runner, ledger: tl.Ledger, counter: Counter
) -> None:
    """PostgreSQL's TEXT cannot hold U+0000: an exception's message with one must not leave
    the call ``started`` (in doubt once this process ends) after the tool ran and failed."""

    @tl.tool
    def broken() -> str:
        counter.hit("broken")
        raise ValueError("bad byte \x00 in the reply")

    (first,) = run([tool_use("toolu_1", "broken")], [broken], ledger=ledger)
    (again,) = run([tool_use("toolu_1", "broken")], [broken], ledger=ledger)
    assert counter["broken"] == 1
    assert first["is_error"] is True
    assert again == first, "answered from its failed record"
    (record,) = ledger.records()
    assert record.status is Status.FAILED
    assert record.error == first["content"]
    assert first["content"] == "'broken' failed: ValueError: bad byte \\x00 in the reply"


_VALIDATED: list[str] = []


def _checked_title(title: str) -> str:
    _VALIDATED.append(title)
    if title == "bad":
        raise ValueError("bad title")
    return title


@tl.tool(effect="non_idempotent", name="create_ticket")
def _counted_ticket(
    title: Annotated[str, pydantic.AfterValidator(_checked_title)],
) -> dict[str, Any]:
    return {"title": title}


def test_an_input_is_validated_once_on_the_straight_path_and_twice_at_most(
    run: Runner, store: tl.Store
) -> None:
    """A validator may count or log: the common call's input is validated once, and a call that
    is not the common one (bad input here) is validated by the straight path's plan and then by
    the general path — no more."""
    ledger = store.ledger("s")
    store.lineage_root("s")  # known, as after a session's first call: the next can go straight
    _VALIDATED.clear()
    run([tool_use("toolu_1", "create_ticket", title="ok")], [_counted_ticket], ledger=ledger)
    assert list(_VALIDATED) == ["ok"]
    _VALIDATED.clear()
    (result,) = run(
        [tool_use("toolu_2", "create_ticket", title="bad")], [_counted_ticket], ledger=ledger
    )
    assert result["is_error"] is True
    validated = list(_VALIDATED)
    assert validated == (["bad", "bad"] if switches.STRAIGHT else ["bad"])


@pytest.mark.parametrize("straight", [True, False])
@pytest.mark.parametrize("calls", [1, 2])
def test_an_interrupted_tool_leaves_its_call_in_doubt_and_no_longer_in_flight(
    store: tl.Store, monkeypatch: pytest.MonkeyPatch, straight: bool, calls: int
) -> None:
    """A ``KeyboardInterrupt`` in the tool goes up to the caller, its intent stays ``started``
    and the attempt is over here at once — on the straight path, where no generator stands
    between, and on the general path, whose generator is told (not left suspended until it is
    collected, holding the call in flight while the traceback lives)."""
    monkeypatch.setattr(switches, "STRAIGHT", straight)

    @tl.tool(effect="non_idempotent")
    def create_ticket(title: str) -> dict[str, Any]:
        if title == "stop":
            raise KeyboardInterrupt
        return {"title": title}

    ledger = store.ledger("s")
    store.lineage_root("s")
    blocks = [tool_use(f"toolu_{n}", "create_ticket", title="stop") for n in range(calls)]
    with pytest.raises(KeyboardInterrupt) as raised:
        tl.run_tool_uses(blocks, [create_ticket], ledger=ledger)
    assert raised.value is not None  # the traceback (and every frame in it) is still alive
    record = ledger.get("toolu_0")
    assert record is not None and record.status is Status.STARTED
    assert (store.place, "s", "toolu_0") not in store.runtime.in_flight
    assert ledger.get("toolu_1") is None, "nothing after the interrupted call ran"
