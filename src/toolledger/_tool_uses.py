"""``run_tool_uses`` / ``arun_tool_uses``: the ledger gate, the approval gate, then the tool —
the engine's batch of calls (``toolledger.engine._runner``) driven synchronously or on an event
loop, with the calls left in doubt told to whoever should know (``toolledger.notify``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .adapters import ResultShape, read_calls
from .approvals._notify import Notifier, Target, in_doubt_calls, notifier
from .engine._drivers import AlertHook, IOContext, adrive, refuse_async_in_loop
from .engine._outcomes import Batch, CallOutcome
from .engine._runner import process_batch, run_batch
from .errors import ConfigurationError
from .records import ToolCall
from .stores.store import Ledger
from .tools import ToolSet

__all__ = ["arun_calls", "arun_tool_uses", "run_tool_uses"]

_NUMBERS = (int, float)  # a tuple: ``int | float`` is built at every call


def _start(
    content: Any,
    tools: ToolSet | Sequence[Any],
    ledger: Ledger,
    *,
    approve: Any,
    on_alert: AlertHook | None,
    wait: float,
    sync: bool,
) -> tuple[list[ToolCall], ToolSet, IOContext, ResultShape]:
    """What both entry points do before running the batch: check the arguments, read the
    calls."""
    if not isinstance(ledger, Ledger):
        raise ConfigurationError(
            f"ledger= must be a toolledger Ledger (store.ledger(session_id)), not "
            f"{type(ledger).__name__}"
        )
    if isinstance(wait, bool) or not isinstance(wait, _NUMBERS) or not 0 <= wait < 1e9:
        raise ConfigurationError(f"wait= must be a number of seconds >= 0, not {wait!r}")
    toolset = tools if isinstance(tools, ToolSet) else ToolSet(tools)
    calls, shape = read_calls(content)
    if sync:
        named = [toolset.get(name) for name in {c.name for c in calls}]
        refuse_async_in_loop([t for t in named if t is not None], "run_tool_uses")
    io = IOContext(
        store=ledger.store, session_id=ledger.session_id, approve=approve, on_alert=on_alert
    )
    return calls, toolset, io, shape


def _results(batch: Batch, shape: ResultShape, raise_alerts: bool) -> list[dict[str, Any]]:
    if raise_alerts and batch.alerts:
        raise batch.alerts[0]  # every one went to the logger and on_alert already
    return batch.results(shape)


def run_tool_uses(
    content: Any,
    tools: ToolSet | Sequence[Any],
    *,
    ledger: Ledger,
    approve: Any = None,
    on_alert: AlertHook | None = None,
    wait: float = 0.0,
    raise_alerts: bool = False,
    on_in_doubt: Notifier | Target | None = None,
) -> list[dict[str, Any]]:
    """Run the ``tool_use`` blocks of ``content`` through the ledger; return their
    ``tool_result`` blocks, in order, ready to send as the next user message.

    For each call (docs/design.md, rules 1-7, 12-13): a finished record answers it without running
    anything or asking anyone; a high-impact call asks ``approve``; the intent is durable before
    a call whose re-run is unsafe runs, and the outcome the instant it returns. A call found in
    doubt is re-run only when that is safe, settled by the tool's ``check``, or put to the
    approver; otherwise it answers ``is_error`` and stays in doubt for a person.

    Raises ``LedgerMismatchError`` (before running anything) when an id is recorded with another
    tool or input, ``MalformedContentError`` for content it cannot read, and
    ``EffectInProgressError`` when another attempt at a call may still be running — another
    thread or task of this process, a live process of this host, or a worker elsewhere whose
    lease is held or whose deadline has not passed. ``wait`` is how many seconds to wait for
    such an attempt to finish (its stored result is then returned) before raising. A failed
    ledger write after a tool succeeded is *not* raised: the real result is returned and the
    alert (a ``LedgerWriteError``) goes to the ``toolledger`` logger and ``on_alert``. With
    ``raise_alerts=True`` the batch's first alert is raised instead, once every call is over
    and every write made (for a caller that would rather stop than go on past one): its
    ``result`` is what the model would have received, and calling again with the same content
    answers the other calls from the ledger. ``on_in_doubt`` is told of each call left in doubt
    (a callable, a webhook URL or a ``toolledger.notify.Notifier`` — pass one ``Notifier`` to
    every call so that a call is told once; see ``toolledger.notify``).
    """
    notify = notifier(on_in_doubt)
    calls, toolset, io, shape = _start(
        content, tools, ledger, approve=approve, on_alert=on_alert, wait=wait, sync=True
    )
    batch = run_batch(calls, toolset, ledger, io, can_ask=approve is not None, wait=wait)
    in_doubt_calls(notify, ledger.session_id, batch.outcomes)
    return _results(batch, shape, raise_alerts)


async def arun_tool_uses(
    content: Any,
    tools: ToolSet | Sequence[Any],
    *,
    ledger: Ledger,
    approve: Any = None,
    on_alert: AlertHook | None = None,
    wait: float = 0.0,
    raise_alerts: bool = False,
    on_in_doubt: Notifier | Target | None = None,
) -> list[dict[str, Any]]:
    """The async twin of ``run_tool_uses``: same rules, same results. ``async def`` tools,
    checks and approvers are awaited (an ``async def`` tool is cancelled at its deadline and left
    in doubt); plain ones run in a worker thread."""
    batch, shape = await _abatch(
        content, tools, ledger, approve=approve, on_alert=on_alert, wait=wait, told=on_in_doubt
    )
    return _results(batch, shape, raise_alerts)


async def arun_calls(
    content: Any,
    tools: ToolSet | Sequence[Any],
    *,
    ledger: Ledger,
    approve: Any = None,
    on_alert: AlertHook | None = None,
    wait: float = 0.0,
    on_in_doubt: Notifier | Target | None = None,
) -> list[CallOutcome]:
    """``arun_tool_uses`` answering each call's ``CallOutcome`` rather than its ``tool_result``:
    its content and ``is_error``, and what happened to it (its disposition) — for a framework
    that tells a model a call in doubt or declined otherwise than a call it may retry."""
    batch, _ = await _abatch(
        content, tools, ledger, approve=approve, on_alert=on_alert, wait=wait, told=on_in_doubt
    )
    return batch.outcomes


async def _abatch(
    content: Any,
    tools: ToolSet | Sequence[Any],
    ledger: Ledger,
    *,
    approve: Any,
    on_alert: AlertHook | None,
    wait: float,
    told: Notifier | Target | None,
) -> tuple[Batch, ResultShape]:
    notify = notifier(told)
    calls, toolset, io, shape = _start(
        content, tools, ledger, approve=approve, on_alert=on_alert, wait=wait, sync=False
    )
    gen = process_batch(calls, toolset, ledger, can_ask=approve is not None, wait=wait)
    batch = await adrive(gen, io)
    in_doubt_calls(notify, ledger.session_id, batch.outcomes)
    return batch, shape
