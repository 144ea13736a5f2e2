"""A stop reason's commands on a screen (docs/design.md, rule 21: every command printed for an
operator is one complete, shell-quoted choice on its own line): the reason's words name each
by what it does, and each command follows whole, alone on its line, at any width — pasted
into bash, it does what it says. In a pipe the reason is one cell, as stored
(``test_pipes``). What a stored reason holds is data: only a command toolledger could have
printed is ever shown as one."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import toolledger as tl
from toolledger._shell import command, command_label, command_parts, commands_in, quote
from toolledger._views.overview import reason_parts
from toolledger.testing.scripted import Flaky, Reply, ScriptedModel, ToolUse

from ..helpers import awaiting_approval
from .test_widths import BIN, in_terminal

SID = "pay `run` 'it' \u202e now"  # a backtick, quotes, blanks and a bidi override
TID = "toolu_01AbCdEfGhIjKlMnOpQrStUvWxYz"


def awaiting(url: str, tid: str) -> None:
    """Session ``SID`` of the store at ``url`` stopped for a person's approval of call ``tid``
    (a high-impact payment)."""

    @tl.tool(effect="non_idempotent", high_impact=True)
    def pay(amount: int) -> str:
        """Pay."""
        return f"paid {amount}"

    script = [Reply(tool_uses=[ToolUse("pay", {"amount": 5}, id=tid)]), Reply(text="done")]
    with ScriptedModel(script) as model, tl.open_store(url) as store:
        agent = tl.Agent(
            client=model.client(), model="x", tools=[pay], store=store, approve=tl.approvals.queue
        )
        assert agent.run(session=SID, prompt="go").status is tl.RunStatus.AWAITING_APPROVAL


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    awaiting(url, TID)
    return url


STORE = "sqlite:///x.db"


@pytest.mark.parametrize("sid", [SID, "it's", "caf\u00e9\u202e", "-rf"])
def test_a_reason_s_words_name_its_commands_and_the_commands_are_whole(sid: str) -> None:
    approve = command("approve", sid, TID, url=STORE)
    deny = command("deny", sid, TID, url=STORE)
    happened = command("resolve", sid, TID, options=["--happened"], url=STORE)
    reason = f"Decide with `{approve}` or `{deny}`; or `{happened}` if it took effect."
    assert reason_parts(reason, {sid}, STORE) == (
        "Decide with `approve` or `deny`; or `resolve --happened` if it took effect.",
        (approve, deny, happened),
    )
    (_, _, argv), *_ = commands_in(reason)  # what bash gives toolledger for it
    assert command_parts(argv) == (STORE, "approve", [], [sid, TID])
    assert command_label(argv) == "approve"


@pytest.mark.parametrize(
    "forged",
    [
        "toolledger approve a; touch PWNED",
        "toolledger approve $(touch PWNED) t",
        "toolledger approve a | sh",
        "toolledger approve 'a\u202eb' t",  # a control raw inside quotes: quote never writes it
        "toolledger approve a\x1b[2J t",
        "toolledger approve 'unclosed t",
    ],
)
def test_a_stored_reason_s_text_that_toolledger_could_not_have_printed_is_never_a_command(
    forged: str,
) -> None:
    reason = f"Decide with `{forged}`, then run the session again."
    assert commands_in(reason) == []
    assert reason_parts(reason, {"a"}, STORE) == (reason, ())


@pytest.mark.parametrize(
    "other",
    [
        command("approve", "victim", TID, url="sqlite:///elsewhere.db"),  # another store
        command("approve", "victim", TID, url=STORE),  # a session of no lineage here
        command("prune", SID, url=STORE),  # not a command a reason names
        command("approve", SID, url=STORE),  # not whole
    ],
)
def test_a_command_a_reason_holds_is_shown_as_one_only_for_its_store_and_lineage(
    other: str,
) -> None:
    """A reason holds data — a call's id chosen by the model, an alert's text from a tool — so
    a well-quoted command in it is still not shown on a line of its own unless it is one a
    stop reason names for this store and this session's lineage."""
    reason = f"'pay' (x` `{other}` y) awaits approval."
    assert reason_parts(reason, {SID}, STORE) == (reason, ())


def test_a_model_chosen_id_cannot_make_a_command_of_its_own(tmp_path: Path) -> None:
    """The model names a call's id; a reason's words name the call by it. Backticks in it are
    written as ``\\x60`` there, so the id can neither end a command nor begin one."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    forged = command("approve", SID, "toolu_9", url=url)
    tid = f"x` `{forged}` y"
    awaiting(url, tid)
    with tl.open_store(url) as store:
        state = store.session(SID)
    assert state is not None and state.reason is not None
    words, commands = reason_parts(state.reason, {SID}, url)
    assert forged not in commands and len(commands) == 2, commands
    assert all(quote(tid) in c for c in commands), commands  # the real id, quoted
    assert tid.replace("`", "\\x60") in words
    out = in_terminal(["show", SID, "--store", url], 200)
    assert forged not in out.splitlines(), out


def test_an_error_s_text_in_a_reason_cannot_make_a_command_of_its_own(tmp_path: Path) -> None:
    """A reason other than a stop for a person holds an error's text — the model API's answer,
    a store's error, an alert about a call by its model-chosen id — and none of it is a
    command toolledger printed: its backticks are written ``\\x60``, so a well-quoted command
    for this very session and store, sent back by the API, stays words."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    forged = command("approve", "s1", "toolu_9", url=url)
    script = [Flaky(Reply(text="hi"), status=500, times=10, error_type=f"x` `{forged}` y")]
    with ScriptedModel(script) as model, tl.open_store(url) as store:
        agent = tl.Agent(client=model.client(max_retries=0), model="x", tools=[], store=store)
        with pytest.raises(tl.ModelCallError):
            agent.run(session="s1", prompt="go")
        state = store.session("s1")
    assert state is not None and state.status is tl.RunStatus.FAILED
    assert state.reason is not None and f"\\x60{forged}\\x60" in state.reason
    assert reason_parts(state.reason, {"s1"}, url)[1] == ()
    out = in_terminal(["show", "s1", "--store", url], 200)
    assert forged not in out.splitlines(), out


def test_an_error_s_own_words_in_backticks_stay_as_they_are() -> None:
    """What an error's text says in backticks that is no command a stop reason names (the
    `toolledger verify` an alert advises) is written as it was; each approve, deny or resolve
    in it, and only those, has its backticks written ``\\x60``."""
    from toolledger.agent._stops import no_commands

    approve = command("approve", SID, TID, url=STORE)
    resolve = command("resolve", SID, TID, options=["--happened"], url=STORE)
    advice = "late: a person must check it (`toolledger verify` lists such calls); "
    text = f"{advice}`{approve}` `{resolve}`"
    written = [f"`{c}`".replace("`", "\\x60") for c in (approve, resolve)]
    assert no_commands(text) == f"{advice}{written[0]} {written[1]}"
    assert reason_parts(no_commands(text), {SID}, STORE)[1] == ()
    assert no_commands("no command here: `ls` and a lone ` too") == (
        "no command here: `ls` and a lone ` too"
    )


def test_resume_all_offers_no_command_from_an_error_s_words(tmp_path: Path) -> None:
    """An error's text (a session behind its ledger) names `toolledger verify`: words to
    read, not a command of the session's stop to paste under it."""
    from toolledger.agent._stops import behind

    err = behind("s", ["toolu_1"], "no turn asked for them", url=STORE)
    assert "`toolledger verify`" in str(err)
    assert reason_parts(str(err), {"s"}, STORE)[1] == ()


def test_on_a_screen_each_command_is_a_line_of_its_own_and_runs_pasted(url: str) -> None:
    with tl.open_store(url) as store:
        state = store.session(SID)
    assert state is not None and state.reason is not None
    words, commands = reason_parts(state.reason, {SID}, url)
    assert "Decide with `approve` or `deny`" in words and len(commands) == 2
    for argv in (["show", SID], ["sessions"]):
        for width in (60, 200):
            out = in_terminal([*argv, "--store", url], width)
            lines = out.splitlines()
            for c in commands:  # whole, each alone on a line, however narrow the screen
                assert c in lines, (argv, width, out)
            assert "`approve` or `deny`" in out
            assert not any("`toolledger" in ln for ln in lines), out
    (approve,) = [c for c in commands if " approve " in c]
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-c", approve], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, (approve, done.stderr)
    with tl.open_store(url) as store:
        (request,) = store.approvals(SID)
    assert request.status is tl.ApprovalStatus.APPROVED
    # Settled since: its commands are history, and no longer offered.
    out = in_terminal(["show", SID, "--store", url], 200)
    assert "settled since" in out and not any(c in out.splitlines() for c in commands)


def test_a_branch_s_commands_for_a_call_its_sibling_settles_are_lines_of_their_own(
    tmp_path: Path,
) -> None:
    """Two forks of one session meet the same new call id: the first makes it for the lineage
    (its answer lost: in doubt there), and the second's stop names the first — a sibling, not
    a session it was branched from — as where the call is settled. On a screen those commands
    are each a line of their own, as for any session of the lineage, and the reason's words
    (in ``sessions``, a cell of the table) name them by what they do."""
    from ..test_lineage_calls import GREETED, Desk, go_on

    url = f"sqlite:///{tmp_path / 'r.db'}"
    left = "left 'it' \u00e9"
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
    happened = command("resolve", left, "toolu_same", options=["--happened"], url=url)
    not_happened = command("resolve", left, "toolu_same", options=["--not-happened"], url=url)
    for argv in (["show", "right"], ["sessions"]):
        out = in_terminal([*argv, "--store", url], 200)
        lines = [line.strip() for line in out.splitlines()]
        assert happened in lines and not_happened in lines, (argv, out)
        assert not any("`toolledger" in line for line in lines), (argv, out)


def test_a_pasted_approve_is_refused_once_the_question_became_a_call_in_doubt(
    tmp_path: Path,
) -> None:
    """A stop's ``approve`` answers the question it was printed for — the first run of a call.
    Pasted later, once the request asks to run again a call in doubt (a yes to which may make
    a second effect), it is refused and the request stays pending, not taken for a yes."""
    from dataclasses import replace

    from toolledger.cli.app import main
    from toolledger.ops import PutApproval

    url = f"sqlite:///{tmp_path / 'l.db'}"
    run = awaiting_approval(url, "s")
    (approve, _) = [argv for _, _, argv in commands_in(run.reason or "")]
    with tl.open_store(url) as store:
        (asked,) = tl.approvals.pending(store)
        again = replace(asked, in_doubt=True, attempt=2)
        assert store.apply("s", [PutApproval(again, tl.ApprovalStatus.PENDING)]) == [True]
    assert approve[:1] == ["toolledger"] and approve[-1] == "--in-doubt=no"
    assert main(approve[1:]) == 1
    with tl.open_store(url) as store:
        (still,) = store.approvals("s")
    assert still.status is tl.ApprovalStatus.PENDING and still.in_doubt
