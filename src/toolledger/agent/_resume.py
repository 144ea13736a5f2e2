"""``resume_all``: what an operator runs after a fleet restarts.

Every unfinished agent session of the agent's store — ``running`` (interrupted), ``failed`` (the
model API failed), ``needs_attention`` and ``awaiting_approval`` (which go on if a person has
settled them since) — whose lease is free (never taken, given back, expired, or held by a
process of this host that no longer exists) is run again with ``agent.run(session=...)``, on
``workers`` threads. A session another worker takes meanwhile is skipped, not fought over: the
lease decides.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .._liveness import Over
from ..engine._leases import watching
from ..errors import EffectInProgressError, SessionBusyError, ToolLedgerError
from ..records import RunStatus
from ._agent import Agent, Run

__all__ = ["RESUMABLE", "Resumed", "resume_all"]

RESUMABLE = frozenset(
    {
        RunStatus.RUNNING,
        RunStatus.FAILED,
        RunStatus.NEEDS_ATTENTION,
        RunStatus.AWAITING_APPROVAL,
    }
)


@dataclass(frozen=True, slots=True)
class Resumed:
    """What happened to one session: its ``run``, or why it was skipped or failed."""

    session_id: str
    run: Run | None = None
    skipped: str | None = None
    error: ToolLedgerError | None = None


def resumable(agent: Agent) -> list[str]:
    """The sessions ``resume_all`` would run now, oldest update first: unfinished, and whose
    lease is free — or held by a worker that can only be judged by watching its renewals, which
    ``Agent.run`` does (it takes the session if no renewal comes for a whole TTL)."""
    store = agent.store
    states = sorted(store.session_states(), key=lambda s: s.updated_at)
    out = []
    for s in states:
        if s.status not in RESUMABLE:
            continue
        state = store.lease_state(store.lease(s.session_id))
        if isinstance(state, Over) or watching(state) is not None:
            out.append(s.session_id)
    return out


def resume_all(agent: Agent, *, workers: int = 1) -> list[Resumed]:
    """Resume every unfinished session whose lease is free; one ``Resumed`` per session.

    Errors of one session (a model API failure, a busy lease) are reported in its ``Resumed``
    and do not stop the others.
    """
    if workers < 1:
        raise ValueError("workers must be at least 1")

    def one(session_id: str) -> Resumed:
        try:
            return Resumed(session_id, run=agent.run(session=session_id))
        except SessionBusyError as exc:
            return Resumed(session_id, skipped=f"taken by {exc.owner}")
        except EffectInProgressError as exc:
            return Resumed(session_id, skipped=f"a call is still in progress: {exc.message}")
        except ToolLedgerError as exc:
            return Resumed(session_id, error=exc)

    sessions = resumable(agent)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="toolledger-resume") as pool:
        return list(pool.map(one, sessions))
