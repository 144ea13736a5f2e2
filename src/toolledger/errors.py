"""Every exception toolledger raises, in one tree.

```
ToolLedgerError                      base of everything below
├── ConfigurationError (ValueError)  a bad store URL, option or tool declaration
├── MalformedContentError (ValueError)
│                                    content blocks that are not tool_use blocks we can read,
│                                    or one tool_use id twice in one message
├── InvalidSessionIdError (ValueError)
├── LedgerMismatchError (ValueError) a tool_use id already recorded with another tool or input
├── NotInDoubtError (ValueError)     resolve: the call has no record, or has an outcome already
├── NotPendingError (ValueError)     approve/deny: the request was decided or used already
├── BranchPointError (ValueError)    fork/rewind: no such turn, or its calls are not all answered
├── EffectInProgressError            another attempt at the call may still be running
├── SessionConflictError             the session (or a call's record, an approval request)
│   │                                moved on since this worker read it
│   ├── SessionBusyError             another worker holds the session's lease
│   └── LeaseLostError               this worker's lease was taken over: its writes are refused
├── ModelCallError                   the model API failed; the session stays resumable
├── MCPToolError (RuntimeError)      an MCP server answered a call with isError
├── StoreError (OSError)             a store could not be read or written
│   ├── CorruptLedgerError           stored state is damaged; never read as empty
│   ├── StoreUnavailableError        the database or directory went away
│   │   └── ClockMovedError          a shared clock stepped since this process read it;
│   │                                nothing was written
│   ├── SchemaVersionError           the store was written by a newer toolledger
│   └── LedgerWriteError             an effect happened but its record could not be written
│       │                            (docs/design.md, rule 4): given to ``on_alert`` and the
│       │                            logger, raised only when asked (``raise_alerts=True``)
│       └── LateOutcomeError         an attempt reported after the call was settled otherwise:
│                                    both attempts may have taken effect (an alert, likewise)
└── OutcomeUnknown                   raised *by a tool*: "I may have done it" (leaves it in doubt)
```

Errors carry structured fields (``session_id``, ``tool_use_id`` …) so a caller or an alerting
hook can act without parsing messages. Driver errors are wrapped with ``raise … from exc``.

The two alerts are exceptions that are not raised by default: the effect happened, so the run
goes on with the real result (rule 4) and the alert goes to ``on_alert`` and the ``toolledger``
logger (``Run.alerts`` for an agent). They are exceptions all the same, so a caller can stop on
one: ``run_tool_uses(..., raise_alerts=True)`` raises the batch's first alert once every call is
over.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BranchPointError",
    "ClockMovedError",
    "ConfigurationError",
    "CorruptLedgerError",
    "EffectInProgressError",
    "InvalidSessionIdError",
    "LateOutcomeError",
    "LeaseLostError",
    "LedgerMismatchError",
    "LedgerWriteError",
    "MCPToolError",
    "MalformedContentError",
    "ModelCallError",
    "NotInDoubtError",
    "NotPendingError",
    "OutcomeUnknown",
    "SchemaVersionError",
    "SessionBusyError",
    "SessionConflictError",
    "StoreError",
    "StoreUnavailableError",
    "ToolLedgerError",
]


class ToolLedgerError(Exception):
    """Base class of every error toolledger raises.

    ``session_id`` and ``tool_use_id`` are set when the error concerns one call.
    """

    def __init__(
        self,
        message: str,
        *,
        session_id: str | None = None,
        tool_use_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.session_id = session_id
        self.tool_use_id = tool_use_id


class ConfigurationError(ToolLedgerError, ValueError):
    """A store URL, an option or a tool declaration that cannot work."""


class MalformedContentError(ToolLedgerError, ValueError):
    """Content blocks that cannot be read as tool_use blocks, or a repeated tool_use id."""


class InvalidSessionIdError(ToolLedgerError, ValueError):
    """A session id that is empty, too long or holds control characters."""


class LedgerMismatchError(ToolLedgerError, ValueError):
    """The same ``(session, tool_use_id)`` arrived with another tool or another input.

    tool_use ids are minted once per model response, so this means the transcript was edited or
    two sessions share a name. Nothing ran; the stored record is untouched.
    """

    def __init__(
        self,
        message: str,
        *,
        session_id: str,
        tool_use_id: str,
        recorded_tool: str,
        recorded_input_hash: str,
        tool: str,
        input_hash: str,
    ) -> None:
        super().__init__(message, session_id=session_id, tool_use_id=tool_use_id)
        self.recorded_tool = recorded_tool
        self.recorded_input_hash = recorded_input_hash
        self.tool = tool
        self.input_hash = input_hash


class NotInDoubtError(ToolLedgerError, ValueError):
    """``resolve`` of a call that is not in doubt: it has no record, or it has an outcome
    already (its worker's, its check's, a person's). Nothing was changed; look at it again
    (``toolledger effects SESSION``)."""


class NotPendingError(ToolLedgerError, ValueError):
    """A decision on an approval request that is not pending: there is none, or it was decided
    or used already. Nothing was changed (``toolledger approvals`` lists the pending ones)."""


class BranchPointError(ToolLedgerError, ValueError):
    """A fork or rewind at a point that cannot be branched from: the session does not exist,
    has no such turn, or the turn's calls are not all answered yet (a branch starts at a
    checkpoint-B boundary). Nothing was written; ``toolledger history SESSION`` shows the
    turns."""

    def __init__(self, message: str, *, session_id: str, turn: int) -> None:
        super().__init__(message, session_id=session_id)
        self.turn = turn


class EffectInProgressError(ToolLedgerError):
    """Another attempt at this call may still be running (another thread, process, worker or
    host), so it can be neither run again nor settled now.

    Retry later: you will get the stored result once it finishes. ``holder`` names the worker;
    ``until`` is the store-clock time after which it will be judged again (``None``: for as long
    as its process, on this host, lives).
    """

    def __init__(
        self,
        message: str,
        *,
        session_id: str,
        tool_use_id: str,
        holder: str | None,
        until: float | None = None,
    ) -> None:
        super().__init__(message, session_id=session_id, tool_use_id=tool_use_id)
        self.holder = holder
        self.until = until


class SessionConflictError(ToolLedgerError):
    """A write found what it was based on changed since it was read: the session (another
    worker runs it, or ran it meanwhile), a call's record or an approval request (someone
    settled or decided it first). Nothing of the write landed. Reload before going on."""


class SessionBusyError(SessionConflictError):
    """Another worker holds the session's lease: two workers never run one session at once.
    ``owner`` holds it until ``expires_at`` (epoch seconds); a crashed holder's lease expires, and
    on the same host a dead holder is noticed at once."""

    def __init__(self, message: str, *, session_id: str, owner: str, expires_at: float) -> None:
        super().__init__(message, session_id=session_id)
        self.owner = owner
        self.expires_at = expires_at


class LeaseLostError(SessionConflictError):
    """This worker's lease on the session was taken over (it expired, or the worker was thought
    dead): the write was refused by the fencing token and nothing of it landed."""


class ModelCallError(ToolLedgerError):
    """The model API failed (an HTTP error, a timeout, a dropped connection) after the SDK's own
    retries. The session is recorded ``failed`` with the reason and resumes on the next run;
    nothing was lost. ``status_code`` is the HTTP status when there was one; ``__cause__`` the
    SDK's exception."""

    def __init__(self, message: str, *, session_id: str, status_code: int | None) -> None:
        super().__init__(message, session_id=session_id)
        self.status_code = status_code


class MCPToolError(ToolLedgerError, RuntimeError):
    """The MCP server answered a call with ``isError`` (or refused it): the tool failed.

    Raised by the tools ``toolledger.adapters.mcp.tools_from_session`` builds; the runner turns
    it into an error result and a ``failed`` record. ``content`` is the server's text."""

    def __init__(self, message: str, *, tool: str, content: str) -> None:
        super().__init__(message)
        self.tool = tool
        self.content = content


class StoreError(ToolLedgerError, OSError):
    """A store could not be read or written. ``url`` names the store. ``outcome_unknown``: a
    write was sent but its answer lost (the connection died during COMMIT) — it may or may not
    have landed; toolledger reads it back before going on."""

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        session_id: str | None = None,
        tool_use_id: str | None = None,
        outcome_unknown: bool = False,
    ) -> None:
        super().__init__(message, session_id=session_id, tool_use_id=tool_use_id)
        self.url = url
        self.outcome_unknown = outcome_unknown


class CorruptLedgerError(StoreError):
    """Stored state is damaged (truncated, edited, bit-flipped). It is never read as empty:
    an empty ledger would re-run every effect. ``path`` names the damaged file when there is one.
    """

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        path: str | None = None,
        session_id: str | None = None,
    ) -> None:
        super().__init__(message, url=url, session_id=session_id)
        self.path = path


class StoreUnavailableError(StoreError):
    """The database or directory behind a store went away or refused us."""


class ClockMovedError(StoreUnavailableError):
    """A store whose clock every worker shares (PostgreSQL's) refused a write whose deadline
    was set on this process's reading of that clock, because the clock says otherwise now: it
    was stepped (an NTP correction, a restored VM) since the reading. Nothing was written; the
    process has read the clock again, and a write built anew lands. toolledger builds its
    intents anew itself; this reaches a caller only when the clock kept moving."""


class SchemaVersionError(StoreError):
    """The store's schema is newer than this toolledger understands: upgrade toolledger."""


class LedgerWriteError(StoreError):
    """An effect happened but its record could not be written (docs/design.md, rule 4).

    This is an *alert*, not a failure of the tool: the real result still went back to the model.
    A person must look, because a resume could run the effect again. ``result`` is the content the
    model received; ``cause`` the underlying error (``None`` when someone else changed the record
    first). It is handed to ``on_alert`` and logged, and raised only where the caller asked for
    it (``run_tool_uses(..., raise_alerts=True)``).
    """

    def __init__(
        self,
        message: str,
        *,
        session_id: str,
        tool_use_id: str,
        tool: str,
        result: str,
        cause: BaseException | None,
        url: str | None = None,
    ) -> None:
        super().__init__(message, url=url, session_id=session_id, tool_use_id=tool_use_id)
        self.tool = tool
        self.result = result
        self.cause = cause

    def as_dict(self) -> dict[str, Any]:
        """The alert as a JSON-ready dict, for logs and pagers."""
        return {
            "alert": "ledger_write_failed",
            "message": self.message,
            "session_id": self.session_id,
            "tool_use_id": self.tool_use_id,
            "tool": self.tool,
            "store": self.url,
            "cause": repr(self.cause) if self.cause is not None else None,
        }


class LateOutcomeError(LedgerWriteError):
    """An attempt's outcome arrived after the call had been settled another way: a later attempt
    replaced it, or a person resolved it. The attempt's outcome is kept in the record's
    ``history`` (``toolledger verify`` reports it); if it succeeded, the world may hold the
    effect twice. ``attempt`` is the late attempt, ``current`` what the record says now.

    Only a process that was paused or cut off past its deadline can cause this (docs/design.md, rule
    14): a tool that forwards ``ctx.idempotency_key`` lets the receiver refuse the repeat.
    """

    def __init__(
        self,
        message: str,
        *,
        session_id: str,
        tool_use_id: str,
        tool: str,
        result: str,
        attempt: int,
        current: str,
        url: str | None = None,
    ) -> None:
        super().__init__(
            message,
            session_id=session_id,
            tool_use_id=tool_use_id,
            tool=tool,
            result=result,
            cause=None,
            url=url,
        )
        self.attempt = attempt
        self.current = current

    def as_dict(self) -> dict[str, Any]:
        return {
            **super().as_dict(),
            "alert": "late_outcome",
            "attempt": self.attempt,
            "current": self.current,
        }


class OutcomeUnknown(ToolLedgerError):
    """Raise from a tool when it cannot tell whether its effect happened (a timeout after the
    request was sent, a dropped connection). The call stays *in doubt* instead of ``failed``, so
    it is never retried blindly.
    """
