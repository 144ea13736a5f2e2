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

This module gathers them for users; the runner itself knows only the question and the answer
(``toolledger.gate``), and the terminal prompt lives with the rest of the terminal output in
``toolledger.cli``.
"""

from __future__ import annotations

from .approval_queue import ApprovalQueue, decide, pending, queue
from .cli.prompts import terminal
from .gate import PENDING, ApprovalRequest, Approver, Decision

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
