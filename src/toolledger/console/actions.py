"""What a person does from the console: settle an in-doubt call, decide an approval request.

Each goes through the library's own write, so the rules are those of the command line:
``Ledger.resolve`` (a call still in progress is refused — the console never forces) and
``approvals.decide`` (bound to the input hash the page showed). A form that is incomplete or
refused changes nothing and says why.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import FormData

from .._invisible import has_invisible, shown_id
from .._views.results import parse_result
from ..approvals._queue import decide
from ..errors import StoreError, ToolLedgerError
from ..records import Status
from ..stores import Store

__all__ = ["MAX_NAME", "Notice", "decide_from", "resolve_from"]

MAX_NAME = 100


@dataclass(frozen=True, slots=True)
class Notice:
    """What the page says after an action: done (``ok``) or refused, and why."""

    ok: bool
    text: str


class Refused(ValueError):
    """A form that cannot be acted on; its message is shown."""


def _field(form: FormData, name: str, *, required: bool = True, exact: bool = False) -> str:
    """The form's ``name``: a person's words with the spaces around them dropped, or — with
    ``exact``, for an id or a hash the page put in a hidden field — exactly as posted: session
    ``"s "`` is not session ``"s"``."""
    value = form.get(name)
    text = value if isinstance(value, str) else ""
    if not exact:
        text = text.strip()
    if required and not text:
        raise Refused(f"the form has no {name}")
    return text


def _call(form: FormData) -> tuple[str, str]:
    """The session and the call the form names, exactly as the page wrote them."""
    return _field(form, "session", exact=True), _field(form, "tool_use_id", exact=True)


MAX_ATTEMPT_DIGITS = 18
"""An attempt as the page writes one: ASCII digits, well within an int64."""


def _attempt(text: str) -> int | None:
    """The attempt a form names, as the page wrote it (ASCII digits), or ``None``:
    ``str.isdigit`` also takes a superscript two, which ``int`` refuses, and a number too long
    for ``int`` to read is not one the page wrote either."""
    if text.isascii() and text.isdigit() and len(text) <= MAX_ATTEMPT_DIGITS:
        return int(text)
    return None


def _name(form: FormData) -> str:
    """Who decided, as the record keeps it: at most ``MAX_NAME`` characters, none of which
    prints as nothing or as something else (a control, a C1 control, a right-to-left override,
    a zero-width joiner, a no-break space): two names that would look alike are refused, not
    kept (``_invisible.has_invisible``, as for an id)."""
    by = unicodedata.normalize("NFC", _field(form, "by"))
    if len(by) > MAX_NAME or has_invisible(by, strict=True):
        raise Refused(
            f"a name is at most {MAX_NAME} characters, with no control, formatting or invisible "
            "characters and single spaces between words"
        )
    return by


def resolve_from(store: Store, form: FormData) -> Notice:
    """Settle the in-doubt call the form names: it happened (with an optional result JSON the
    model is told) or it did not (it runs on the next run)."""
    try:
        session, call = _call(form)
        attempt = _attempt(_field(form, "attempt"))
        if attempt is None:
            raise Refused("the form does not say which attempt it showed; load the page again")
        by = _name(form)
        happened = {"yes": True, "no": False}.get(_field(form, "happened"))
        if happened is None:
            raise Refused("say whether it happened")
        text = _field(form, "result", required=False)
        result: Any = None
        if text:
            if not happened:
                raise Refused("a call that did not happen has no result: leave the result empty")
            try:
                result = parse_result(text)
            except ValueError as exc:
                raise Refused(f"the result is not JSON the model can be told: {exc}") from None
        record = store.ledger(session).resolve(
            call, happened=happened, result=result, by=by, attempt=attempt
        )
    except (Refused, ToolLedgerError) as exc:
        return _not_done(exc)
    what = "it happened" if happened else "it did not happen (it runs on the next run)"
    return Notice(
        True,
        f"{_named(record.tool, call, session)}: {what} — recorded {record.status.value} by {by}. "
        "Run the session again to go on.",
    )


def _not_done(exc: Exception) -> Notice:
    """A refused form, or a write that failed: nothing changed — unless the store took the write
    and its answer was lost (``outcome_unknown``): then it may have been recorded, and only the
    store, read again, can say."""
    if isinstance(exc, StoreError) and exc.outcome_unknown:
        return Notice(
            False,
            f"The store did not answer ({exc}): this may have been recorded. Load the page "
            "again: it shows what the store holds now.",
        )
    return Notice(False, f"Nothing changed: {exc}")


def _named(tool: str, call: str, session: str) -> str:
    """A call as a notice names it: every id shown as an id (``shown_id``), so two that differ
    by a character nobody sees never read alike."""
    return f"{shown_id(tool)} ({shown_id(call)}) in {shown_id(session)}"


def decide_from(store: Store, form: FormData) -> Notice:
    """Approve or deny the request the form names, if it is still the one the page showed."""
    try:
        session, call = _call(form)
        shown = _field(form, "input_hash", exact=True)
        in_doubt = {"yes": True, "no": False}.get(_field(form, "in_doubt"))
        attempt = _attempt(_field(form, "attempt"))
        if in_doubt is None or attempt is None:
            raise Refused("the form does not say which request it showed; load the page again")
        by = _name(form)
        approved = {"approve": True, "deny": False}.get(_field(form, "decision"))
        if approved is None:
            raise Refused("say approve or deny")
        record = decide(
            store,
            session,
            call,
            approved=approved,
            by=by,
            input_hash=shown,
            in_doubt=in_doubt,
            attempt=attempt,
        )
        now = store.ledger(session).get(call) if record.in_doubt and not approved else None
    except (Refused, ToolLedgerError) as exc:
        return _not_done(exc)
    if now is not None and now.status is Status.STARTED:
        # A no to running it again is not a word on whether it happened: a run would stop on
        # the call again. Settling it is what comes next.
        return Notice(
            True,
            f"{_named(record.tool, call, session)}: {record.status.value} by {by}. It is still "
            "in doubt: it will not be run again, and a run stops on it until it is settled — "
            "on the In doubt page, say whether it happened.",
        )
    return Notice(
        True,
        f"{_named(record.tool, call, session)}: {record.status.value} by {by}. "
        "Run the session again to go on.",
    )
