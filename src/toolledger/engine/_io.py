"""What a run carries while the drivers answer its requests: its store and session, its
approver, alert hook and model, and its lease — the fence its commits go behind, when it last
renewed, given up at the end (``IOContext``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import LedgerWriteError
from ..ops import DropLease, HoldLease, Op
from ..stores.store import Store
from . import _leases as leases
from ._background import keeper
from ._requests import Fence

__all__ = ["AlertHook", "IOContext", "ModelClient", "drop_lease", "give_back_later", "hold"]

logger = logging.getLogger("toolledger")

AlertHook = Callable[[LedgerWriteError], Any]


class ModelClient(Protocol):
    """How the drivers call a model API; the provider adapters implement it."""

    def create(self, kwargs: dict[str, Any]) -> Any: ...

    async def acreate(self, kwargs: dict[str, Any]) -> Any: ...

    def stream(self, kwargs: dict[str, Any], on_text: Callable[[str], object]) -> Any: ...

    async def astream(self, kwargs: dict[str, Any], on_text: Callable[[str], object]) -> Any: ...


@dataclass(slots=True)
class IOContext:
    store: Store
    session_id: str
    approve: Any = None
    on_alert: AlertHook | None = None
    model: ModelClient | None = None
    fence: Fence | None = None
    keeper: Any = None  # the async run's heartbeat task
    busy_since: float | None = None  # monotonic time the run's store operation under way began
    renewed_at: float | None = None
    """When the last renewal of this run's lease that landed was made, on this process's
    monotonic clock (``Runtime.monotonic``); ``None``: the next commit renews."""

    def fenced(self, ops: list[Op], fenced: bool = True) -> list[Op]:
        """``ops`` behind the run's fence. A commit renews the lease only once a third of its
        life has passed since the last renewal (``leases.fence``); a renewal alone (``ops``
        empty: a heartbeat) always renews."""
        fence = self.fence
        if fence is None or not fenced:
            return ops
        renewed = self.renewed_at if ops else None
        clock = self.store.runtime.monotonic
        return [leases.fence(fence.lease, self.store.now, fence.ttl, renewed, clock), *ops]

    def landed(self, ops: list[Op]) -> None:
        """A commit of ``ops`` landed: if its fence renewed the run's lease, remember when."""
        op = ops[0] if ops else None
        fence = self.fence
        if (
            isinstance(op, HoldLease)
            and op.expires_at is not None
            and fence is not None
            and op.token == fence.lease.token
        ):
            self.renewed_at = self.store.runtime.monotonic()

    def unfenced(self, flags: list[bool], fenced: bool = True) -> list[bool]:
        return flags[1:] if self.fence is not None and fenced else flags


def give_back_later(io: IOContext, dropped: list[Op], exc: Exception) -> None:
    """A lease that could not be given back: on this host a live holder keeps its session, so
    it is given back in the background, not left to hold until this process ends."""
    logger.warning(
        "toolledger: giving the lease of %r up failed (%s); retrying in the background",
        io.session_id,
        exc,
    )
    keeper.keep(io.store, io.session_id, dropped, [])


def hold(io: IOContext, fence: Fence) -> None:
    io.fence = fence
    io.renewed_at = io.store.runtime.monotonic()  # taking it was its first renewal
    io.store.runtime.live_runs.add(fence.lease.owner)


def drop_lease(io: IOContext) -> list[Op]:
    if io.fence is None:
        return []
    lease = io.fence.lease
    io.fence = None
    io.store.runtime.live_runs.discard(lease.owner)
    return [DropLease(lease.session_id, lease.token, lease.owner)]
