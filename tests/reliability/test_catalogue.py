"""The bad-input catalogue: every kind of bad input we promise to survive, and the test that fails
if that promise breaks. Most live beside the code they test; this module holds the rest, and
``test_every_item_of_the_catalogue_has_a_test`` checks that every test named here exists.

unknown tool:
    tests/test_runner.py::test_unknown_tool_is_an_error_result_naming_the_tools
schema-invalid input:
    tests/test_runner.py::test_schema_invalid_input_is_an_error_result_and_nothing_runs
missing input:
    tests/reliability/test_catalogue.py::test_a_tool_use_without_input_is_read_as_an_empty_input
duplicate tool_use ids in one message:
    tests/test_runner.py::test_duplicate_ids_in_one_message_are_refused
… from the model, through the Agent:
    tests/reliability/test_catalogue.py::test_duplicate_ids_from_the_model_stop_the_agent_before_anything_runs
an id reused with other input:
    tests/test_runner.py::test_same_id_with_other_input_raises_before_anything_runs
… or with another tool:
    tests/test_runner.py::test_same_id_with_other_tool_raises
non-JSON result:
    tests/test_runner.py::test_unserialisable_result_is_recorded_as_a_note
huge result:
    tests/test_runner.py::test_oversized_result_keeps_its_effect_as_a_note
… through the Agent:
    tests/reliability/test_catalogue.py::test_a_huge_result_through_the_agent_is_a_note_and_runs_once
recursive result:
    tests/test_runner.py::test_recursive_result_is_recorded_as_a_note
malformed content blocks:
    tests/test_runner.py::test_malformed_content_is_refused
invalid UTF-8 in a result:
    tests/reliability/test_catalogue.py::test_invalid_utf8_in_a_result_is_recorded_as_a_note
lone surrogates in results (every store):
    tests/stores/test_conformance.py::TestSQLite::test_results_round_trip_exactly
lone surrogates in content blocks (text, input, result):
    tests/reliability/test_catalogue.py::test_lone_surrogates_in_content_blocks_survive_the_ledger
… in a tool result, through the Agent:
    tests/reliability/test_catalogue.py::test_a_lone_surrogate_in_a_tool_result_survives_the_agent
… on PostgreSQL:
    tests/reliability/test_catalogue.py::test_a_lone_surrogate_in_a_tool_result_on_postgres
invalid UTF-8 and surrogates in session names:
    tests/reliability/test_catalogue.py::test_session_names_that_are_not_text_are_refused
very long messages:
    tests/reliability/test_catalogue.py::test_very_long_messages_are_stored_and_resumed
session names with ``../`` and ``/``:
    tests/stores/test_conformance.py::TestSQLite::test_any_session_id_is_stored_safely
… as file names of the json store:
    tests/stores/test_jsonfile.py::test_file_names_cannot_escape_the_directory
… through the Agent:
    tests/reliability/test_catalogue.py::test_path_like_session_names_stay_inside_the_store
session names with NUL, or of 10 KB:
    tests/stores/test_conformance.py::TestSQLite::test_unusable_session_ids_are_refused
… through the Agent, nothing written:
    tests/reliability/test_catalogue.py::test_unusable_session_names_are_refused_by_the_agent
SQL metacharacters in ids and session names:
    tests/stores/test_conformance.py::TestSQLite::test_sql_metacharacters_in_ids_are_data
… in tool names and inputs:
    tests/reliability/test_catalogue.py::test_sql_metacharacters_in_tool_names_and_inputs_are_data
an approval for a call whose input changed:
    tests/agent/test_agent.py::test_an_approval_for_other_input_is_not_honoured
two sessions whose json file names were the same:
    tests/stores/test_jsonfile.py::test_a_session_named_like_another_s_hash_has_its_own_file
json files under their 0.1 names:
    tests/stores/test_jsonfile.py::test_files_under_their_old_names_are_found_and_renamed
a result whose serialisation raises (a property, a model's computed field):
    tests/reliability/test_catalogue.py::test_a_result_that_cannot_be_serialised_keeps_its_outcome
an exception whose message raises:
    tests/reliability/test_catalogue.py::test_an_exception_whose_message_raises_is_recorded
input nested thousands deep:
    tests/reliability/test_catalogue.py::test_deeply_nested_input_is_an_error_result
… OpenAI arguments, through the Agent:
    tests/reliability/test_catalogue.py::test_deeply_nested_openai_arguments_are_told_to_the_model
a number JSON cannot hold (NaN, Infinity, 1e400) in a tool's input:
    tests/reliability/test_catalogue.py::test_a_number_json_cannot_hold_in_an_input_is_refused_never_run_as_null
… OpenAI arguments, through the Agent:
    tests/adapters/test_openai.py::test_arguments_with_a_number_json_cannot_hold_go_back_as_an_error
a lone surrogate or a control character in a tool_use id:
    tests/reliability/test_catalogue.py::test_tool_use_ids_that_cannot_be_keys_are_refused
a second hard link to the SQLite database:
    tests/stores/test_sqlite.py::test_a_database_with_two_names_is_refused
``resolve --result`` that is not JSON (NaN, nested too deep), or given with --not-happened:
    tests/cli/test_cli.py::test_resolve_refuses_a_result_that_is_not_json
the terminal approver with no terminal:
    tests/agent/test_agent.py::test_the_terminal_approver_without_a_terminal_declines
rich markup, control characters and shell metacharacters in stored data, ids at 80 columns:
    tests/cli/test_output.py::test_data_is_printed_literally_and_ids_whole
… in a printed command a person pastes:
    tests/cli/test_output.py::test_printed_commands_paste_whole_and_quoted
… in ``run.reason``:
    tests/cli/test_output.py::test_a_run_s_reason_names_the_real_call_quoted
secrets in an OpenAI transcript, and JSON never truncated:
    tests/cli/test_output.py::test_an_openai_session_is_shown_as_calls_and_results_with_secrets_masked
secrets under other names, in header pairs, in URLs:
    tests/reliability/test_security.py::test_header_pairs_url_passwords_and_credentials_in_strings_are_masked
a store URL that names nothing (a forgotten ``--store``, a mistyped schema):
    tests/cli/test_cli.py::test_errors_are_reported_not_raised
… on PostgreSQL, nothing created:
    tests/stores/test_postgres.py::test_looking_at_a_schema_never_creates_it

The conformance tests run on every backend (``TestMemory``, ``TestJSON``, ``TestSQLite``,
``TestPostgres``); the table names one.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from typing import Any

import pydantic
import pytest

import toolledger as tl
from toolledger._verify import verify
from toolledger.records import Status
from toolledger.testing import Counter
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

from ..conftest import tool_use, url_for

# -- the table is true ----------------------------------------------------------------------------


def referenced_tests() -> list[str]:
    return re.findall(r"^ {4}(tests/\S+::\S+)$", __doc__ or "", re.MULTILINE)


def test_every_item_of_the_catalogue_has_a_test() -> None:
    refs = referenced_tests()
    assert len(refs) >= 25
    for ref in refs:
        path, *names = ref.split("::")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        found: Any = module
        for name in names:
            found = getattr(found, name, None)
            assert found is not None, f"{ref}: no such test"
        assert callable(found) and names[-1].startswith("test_"), ref


def test_every_test_here_is_in_the_table() -> None:
    here = {f"tests/reliability/test_catalogue.py::{n}" for n in globals() if n.startswith("test_")}
    here -= {
        "tests/reliability/test_catalogue.py::test_every_item_of_the_catalogue_has_a_test",
        "tests/reliability/test_catalogue.py::test_every_test_here_is_in_the_table",
    }
    assert here <= set(referenced_tests())


# -- helpers ------------------------------------------------------------------------------------


def agent(model: ScriptedModel, store: tl.Store, tools: list[Any]) -> tl.Agent:
    return tl.Agent(client=model.client(), model="claude-test", tools=tools, store=store)


@pytest.fixture(params=["sqlite", "json"])
def durable_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return url_for(str(request.param), tmp_path)


# -- missing input ------------------------------------------------------------------------------


def test_a_tool_use_without_input_is_read_as_an_empty_input(store: tl.Store) -> None:
    calls = Counter()

    @tl.tool
    def create_ticket(title: str) -> str:
        calls.hit("create_ticket")
        return "opened"

    @tl.tool
    def ping() -> str:
        calls.hit("ping")
        return "pong"

    no_input = [
        {"type": "tool_use", "id": "toolu_1", "name": "create_ticket"},
        {"type": "tool_use", "id": "toolu_2", "name": "ping"},
    ]
    tools = [create_ticket, ping]
    results = tl.run_tool_uses(no_input, tools, ledger=store.ledger("s"))
    assert results[0]["is_error"] is True and "title: Field required" in results[0]["content"]
    assert results[1] == {"type": "tool_result", "tool_use_id": "toolu_2", "content": "pong"}
    assert tl.run_tool_uses(no_input, tools, ledger=store.ledger("s")) == results
    assert (calls["create_ticket"], calls["ping"]) == (0, 1)


# -- duplicate ids from the model ---------------------------------------------------------------


class DuplicatingModel(ScriptedModel):
    """A model API that answers with one tool_use id twice."""

    def reply(self, path: str, reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
        message = super().reply(path, reply, body)
        uses = [b for b in message["content"] if b["type"] == "tool_use"]
        for b in uses[1:]:
            b["id"] = uses[0]["id"]
        return message


def test_duplicate_ids_from_the_model_stop_the_agent_before_anything_runs(
    store: tl.Store,
) -> None:
    calls = Counter()

    @tl.tool
    def create_ticket(title: str) -> str:
        calls.hit(title)
        return "opened"

    twice = [ToolUse("create_ticket", {"title": "a"}), ToolUse("create_ticket", {"title": "b"})]
    with (
        DuplicatingModel([Reply(tool_uses=twice), Reply(text="done")]) as model,
        pytest.raises(tl.MalformedContentError, match="appears twice"),
    ):
        agent(model, store, [create_ticket]).run(session="s", prompt="go")
    assert calls.total == 0
    assert store.ledger("s").records() == []
    messages = store.backend.read_messages("s")
    assert [m.role for m in messages] == ["user"], "the unreadable answer was not checkpointed"
    assert verify(store) == []


# -- results ------------------------------------------------------------------------------------


def test_a_huge_result_through_the_agent_is_a_note_and_runs_once(durable_url: str) -> None:
    calls = Counter()

    @tl.tool
    def export(table: str) -> str:
        calls.hit("export")
        return "row\n" * 1_000_000  # 4 MB

    script = [Reply(tool_uses=[ToolUse("export", {"table": "orders"})]), Reply(text="exported")]
    with ScriptedModel(script) as model, tl.open_store(durable_url) as store:
        run = agent(model, store, [export]).run(session="s", prompt="export orders")
        again = agent(model, store, [export]).run(session="s", prompt="export orders")
        (sent,) = model.requests[1]["messages"][2]["content"]
        (record,) = store.ledger("s").records()
        assert verify(store) == []
    assert run.status is again.status is tl.RunStatus.COMPLETED
    assert calls["export"] == 1
    note = json.loads(sent["content"])
    assert note["toolledger_note"] == "result not stored in full"
    assert note["size_bytes"] > 4_000_000 and len(note["sha256"]) == 64
    assert record.status is Status.SUCCEEDED and len(record.result or "") < 10_000


def test_invalid_utf8_in_a_result_is_recorded_as_a_note(store: tl.Store) -> None:
    calls = Counter()

    @tl.tool
    def read_blob(path: str) -> bytes:
        calls.hit("read_blob")
        return b"\xff\xfe not UTF-8 \xc3\x28"

    use = [tool_use("toolu_1", "read_blob", path="/x")]
    first = tl.run_tool_uses(use, [read_blob], ledger=store.ledger("s"))
    second = tl.run_tool_uses(use, [read_blob], ledger=store.ledger("s"))
    assert first == second and calls["read_blob"] == 1
    note = json.loads(first[0]["content"])
    assert "not JSON-serialisable" in note["reason"] and "\\xff\\xfe" in note["preview"]
    record = store.ledger("s").get("toolu_1")
    assert record is not None and record.status is Status.SUCCEEDED


LONE = "\ud800"  # half a surrogate pair: valid in a Python str and in JSON, not in UTF-8


def test_lone_surrogates_in_content_blocks_survive_the_ledger(store: tl.Store) -> None:
    """In a text block, in a tool_use input and in the result: stored, matched and replayed."""
    calls = Counter()

    @tl.tool
    def create_ticket(title: str) -> dict[str, str]:
        calls.hit("create_ticket")
        return {"title": title, "note": f"echo {LONE}"}

    content = [
        {"type": "text", "text": f"Opening {LONE} now"},
        tool_use("toolu_1", "create_ticket", title=f"broken {LONE} title"),
    ]
    first = tl.run_tool_uses(content, [create_ticket], ledger=store.ledger("s"))
    second = tl.run_tool_uses(content, [create_ticket], ledger=store.ledger("s"))
    assert first == second and calls["create_ticket"] == 1
    first[0]["content"].encode("utf-8")  # what goes to the model is sendable
    assert json.loads(first[0]["content"]) == {
        "title": f"broken {LONE} title",
        "note": f"echo {LONE}",
    }
    other = [tool_use("toolu_1", "create_ticket", title=f"broken {LONE}{LONE} title")]
    with pytest.raises(tl.LedgerMismatchError):  # the input hash still tells inputs apart
        tl.run_tool_uses(other, [create_ticket], ledger=store.ledger("s"))


def surrogate_result_script() -> list[Reply]:
    return [Reply(tool_uses=[ToolUse("lookup", {"key": "k"})]), Reply(text="Done.")]


def surrogate_result_tool(calls: Counter) -> Any:
    @tl.tool
    def lookup(key: str) -> dict[str, str]:
        calls.hit("lookup")
        return {"key": key, "value": f"mangled {LONE} bytes"}

    return lookup


def test_a_lone_surrogate_in_a_tool_result_survives_the_agent(store: tl.Store) -> None:
    calls = Counter()
    with ScriptedModel(surrogate_result_script()) as model:
        tools = [surrogate_result_tool(calls)]
        run = agent(model, store, tools).run(session="s", prompt="look it up")
        again = agent(model, store, tools).run(session="s", prompt="look it up")
        (sent,) = model.requests[1]["messages"][2]["content"]
        assert model.rejected == []
    assert run.status is tl.RunStatus.COMPLETED and again.messages == run.messages
    assert calls["lookup"] == 1
    assert json.loads(sent["content"])["value"] == f"mangled {LONE} bytes"
    assert verify(store) == []


@pytest.mark.postgres
def test_a_lone_surrogate_in_a_tool_result_on_postgres(postgres_store_url: str) -> None:
    """PostgreSQL text cannot hold a lone surrogate; the result is stored escaped."""
    calls = Counter()
    with (
        ScriptedModel(surrogate_result_script()) as model,
        tl.open_store(postgres_store_url) as store,
    ):
        tools = [surrogate_result_tool(calls)]
        run = agent(model, store, tools).run(session="s", prompt="look it up")
        again = agent(model, store, tools).run(session="s", prompt="look it up")
        assert verify(store) == []
    assert run.status is tl.RunStatus.COMPLETED and again.messages == run.messages
    assert calls["lookup"] == 1


def test_session_names_that_are_not_text_are_refused(store: tl.Store) -> None:
    undecodable = b"caf\xe9".decode("utf-8", "surrogateescape")  # how Python keeps bad UTF-8
    for bad in (undecodable, f"half {LONE}", b"bytes"):
        with pytest.raises(tl.InvalidSessionIdError):
            store.ledger(bad)  # type: ignore[arg-type]
    assert store.sessions() == []


# -- long messages, odd names -------------------------------------------------------------------


def test_very_long_messages_are_stored_and_resumed(durable_url: str) -> None:
    prompt = "Summarise this log:\n" + "2024-01-01 GET /checkout 502\n" * 80_000  # 2.3 MB
    answer = "Summary: " + "checkout failing; " * 60_000  # 1 MB
    calls = Counter()

    @tl.tool(effect="read_only")
    def grep(pattern: str) -> str:
        calls.hit("grep")
        return "502\n" * 100_000

    script = [Reply(text=answer, tool_uses=[ToolUse("grep", {"pattern": "502"})]), Reply(text="ok")]
    with ScriptedModel(script) as model:
        with tl.open_store(durable_url) as store:
            run = agent(model, store, [grep]).run(session="s", prompt=prompt)
        with tl.open_store(durable_url) as store:  # another process, another day
            again = agent(model, store, [grep]).run(session="s", prompt=prompt)
            assert verify(store) == []
        assert len(model.requests) == 2
    assert run.status is again.status is tl.RunStatus.COMPLETED
    assert again.messages == run.messages and run.messages[0]["content"] == prompt
    assert run.messages[1]["content"][0]["text"] == answer and calls["grep"] == 1


def test_path_like_session_names_stay_inside_the_store(tmp_path: Path) -> None:
    url = f"json:///{tmp_path / 'store'}"
    names = ["../../escape", "/etc/passwd", "a/b/c", "..", "."]
    with ScriptedModel([Reply(text="hi")] * 1) as model, tl.open_store(url) as store:
        for name in names:
            assert agent(model, store, []).run(session=name, prompt="x").status.value == (
                "completed"
            )
        assert sorted(store.sessions()) == sorted(names)
    inside = {p.resolve() for p in (tmp_path / "store").iterdir()}
    assert {p.resolve() for p in tmp_path.rglob("*") if p.is_file()} <= inside
    assert not (tmp_path / "escape.session.jsonl").exists()


@pytest.mark.parametrize("name", ["nul\x00in the middle", "x" * 10_240, "", "tab\there"])
def test_unusable_session_names_are_refused_by_the_agent(
    name: str, store: tl.Store, tmp_path: Path
) -> None:
    with ScriptedModel([Reply(text="hi")]) as model:
        with pytest.raises(tl.InvalidSessionIdError):
            agent(model, store, []).run(session=name, prompt="x")
        assert model.requests == [], "refused before the model was asked"
    assert store.sessions() == []


def test_sql_metacharacters_in_tool_names_and_inputs_are_data(store: tl.Store) -> None:
    calls = Counter()
    nasty = "'; DROP TABLE effects; -- \" ? %s $1"

    @tl.tool
    def note(text: str) -> str:
        calls.hit("note")
        return text

    content = [
        tool_use(f"toolu_{nasty}", "note", text=nasty),
        tool_use("toolu_2", f"note{nasty}", text="x"),
    ]
    first = tl.run_tool_uses(content, [note], ledger=store.ledger(nasty))
    second = tl.run_tool_uses(content, [note], ledger=store.ledger(nasty))
    assert first == second and calls["note"] == 1
    assert first[0]["content"] == nasty
    assert first[1]["is_error"] and "unknown tool" in first[1]["content"]
    (record,) = store.ledger(nasty).records()
    assert record.tool_use_id == f"toolu_{nasty}" and store.sessions() == [nasty]


# -- results, exceptions and inputs that fight back -----------------------------------------------


class _Ticket(pydantic.BaseModel):
    id: str

    @pydantic.computed_field  # type: ignore[prop-decorator]
    @property
    def url(self) -> str:
        raise KeyError("base_url")


def test_a_result_that_cannot_be_serialised_keeps_its_outcome(store: tl.Store) -> None:
    """A pydantic result whose computed field raises: the effect happened, so its record is
    written all the same — a note with what could be salvaged — never a raw exception."""
    calls = Counter()

    @tl.tool
    def create_ticket(title: str) -> Any:
        calls.hit("create_ticket")
        return _Ticket(id="T-1")

    block = tool_use("t1", "create_ticket", title="x")
    (result,) = tl.run_tool_uses([block], [create_ticket], ledger=store.ledger("s"))
    assert "not JSON-serialisable" in result["content"] and "KeyError" in result["content"]
    record = store.ledger("s").get("t1")
    assert record is not None and record.status is Status.SUCCEEDED
    again = tl.run_tool_uses([block], [create_ticket], ledger=store.ledger("s"))
    assert again == [result] and calls["create_ticket"] == 1


def test_an_exception_whose_message_raises_is_recorded(store: tl.Store) -> None:
    class Weird(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no message for you")

    @tl.tool
    def send(to: str) -> str:
        raise Weird()

    (result,) = tl.run_tool_uses([tool_use("t1", "send", to="a")], [send], ledger=store.ledger("s"))
    assert result["is_error"] and "Weird" in result["content"]
    record = store.ledger("s").get("t1")
    assert record is not None and record.status is Status.FAILED


def _deep(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"x": value}
    return value


def test_deeply_nested_input_is_an_error_result(store: tl.Store) -> None:
    calls = Counter()

    @tl.tool
    def create_ticket(title: Any) -> str:
        calls.hit("create_ticket")
        return "opened"

    block = tool_use("t1", "create_ticket", title=_deep(5_000))
    (result,) = tl.run_tool_uses([block], [create_ticket], ledger=store.ledger("s"))
    assert result["is_error"] and "nested more than 200 levels deep" in result["content"]
    assert calls["create_ticket"] == 0 and store.ledger("s").records() == []


def test_deeply_nested_openai_arguments_are_told_to_the_model(store: tl.Store) -> None:
    """Arguments 3,000 deep (a JSON string the model sent): the model is told, the session goes
    on — never a RecursionError out of every run with the model asked again each time."""
    pytest.importorskip("openai")
    from toolledger.testing.scripted_openai import RawArguments, ScriptedOpenAI

    calls = Counter()

    @tl.tool
    def create_ticket(title: str) -> str:
        calls.hit("create_ticket")
        return "opened"

    deep = "[" * 3000 + "]" * 3000
    script = [
        Reply(tool_uses=[RawArguments("create_ticket", arguments='{"title": ' + deep + "}")]),
        Reply(text="Sorry, done."),
    ]
    with ScriptedOpenAI(script) as model:
        agent = tl.Agent(
            client=model.client(), model="gpt-test", tools=[create_ticket], store=store
        )
        run = agent.run(session="s", prompt="go")
        told = model.requests[-1]["messages"][-1]
    assert run.status is tl.RunStatus.COMPLETED
    assert told["role"] == "tool" and "nested too deep" in told["content"]
    assert calls["create_ticket"] == 0


@pytest.mark.parametrize("streamed", [False, True], ids=["create", "stream"])
@pytest.mark.parametrize("number", [float("inf"), float("nan")])
def test_a_number_json_cannot_hold_in_an_input_is_refused_never_run_as_null(
    store: tl.Store, number: float, streamed: bool
) -> None:
    """``1e400`` in a tool's input is read by the SDK as infinity (``Infinity``, ``NaN`` too):
    the reply is refused, nothing stored or run — never the tool run with ``null`` in its place
    (what the SDK's JSON dump writes for it)."""
    calls = Counter()
    seen: list[Any] = []

    @tl.tool
    def create_ticket(title: str, n: float | None = None) -> str:
        calls.hit("create_ticket")
        seen.append(n)
        return "opened"

    script = [Reply(tool_uses=[ToolUse("create_ticket", {"title": "x", "n": number})])]
    on_text = (lambda text: None) if streamed else None
    with (
        ScriptedModel(script) as model,
        pytest.raises(tl.MalformedContentError, match="a number JSON cannot hold"),
    ):
        agent(model, store, [create_ticket]).run(session="s", prompt="go", on_text=on_text)
    assert calls["create_ticket"] == 0, f"ran with n={seen}"
    assert store.ledger("s").records() == []
    state = store.session("s")
    assert state is not None and state.status is tl.RunStatus.FAILED
    assert [m.role for m in store.messages("s")] == ["user"], "the reply was not stored"


@pytest.mark.parametrize("bad", ["toolu_\ud800x", "toolu_\x00", "t" * 2000])
def test_tool_use_ids_that_cannot_be_keys_are_refused(durable_url: str, bad: str) -> None:
    calls = Counter()

    @tl.tool
    def send(to: str) -> str:
        calls.hit("send")
        return "sent"

    with tl.open_store(durable_url) as store:
        with pytest.raises(tl.MalformedContentError, match="cannot be a ledger key"):
            tl.run_tool_uses([tool_use(bad, "send", to="a")], [send], ledger=store.ledger("s"))
        assert store.ledger("s").records() == [] and calls["send"] == 0
