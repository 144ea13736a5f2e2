"""What a tool may know about the call it is serving: ``ToolContext``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .._constructors import install, slot_setters

__all__ = ["ToolContext"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolContext:
    """What a tool may know about the call it is serving.

    ``idempotency_key`` is stable for one call on every process and machine, and different for
    every other call: forward it downstream so a repeat can be dropped there. One call is one
    ``tool_use_id`` in one lineage — a session and the branches forked or rewound from it
    (docs/concepts/branches.md): a branch's call of an id its lineage made forwards the key it
    was made with, and a key-forwarding call a branch makes first forwards the key of its
    lineage's first session. ``in_doubt`` is true when an earlier attempt of this very call may
    have taken effect (the process died while it ran); ``attempt`` counts executions begun, this
    one included.
    """

    session_id: str
    tool_use_id: str
    idempotency_key: str
    in_doubt: bool = False
    attempt: int = 1
    deadline: float | None = None
    """When this attempt should be done, in epoch seconds on this worker's clock (``time.time``
    unless the store was given another): the tool's ``timeout`` after it started. Past it,
    another worker may judge the attempt over — pass what is left (``remaining()``) to your own
    client's timeout."""
    expires: float | None = field(default=None, compare=False)
    """The same moment on this process's monotonic clock (``time.monotonic``), which no step
    of the wall clock moves: what ``remaining()`` counts down to."""

    def remaining(self) -> float | None:
        """Seconds left before the attempt's deadline (never negative); ``None`` without one.
        Counted on the monotonic clock when the context knows it (``expires``), so a wall
        clock stepped back never gives a tool more time than its ``timeout``."""
        if self.expires is not None:
            return max(0.0, self.expires - time.monotonic())
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.time())


# Written out (``toolledger._constructors``): every call builds one.
_SETTERS = slot_setters(ToolContext)


def _tool_context_init(
    self: ToolContext,
    *,
    session_id: str,
    tool_use_id: str,
    idempotency_key: str,
    in_doubt: bool = False,
    attempt: int = 1,
    deadline: float | None = None,
    expires: float | None = None,
) -> None:
    s = _SETTERS  # in field order
    s[0](self, session_id)
    s[1](self, tool_use_id)
    s[2](self, idempotency_key)
    s[3](self, in_doubt)
    s[4](self, attempt)
    s[5](self, deadline)
    s[6](self, expires)


install(ToolContext, _tool_context_init)
