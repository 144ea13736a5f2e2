"""Named crash points: ``TOOLLEDGER_CRASH_AT=<point>[:<n>]`` makes this process ``SIGKILL``
itself the n-th time (default: first) it reaches ``point``. For crash tests; costs two
comparisons when unset.

Points, in the order a turn reaches them:

* ``after_checkpoint_a`` — the model's message (with its tool_use blocks) is durable;
* ``after_intent`` — a call's ``started`` record is durable; the tool has not run. A turn's one
  call on the straight path (``toolledger.engine._straight``) has its intent in checkpoint A's
  commit: both points are reached at once, in this order;
* ``before_record`` — the tool returned; its outcome is not yet written;
* ``after_record`` — a commit holding a call's outcome is durable;
* ``after_checkpoint_b`` — the tool_result message is durable.

And one only a branch reaches (``BRANCH_POINTS``), before ``after_intent``:

* ``after_claim`` — a branch's claim on a fresh call is durable in its lineage's root; its own
  intent is not written (``toolledger.engine._claims``).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

POINTS = (
    "after_checkpoint_a",
    "after_intent",
    "before_record",
    "after_record",
    "after_checkpoint_b",
)
BRANCH_POINTS = ("after_claim",)

_armed: list[tuple[str, int]] = []  # zero or one entry
_hits: dict[str, int] = {}
watchers: list[Callable[[str], None]] = []
"""Called with every point reached, in this process (tests that act at a point without killing:
a network fault armed there). Whichever module reaches the point — the straight path's or the
general path's — they see it."""


def arm(spec: str | None) -> None:
    """Arm ``point`` or ``point:n``; ``None`` disarms."""
    _hits.clear()
    _armed.clear()
    if not spec:
        return
    point, _, nth = spec.partition(":")
    if point not in POINTS + BRANCH_POINTS:
        raise ValueError(
            f"unknown crash point {point!r}; points: {', '.join(POINTS + BRANCH_POINTS)}"
        )
    _armed.append((point, int(nth) if nth else 1))


def hit(point: str) -> None:
    if watchers:
        for watch in list(watchers):
            watch(point)
    if not _armed or _armed[0][0] != point:
        return
    _hits[point] = _hits.get(point, 0) + 1
    if _hits[point] == _armed[0][1]:
        os.kill(os.getpid(), signal.SIGKILL)


arm(os.environ.get("TOOLLEDGER_CRASH_AT"))
