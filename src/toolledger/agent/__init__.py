"""The durable agent loop: checkpoints before and after tools, resume, orphan repair, streaming,
and resuming every unfinished session (``resume_all``)."""

from __future__ import annotations

from ._agent import Agent, Run, Usage
from ._resume import Resumed, resume_all
from ._streaming import AgentStream

__all__ = ["Agent", "AgentStream", "Resumed", "Run", "Usage", "resume_all"]
