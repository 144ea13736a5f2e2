"""What the agent loop keeps of one session between its steps: the ``Run`` and ``Usage`` a run
returns, the loop's view of a session, how a step advances the session's state, and the two store
steps every turn takes (commit or raise; make sure the lease is still this run's)."""

from __future__ import annotations

import threading
from collections.abc import Generator
from dataclasses import dataclass, field, replace
from typing import Any

from .._lineage import ForkedEffect, effects_of
from ..adapters import ModelTurn, Provider
from ..codec import shallow, valid_unicode
from ..engine._drivers import Failure, ReadLease, Request
from ..engine._outcomes import CallOutcome
from ..engine._reconcile import commit
from ..errors import LedgerWriteError
from ..ops import AppendMessages, Op, PutSession, lost
from ..records import Lease, RunStatus, SessionState, StoredMessage, ToolCall
from ._stops import stop_reason
from ._transcripts import Wire, copied

__all__ = ["Run", "Session", "Usage", "advance", "commit_or_raise", "still_ours"]


class _Unread:
    def __repr__(self) -> str:
        return "<copied when first read>"


_UNREAD: Any = _Unread()
"""``Run(messages=)`` not given: made from ``Run._transcript`` when first read."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True, kw_only=True)
class Run:
    """Where a session stands after ``Agent.run``.

    ``status`` says whether it finished (``completed``), needs a person (``needs_attention``,
    ``awaiting_approval``) or stopped (``max_turns``); ``reason`` says why in words.
    ``messages`` is the whole transcript in the API's own message shape, the caller's own copy
    — made when first read, then kept, so a run whose caller never reads it (a worker) does not
    copy a long transcript. ``alerts``: the ledger alerts raised during this run.
    ``effects_after_fork`` lists, for a session made by a fork or a rewind, every call the world
    saw on the paths it left behind that took effect or may have
    (``toolledger.branches._branching``): they are not undone, and unless the branch was made
    with ``effects_after_fork="ignore"`` the model was told of them.
    """

    session_id: str
    status: RunStatus
    reason: str | None
    turns: int
    usage: Usage
    messages: list[dict[str, Any]] = field(default=_UNREAD)
    final_text: str = ""
    alerts: tuple[LedgerWriteError, ...] = field(default=())
    effects_after_fork: tuple[ForkedEffect, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.__dict__.get("messages") is _UNREAD:
            del self.__dict__["messages"]  # read through ``_CopiedWhenRead``

    @classmethod
    def _copied_when_read(cls, transcript: tuple[dict[str, Any], ...], **fields: Any) -> Run:
        """A run whose ``messages`` are ``transcript``, copied when first read (toolledger's
        own: ``transcript`` is not a field, so ``asdict`` and ``replace`` see ``messages``)."""
        run = cls(**fields)
        run.__dict__["_transcript"] = transcript
        return run


class _CopiedWhenRead:
    """``Run.messages`` when a run did not give it: ``Run._transcript`` copied the first time it
    is read, then kept in the instance (this descriptor defines no ``__set__``: what the instance
    holds is read before it). The transcript's contents are shared with what the agent keeps
    for the session's next run, so the caller gets a deep copy (``copied``), once."""

    _lock = threading.Lock()

    def __get__(self, run: Run | None, owner: type[Run] | None = None) -> Any:
        if run is None:
            return _UNREAD
        with self._lock:  # two threads reading it first get one copy
            held = run.__dict__
            made = held.get("messages")
            if made is None:
                made = copied(list(held.pop("_transcript", ())))
                held["messages"] = made  # frozen: the instance's own dict, once
            return made


setattr(Run, "messages", _CopiedWhenRead())  # noqa: B010 - after the dataclass took its default


@dataclass(slots=True)
class Session:
    """The loop's view of one session: its state and transcript, as last committed, the
    calls its last message asks for when they are already known (read once per turn), and the
    request's messages built for the transcript so far (extended, not rebuilt, by the next
    request: ``toolledger.agent._transcripts``)."""

    state: SessionState
    messages: list[StoredMessage]
    calls: list[ToolCall] | None = None
    wire: Wire | None = None


def advance(
    state: SessionState,
    now: float,
    *,
    status: RunStatus,
    reason: str | None,
    messages: int = 0,
    turns: int = 0,
    input_tokens: int = 0,
    output_tokens: int = 0,
) -> SessionState:
    """The next version of ``state``: counters added, ``updated_at`` at ``now``. (Built field
    by field, every field named: ``dataclasses.replace`` walks the class's fields at each call,
    twice a turn.)"""
    return SessionState(
        session_id=state.session_id,
        status=status,
        reason=reason,
        version=state.version + 1,
        turns=state.turns + turns,
        input_tokens=state.input_tokens + input_tokens,
        output_tokens=state.output_tokens + output_tokens,
        messages=state.messages + messages,
        created_at=state.created_at,
        updated_at=now,
        lineage=state.lineage,
    )


def still_ours(sid: str, lease: Lease) -> Generator[Request, Any, None]:
    """The session's state and its ledger are read one after the other, not as one
    snapshot: a take-over between the two reads makes them disagree. That is this worker's
    lease lost, not a damaged store."""
    current: Lease | None = yield ReadLease()
    if current is None or current.token != lease.token:
        raise lost(sid, lease.token)


def commit_or_raise(ops: list[Op]) -> Generator[Request, Any, list[bool]]:
    answer = yield from commit(ops)
    if isinstance(answer, Failure):
        raise answer.exc
    applied: list[bool] = answer
    return applied


def turn_start(
    provider: Provider, s: Session, turn: ModelTurn, now: float, wire: Wire | None
) -> tuple[Session, list[Op]]:
    """Checkpoint A of a new turn: the session with the model's answer (``wire``: the request
    that asked for it, kept for the next one), and the writes that commit it (the assistant
    message, the turn's counters) before any of its calls runs."""
    # Content the API can take back: no lone surrogate (escaped in its JSON), no input nested
    # deeper than anything can store (a call with one is then answered with an error). Our own
    # adapters made it so while reading the response (``stored_as_is``).
    content = turn.content if turn.stored_as_is else valid_unicode(shallow(turn.content))
    message = StoredMessage(seq=len(s.messages), role="assistant", content=content, created_at=now)
    if content is not turn.content:
        # Text the API cannot take back (a lone surrogate, escaped in its JSON): stored and run
        # as U+FFFD, so every later request can carry it.
        turn = replace(turn, content=content, calls=provider.tool_calls(message))
    new = advance(
        s.state,
        now,
        status=RunStatus.RUNNING if turn.calls else RunStatus.COMPLETED,
        reason=None,
        messages=1,
        turns=1,
        input_tokens=turn.input_tokens,
        output_tokens=turn.output_tokens,
    )
    after = Session(new, [*s.messages, message], calls=turn.calls, wire=wire)
    put = PutSession(new, s.state.version, counters_only=_goes_on(s.state, new))
    return after, [AppendMessages((message,)), put]


def turn_end(
    provider: Provider, s: Session, outcomes: list[CallOutcome], now: float, url: str
) -> tuple[Session, list[Op]]:
    """Checkpoint B of the turn ``s`` ends with: the session after it and the writes that commit
    it with the batch's last outcome — the results message, or a stop (``needs_attention``) when
    a call cannot be answered."""
    stop = stop_reason(outcomes, s.state.session_id, url)
    if stop is not None:
        new = advance(s.state, now, status=stop[0], reason=stop[1])
        return Session(new, s.messages, wire=s.wire), [PutSession(new, s.state.version)]
    produced = provider.results_messages(
        [(o.call.tool_use_id, o.content, o.is_error) for o in outcomes]
    )
    results = tuple(
        StoredMessage(seq=len(s.messages) + i, role=role, content=content, created_at=now)
        for i, (role, content) in enumerate(produced)
    )
    new = advance(s.state, now, status=RunStatus.RUNNING, reason=None, messages=len(results))
    after = Session(new, [*s.messages, *results], wire=s.wire)
    counted = len(results) == 1 and _goes_on(s.state, new)
    return after, [AppendMessages(results), PutSession(new, s.state.version, counters_only=counted)]


def _goes_on(old: SessionState, new: SessionState) -> bool:
    """Whether a checkpoint from ``old`` to ``new`` moves only the session's counters
    (``PutSession.counters_only``): a running session that stays running, nothing said."""
    return (
        old.status is RunStatus.RUNNING
        and new.status is RunStatus.RUNNING
        and old.reason is None
        and new.reason is None
    )


def run_of(provider: Provider, s: Session, alerts: list[LedgerWriteError]) -> Run:
    """What a run returns: the session as it stands, its last answer, its alerts."""
    state = s.state
    final = next(
        (provider.final_text(m) for m in reversed(s.messages) if m.role == "assistant"), ""
    )
    return Run._copied_when_read(
        # Copied when read: the messages are kept for the session's next run, and the caller's.
        tuple(provider.transcript(s.messages)),
        session_id=state.session_id,
        status=state.status,
        reason=state.reason,
        turns=state.turns,
        usage=Usage(input_tokens=state.input_tokens, output_tokens=state.output_tokens),
        final_text=final,
        alerts=tuple(alerts),
        effects_after_fork=effects_of(state.lineage),
    )
