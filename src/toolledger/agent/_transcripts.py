"""What an ``Agent`` keeps of a transcript between model calls and between runs.

* ``Wire`` — the request's messages built for a transcript's first messages. The next request
  extends it with the messages added since instead of building every message again: a turn's
  cost does not grow with the session. A wire knows the messages it was built for (their number
  and the last one, by identity), so it is used only for a transcript that begins with them.
* ``Transcripts`` — the last sessions an ``Agent`` ran (a few, least recently used first out):
  the state it committed last, its messages, the call ids they hold and their wire. Opening one
  of them again reads only what was appended since, and only after checking the store's state
  continues the kept one (see ``Transcripts.reuse``); anything else reads the whole transcript.

Every message the store holds was appended with a ``PutSession`` that moved the session's
version on, in one transaction (``Agent``, ``fork`` and ``rewind`` are the writers of
transcripts), and a transcript only grows — except by a rewind, which takes its tail out (into
an abandoned branch) and may then write other messages at the same seqs. So a kept transcript
whose session state is read back unchanged is the stored one, and one whose state moved on may be
its prefix — checked against the store by reading the kept last message again, by value, with
the ones after it: after a rewind that cut into the kept messages, that message is gone or
another one, and the whole transcript is read.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..adapters import Provider
from ..records import SessionState, StoredMessage

__all__ = ["Kept", "Transcripts", "Wire", "copied", "wire_for"]


@dataclass(frozen=True, slots=True)
class Wire:
    """``items``: ``provider.wire`` of a transcript's first ``count`` messages, ``last`` being
    the last of them (the very object)."""

    count: int
    last: StoredMessage | None
    items: tuple[dict[str, Any], ...]

    def fits(self, messages: Sequence[StoredMessage]) -> bool:
        """Whether ``messages`` begins with the messages this wire was built for."""
        return (
            0 < self.count <= len(messages) and messages[self.count - 1] is self.last
        ) or self.count == 0


def wire_for(
    provider: Provider, messages: Sequence[StoredMessage], known: Wire | None
) -> tuple[list[dict[str, Any]], Wire]:
    """The request's messages for ``messages`` (a new list, for the API to keep), extending
    ``known`` when it fits, and the ``Wire`` to extend next time."""
    if known is not None and known.fits(messages):
        sent = provider.wire(messages[known.count :], known.items)
    else:
        sent = provider.wire(messages)
    return sent, Wire(len(messages), messages[-1] if messages else None, tuple(sent))


@dataclass(frozen=True, slots=True)
class Kept:
    """A session as its last run left it: ``state`` as committed, its ``messages``, the call ids
    they hold (what the stray-record check compares the ledger with) and their wire."""

    state: SessionState
    messages: tuple[StoredMessage, ...]
    called: frozenset[str]
    wire: Wire | None


class Transcripts:
    """The last ``size`` sessions of one ``Agent``; safe to share between its threads."""

    def __init__(self, size: int = 4) -> None:
        self._size = size
        self._kept: OrderedDict[str, Kept] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, session_id: str) -> Kept | None:
        with self._lock:
            kept = self._kept.get(session_id)
            if kept is not None:
                self._kept.move_to_end(session_id)
            return kept

    def put(self, session_id: str, kept: Kept) -> None:
        with self._lock:
            self._kept[session_id] = kept
            self._kept.move_to_end(session_id)
            while len(self._kept) > self._size:
                self._kept.popitem(last=False)

    def drop(self, session_id: str) -> None:
        with self._lock:
            self._kept.pop(session_id, None)

    @staticmethod
    def reuse(kept: Kept, state: SessionState) -> int | None:
        """Where to read ``state``'s transcript from, given ``kept``: ``len(kept.messages)``
        when the kept transcript is the whole stored one (the state read back is the one kept),
        the kept last message's seq when the stored one may continue it (read from there, and
        ``continues`` checks it does), ``None`` when it cannot be the same session's prefix."""
        n = len(kept.messages)
        if state == kept.state:
            return n
        same_session = (
            state.created_at == kept.state.created_at
            and state.version > kept.state.version
            and state.messages >= n > 0
        )
        return n - 1 if same_session else None

    @staticmethod
    def continues(kept: Kept, since: int, read: list[StoredMessage]) -> bool:
        """Whether ``read`` (the stored messages from seq ``since``) continues ``kept``: the
        kept last message read back as it was kept, then the ones after it in order."""
        if since == len(kept.messages):
            return True
        return (
            bool(read)
            and read[0] == kept.messages[-1]
            and all(m.seq == since + i for i, m in enumerate(read))
        )


_ATOMS = frozenset({str, int, float, bool, type(None)})


def copied(value: Any) -> Any:
    """A copy of plain JSON (dicts and lists copied all the way down, tuples made lists), so what
    a caller is handed shares nothing mutable with what a ``Transcripts`` keeps. A value of a
    plain JSON type is placed as it is, without a call for it: most of a transcript is strings
    (docs/performance.md has what that saves). Content is stored nested no deeper than
    ``codec.MAX_NESTING``: the recursion is bounded far below Python's limit."""
    kind = type(value)
    if kind is dict:
        return {k: v if type(v) in _ATOMS else copied(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [v if type(v) in _ATOMS else copied(v) for v in value]
    if isinstance(value, dict):  # a subclass: copied as a plain one
        return {k: copied(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [copied(v) for v in value]
    return value
