"""The I/O the runner and the agent need, as requests: what their generators yield.

Each request says what to do, never how: ``toolledger.engine._drivers`` carries it out, with plain
calls
or with ``await``, and sends the answer back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import LedgerWriteError
from ..ops import Op
from ..records import Lease
from ..tools import ToolContext
from ._gate import ApprovalRequest

__all__ = [
    "Alert",
    "Ask",
    "CallModel",
    "CancelledAfterAnswer",
    "Commit",
    "Failure",
    "Fence",
    "Invoke",
    "ReadEffectIds",
    "ReadEffects",
    "ReadLease",
    "ReadLineageRoot",
    "ReadMessages",
    "ReadSession",
    "Remember",
    "Request",
    "Sleep",
]


@dataclass(frozen=True, slots=True)
class ReadEffects:
    """Records of the session (``session``: of another one — the origin of a branch's copy)."""

    tool_use_ids: list[str] | None
    session: str | None = None


@dataclass(frozen=True, slots=True)
class ReadEffectIds:
    """The tool_use ids of every record of the session (not the records)."""


@dataclass(frozen=True, slots=True)
class ReadSession:
    """The session's state (``session``: another one's)."""

    session: str | None = None


@dataclass(frozen=True, slots=True)
class ReadLineageRoot:
    """The session whose ledger claims the calls of the session's lineage
    (``Store.lineage_root``; ``None``: its own)."""


@dataclass(frozen=True, slots=True)
class ReadMessages:
    """The session's transcript from ``seq`` ``since`` on (``session``: another one's)."""

    since: int = 0
    session: str | None = None


@dataclass(frozen=True, slots=True)
class Commit:
    """Commit ops in one transaction; answered with the per-op flags or a ``Failure`` holding a
    ``StoreError`` or ``SessionConflictError``. ``fenced=False`` leaves the run's lease fence
    out: for an attempt's outcome written after a take-over (a compare-and-set on its record
    needs no fence). ``session``: another session's ops (a branch's claim in its lineage's
    root), never behind the run's fence."""

    ops: list[Op]
    fenced: bool = True
    session: str | None = None  # set with ``fenced=False`` only


@dataclass(frozen=True, slots=True)
class Ask:
    request: ApprovalRequest


@dataclass(frozen=True, slots=True)
class Invoke:
    """Call a tool or a check; answered with its value or a ``Failure``. An ``async def`` one is
    cancelled after ``timeout`` seconds, answered with ``Failure(OutcomeUnknown)``; a plain
    function cannot be stopped and runs to its end."""

    fn: Callable[[], Any]
    is_async: bool
    timeout: float | None = None
    ctx: ToolContext | None = None
    """The call it serves (for drivers that watch, not to use): ``None`` for a tool that takes
    no context, which is not made for it (``Tool.takes_context``)."""
    check: bool = False  # the tool's ``check``, not the tool


@dataclass(frozen=True, slots=True)
class Remember:
    """Writes this process must not lose — outcomes of its attempts that a failed commit left
    unwritten: commit them (without the fence) in the background, retrying until they apply or
    are refused, then release the calls in flight (``keys``). Answered at once with ``None``."""

    ops: list[Op]
    keys: list[tuple[str, str, str]]
    moved: Callable[[int], None] | None = None
    """Called in the background with the index of each outcome refused because its record
    moved on meanwhile (a person settled it, another attempt ran): what the run does with an
    outcome refused at once (``toolledger.engine._late``), done then."""


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait ``seconds`` (for another attempt to finish)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Alert:
    alert: LedgerWriteError


@dataclass(frozen=True, slots=True)
class CallModel:
    """Call the model API; answered with the (whole) response or a ``Failure``. ``span``: the
    model call's tracing span (``toolledger.engine._telemetry``), current while the API is
    called."""

    kwargs: dict[str, Any]
    span: Any = None
    on_text: Callable[[str], object] | None = None
    """Stream the reply: given each piece of its text as it arrives (``Provider.stream``)."""


@dataclass(frozen=True, slots=True)
class ReadLease:
    """The session's lease (``session``: another one's)."""

    session: str | None = None


@dataclass(frozen=True, slots=True)
class Fence:
    """From now on every commit carries this lease's fence, a heartbeat renews it, and it is
    given up when the generator ends (see ``toolledger.engine._leases``)."""

    lease: Lease
    ttl: float


@dataclass(frozen=True, slots=True)
class Failure:
    """An exception raised while carrying out a request, handed back to the generator."""

    exc: Exception


class CancelledAfterAnswer(asyncio.CancelledError):
    """The run was cancelled while a tool's plain function ran in its worker thread, and the
    function then answered: ``answer`` is its value, or a ``Failure``. Thrown where the tool was
    invoked, so the attempt's outcome is recorded — it is known — before the cancellation goes
    on up; anywhere else it is the cancellation it is. The async driver lets it out as a plain
    ``CancelledError``: ``asyncio.timeout`` and ``TaskGroup`` (Python 3.11) know that one by its
    exact type, and the tool's answer stays inside."""

    def __init__(self, answer: Any, *args: Any) -> None:
        super().__init__(*args)
        self.answer = answer


Request = (
    ReadEffects
    | ReadEffectIds
    | ReadSession
    | ReadMessages
    | ReadLease
    | ReadLineageRoot
    | Commit
    | Ask
    | Invoke
    | Alert
    | CallModel
    | Fence
    | Sleep
    | Remember
)
