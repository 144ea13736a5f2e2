"""Why an agent run stops for a person, in words a person can act on: a call in doubt, a call
awaiting approval (with the whole commands to run), a session behind its ledger."""

from __future__ import annotations

from .._shell import SETTLING, asked, command, command_parts, commands_in
from ..engine._outcomes import CallOutcome, Disposition
from ..errors import CorruptLedgerError
from ..records import RunStatus, ToolCall
from ..stores import DEFAULT_STORE_URL

__all__ = ["behind", "no_commands", "said", "stop_reason"]


def behind(sid: str, stray: list[str], why: str, *, url: str) -> CorruptLedgerError:
    """Ledger records that no turn of the transcript asked for: the checkpoint is older than
    the ledger (restored from a backup, or its last commits lost). Resuming would ask the
    model again, and the lost turns' calls would run again under new ids."""
    shown = ", ".join(stray[:5]) + (" …" if len(stray) > 5 else "")
    return CorruptLedgerError(
        f"session {sid!r} is behind its ledger: records for {shown} exist but {why}. "
        "Resuming would repeat those calls under new ids, so it is refused. Restore the "
        "session's newer checkpoint (the store as it was), or settle by hand what those "
        "calls did; `toolledger verify` and `toolledger effects` show both sides.",
        url=url,
        session_id=sid,
    )


def stop_reason(outcomes: list[CallOutcome], sid: str, url: str) -> tuple[RunStatus, str] | None:
    """Why checkpoint B must not be written yet: a call is in doubt or awaits approval. The
    commands to run are whole and shell-quoted, with the store when it is not the default."""

    def cmd(verb: str, session: str, call: ToolCall, option: str | None = None) -> str:
        options = [] if option is None else [option]
        return command(
            verb, session, call.tool_use_id, options=options, url=url, default_url=DEFAULT_STORE_URL
        )

    def settle(session: str, call: ToolCall) -> str:
        return (
            f"`{cmd('resolve', session, call, '--happened')}` if it took effect, or "
            f"`{cmd('resolve', session, call, '--not-happened')}` if it did not"
        )

    doubt = [o for o in outcomes if o.disposition is Disposition.IN_DOUBT]
    if doubt:
        here = [o for o in doubt if o.settle_in is None]
        names = ", ".join(_named(o.call) for o in here)
        how = "; ".join(settle(sid, o.call) for o in here)
        parts = (
            [f"in doubt: {names} may already have happened. Settle each with one command: {how}"]
            if here
            else []
        )
        # A branch's copy of its lineage's call is settled (or run) where the call was made.
        # Not run there yet, nothing is in doubt there: `resolve` would refuse, a run runs it.
        parts += [
            f"{_named(o.call)} is the call of session {said(repr(o.settle_in))}, "
            "where this session's lineage holds it: "
            + (
                "it has not run there yet; run that session (first approve or deny the call "
                "there if it waits for a person), which makes it for every session of the "
                "lineage"
                if o.not_run_in
                else "run that session, or settle it there with " + settle(o.settle_in, o.call)
            )
            for o in doubt
            if o.settle_in is not None
        ]
        return (RunStatus.NEEDS_ATTENTION, "; ".join(parts) + ", then run the session again.")
    waiting = [o for o in outcomes if o.disposition is Disposition.AWAITING_APPROVAL]
    if waiting:
        parts = []
        first = [o for o in waiting if not o.in_doubt]
        if first:
            names = ", ".join(_named(o.call) for o in first)
            first_run = asked(in_doubt=False)  # bound to the question asked
            how = "; ".join(
                f"`{cmd('approve', sid, o.call, first_run)}` or "
                f"`{cmd('deny', sid, o.call, first_run)}`"
                for o in first
            )
            parts.append(f"awaiting approval: {names}. Decide with {how}")
        # A call in doubt in the queue: approving it runs it again, whatever happened the first
        # time. Settling it says what happened instead — the choice a person should see first.
        parts += [
            f"in doubt, awaiting a person: {_named(o.call)} may already "
            f"have happened. Settle it with {settle(sid, o.call)}; "
            f"`{cmd('approve', sid, o.call, asked(in_doubt=True))}` runs it again whatever "
            f"happened (a second effect if it had), "
            f"`{cmd('deny', sid, o.call, asked(in_doubt=True))}` leaves it in doubt"
            for o in waiting
            if o.in_doubt
        ]
        return (RunStatus.AWAITING_APPROVAL, "; ".join(parts) + ", then run the session again.")
    return None


def _named(call: ToolCall) -> str:
    """A call as a reason's words name it: ``'tool' (id)``."""
    return said(f"{call.name!r} ({call.tool_use_id})")


def said(text: str) -> str:
    """Text of the model's, a person's or an error's (an id, a name, an API's answer) in a
    reason's words, its backticks written ``\\x60``: in a reason only a command toolledger
    printed (``stop_reason``) is in backticks (``toolledger._views.overview.reason_parts``)."""
    return text.replace("`", "\\x60")


def no_commands(text: str) -> str:
    """``text`` — an error's or an alert's: data (the model API's answer, a store's error, a
    call's model-chosen id) — with the backticks around each command a stop reason could name
    (``SETTLING``) written ``\\x60``: only a stop for a person names commands. Other words in
    backticks (`` `toolledger verify` ``) stay as they are."""
    while True:  # until none is left: one written so could let another be read
        out, at = [], 0
        for start, end, argv in commands_in(text):
            if command_parts(argv)[1] in SETTLING:
                out += [text[at:start], said(text[start:end])]
                at = end
        if not at:
            return text
        text = "".join([*out, text[at:]])
