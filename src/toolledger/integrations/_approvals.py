"""How an integration asks the user's ``approve=`` what its framework's own approval does not
cover (a call in doubt, a high-impact call the framework did not ask about)."""

from __future__ import annotations

from functools import partial
from typing import Any

from ..engine._drivers import _acall, _is_async
from ..engine._gate import ApprovalRequest, Decision, normalise

__all__ = ["ask"]


async def ask(approve: Any, request: ApprovalRequest) -> Decision:
    """``approve``'s answer to ``request``, asked as ``tl.arun_tool_uses`` asks its approver: a
    sync one in a worker thread (a person at a prompt does not stall the run's other calls), and
    the answer recorded as ``approve``'s — not as the integration's bridge that passed it on.
    Raises ``TypeError`` for an answer that is neither a bool nor a ``Decision``."""
    answer = await _acall(partial(approve, request), _is_async(approve))
    # in_doubt is left to the engine, which warns of a plain yes to a re-run once, by this name
    return normalise(answer, approve)
