"""The approval gate: who may say yes to a high-impact call, and how they are asked.

An approver is any callable ``approve(request) -> bool | Decision`` (or an ``async def``). It is
asked only after the ledger gate: a call already recorded never asks again (docs/design.md, rule 1).

Built in:

* ``terminal`` — asks on the terminal, showing the tool, its input and whether it is in doubt;
* ``queue`` — persists the request in the store and answers "pending": an agent run stops with
  ``awaiting_approval``; a person decides with ``toolledger approve|deny`` (or ``decide``), and the
  next run proceeds. A decision is bound to (tool_use_id, tool, input hash, whether the call is
  in doubt); an approval is used up by the attempt it allows, in the same commit as its intent,
  so it allows exactly one; a denial stands.

This package holds them (``_queue``, ``_terminal``) and the notifications that tell a person
a call waits for them (``_notify``, public as ``toolledger.notify``); the engine itself knows only
the question and the answer (``toolledger.engine._gate``).
"""

from __future__ import annotations

from ..engine._gate import PENDING, ApprovalRequest, Approver, Decision
from ._queue import ApprovalQueue, decide, pending, queue
from ._terminal import terminal

__all__ = [
    "PENDING",
    "ApprovalQueue",
    "ApprovalRequest",
    "Approver",
    "Decision",
    "decide",
    "pending",
    "queue",
    "terminal",
]
