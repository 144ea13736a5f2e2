"""Opening a session for a run: created with its first prompt, read back (only what is new,
when this agent kept it from its last run), checked against its ledger, and a new prompt
appended to a finished one; and keeping it, as committed, for the next run."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from ..adapters import Provider
from ..codec import valid_unicode
from ..engine._drivers import ReadEffectIds, ReadEffects, ReadMessages, ReadSession, Request
from ..errors import ConfigurationError
from ..ops import AppendMessages, PutSession
from ..records import EffectRecord, Lease, RunStatus, SessionState, StoredMessage
from ..stores.store import Store
from ._state import Session, advance, commit_or_raise, still_ours
from ._stops import behind
from ._transcripts import Kept, Transcripts

__all__ = ["keep", "last_prompt", "open_session"]


def open_session(
    provider: Provider,
    store: Store,
    transcripts: Transcripts,
    *,
    sid: str,
    prompt: str | None,
    lease: Lease,
) -> Generator[Request, Any, tuple[Session, frozenset[str]] | None]:
    """Load the session, creating it or appending ``prompt`` as the rules say, with the call
    ids its transcript holds. ``None``: there is nothing to do (a completed session, asked
    its own last prompt again)."""
    prompt = valid_unicode(prompt)
    state: SessionState | None = yield ReadSession()
    store.note_lineage(sid, state.lineage if state is not None else ())
    # Only the ids: a record the transcript does not ask for is a checkpoint behind its
    # ledger; what the records say is read when their calls are run.
    recorded: list[str] = yield ReadEffectIds()
    now = store.clock()
    if state is None:
        stray = yield from _own(sorted(recorded))
        if stray:
            yield from still_ours(sid, lease)
            raise behind(sid, stray, "it has no checkpoint at all", url=store.url)
        if prompt is None:
            raise ConfigurationError(f"session {sid!r} does not exist; give a prompt to start it")
        role, content = provider.prompt_message(prompt)
        first = StoredMessage(seq=0, role=role, content=content, created_at=now)
        state = SessionState(
            session_id=sid,
            status=RunStatus.RUNNING,
            version=1,
            messages=1,
            created_at=now,
            updated_at=now,
        )
        yield from commit_or_raise([PutSession(state, None), AppendMessages((first,))])
        return Session(state, [first]), frozenset()
    s, called = yield from _transcript(provider, store, transcripts, sid, state)
    if recorded:
        stray = yield from _own(sorted(set(recorded) - called - state.abandoned_calls()))
        if stray:
            yield from still_ours(sid, lease)
            raise behind(sid, stray, "its transcript does not hold the turns", url=store.url)
    if prompt is None or prompt == last_prompt(provider, s):
        if state.status is RunStatus.COMPLETED:
            return None
        return s, called
    if not state.status.finished:
        why = state.reason or "it was interrupted"
        raise ConfigurationError(
            f"session {sid!r} is unfinished ({state.status.value}: {why}). Resume it first "
            "— agent.run(session=...) with no prompt or its own prompt — then send the new "
            "prompt."
        )
    role, content = provider.prompt_message(prompt)
    message = StoredMessage(seq=len(s.messages), role=role, content=content, created_at=now)
    new = advance(s.state, store.clock(), status=RunStatus.RUNNING, reason=None, messages=1)
    yield from commit_or_raise([AppendMessages((message,)), PutSession(new, state.version)])
    return Session(new, [*s.messages, message], wire=s.wire), called


def _transcript(
    provider: Provider, store: Store, transcripts: Transcripts, sid: str, state: SessionState
) -> Generator[Request, Any, tuple[Session, frozenset[str]]]:
    """The stored transcript of ``state`` and the call ids it holds: what this agent kept of
    the session, with only the messages appended since read (``Transcripts.reuse``), or
    else read whole."""
    kept = transcripts.get(sid) if store.redact is None else None
    since = None if kept is None else Transcripts.reuse(kept, state)
    if kept is not None and since is not None:
        read: list[StoredMessage] = (
            [] if since == len(kept.messages) else (yield ReadMessages(since))
        )
        added = read[1:]
        if (
            Transcripts.continues(kept, since, read)
            and len(kept.messages) + len(added) == state.messages
        ):
            called = kept.called.union(i for m in added for i in provider.call_ids(m))
            return Session(state, [*kept.messages, *added], wire=kept.wire), called
    transcripts.drop(sid)
    messages: list[StoredMessage] = yield ReadMessages(0)
    called = frozenset(i for m in messages for i in provider.call_ids(m))
    return Session(state, messages), called


def keep(
    provider: Provider,
    store: Store,
    transcripts: Transcripts,
    s: Session,
    *,
    called: frozenset[str],
    first: int,
) -> None:
    """Keep ``s`` (as committed) for this agent's next run of the session; ``called``: the
    call ids of its first ``first`` messages. Not with a ``redact`` hook: the store holds
    other text than the run's messages."""
    if store.redact is not None or s.state.messages != len(s.messages):
        return
    added = s.messages[first:]
    called = called.union(i for m in added for i in provider.call_ids(m))
    kept = Kept(state=s.state, messages=tuple(s.messages), called=called, wire=s.wire)
    transcripts.put(s.state.session_id, kept)


def _own(ids: list[str]) -> Generator[Request, Any, list[str]]:
    """Which of ``ids`` — records no turn of the transcript asked for — are the session's own:
    a branch holds its lineage's calls, made in other transcripts, and a lineage's first
    session holds its branches' claims (``toolledger.engine._claims``); only a record of its
    own that no turn asked for is a checkpoint behind its ledger."""
    if not ids:
        return []
    records: dict[str, EffectRecord] = yield ReadEffects(ids)
    return [i for i in ids if i not in records or not records[i].copied]


def last_prompt(provider: Provider, s: Session) -> str | None:
    for m in reversed(s.messages):
        text = provider.prompt_text(m)
        if text is not None:
            return text
    return None
