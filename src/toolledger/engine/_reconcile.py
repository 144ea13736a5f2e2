"""A commit whose answer was lost: read it back before going on (docs/design.md, rule 16).

When the connection dies during COMMIT the write may or may not have landed, and both guesses
are dangerous: "it did not" re-runs a call whose intent is in fact durable, or raises a false
alert about an outcome that is recorded; "it did" runs a tool whose intent nobody will ever see.
So the commit is recognised by reading back what it wrote: a transaction is all or nothing, and
every commit carries something only it could have written — an effect record with this worker's
timestamps, a session state at its new version, a lease with its new token. Landed: go on with
the flags the read-back shows. Not landed: send it again (every write is conditional, so a
resend cannot apply twice). Still unknown — the store cannot even be read — the caller gets the
failure, marked ``outcome_unknown``, and must leave nothing half-done.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

from ..errors import StoreError
from ..ops import InsertEffect, Op, PutSession, TakeLease, UpdateEffect
from ..records import EffectRecord, Lease, SessionState, same_write
from ._drivers import Commit, Failure, ReadEffects, ReadLease, ReadSession, Request

__all__ = ["commit"]

ATTEMPTS = 3


def commit(
    ops: list[Op], *, fenced: bool = True, answered: list[bool] | Failure | None = None
) -> Generator[Request, Any, Any]:
    """``yield Commit(ops)``, reconciled: the per-op flags, or a ``Failure`` whose error is not
    an unknown outcome — or is one that could not be resolved (``outcome_unknown`` still set).
    ``answered``: the commit was sent already (``toolledger.engine._straight``), and this is
    its answer."""
    answer: Any = answered if answered is not None else (yield Commit(ops, fenced=fenced))
    for _ in range(ATTEMPTS):
        if not _unknown(answer):
            return answer
        landed = yield from _landed(ops)
        if landed is None:
            return answer  # cannot tell: the caller leaves nothing half-done
        if landed is not False:
            return landed
        answer = yield Commit(ops, fenced=fenced)  # it did not land: send it again
    return answer


def _unknown(answer: Any) -> bool:
    return (
        isinstance(answer, Failure)
        and isinstance(answer.exc, StoreError)
        and answer.exc.outcome_unknown
    )


def _landed(ops: Sequence[Op]) -> Generator[Request, Any, list[bool] | bool | None]:
    """Did the commit of ``ops`` land? Its flags if it did, ``False`` if not, ``None`` if the
    store cannot be read either."""
    effects = [op for op in ops if isinstance(op, InsertEffect | UpdateEffect)]
    sessions = [op for op in ops if isinstance(op, PutSession)]
    takes = [op for op in ops if isinstance(op, TakeLease)]
    try:
        if sessions:
            state: SessionState | None = yield ReadSession()
            if state is None or (state.version, state.updated_at) != (
                sessions[-1].state.version,
                sessions[-1].state.updated_at,
            ):
                return False
        elif takes:
            lease: Lease | None = yield ReadLease()
            if lease is None or (lease.token, lease.owner) != (
                takes[-1].lease.token,
                takes[-1].lease.owner,
            ):
                return False
        found: dict[str, EffectRecord] = {}
        if effects:
            found = yield ReadEffects([op.record.tool_use_id for op in effects])
    except StoreError:
        return None
    flags = [
        same_write(found.get(op.record.tool_use_id), op.record)
        if isinstance(op, InsertEffect | UpdateEffect)
        else True
        for op in ops
    ]
    if (
        not sessions
        and not takes
        and effects
        and not any(
            f
            for op, f in zip(ops, flags, strict=True)
            if isinstance(op, InsertEffect | UpdateEffect)
        )
    ):
        return False  # none of its records is there: the transaction did not land
    return flags
