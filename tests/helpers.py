"""Backend wrappers for tests: count commits, fail chosen ones, race a second worker; a live
worker elsewhere holding a session."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import toolledger as tl
from toolledger.errors import StoreUnavailableError
from toolledger.ops import DropLease, HoldLease, InsertEffect, Op, TakeLease, UpdateEffect
from toolledger.records import EffectRecord, Holder, Lease, Status
from toolledger.stores.contract import Backend


class SpyBackend:
    """Wraps a real backend; records every commit and can fail the ones ``fail_when`` picks."""

    def __init__(
        self, inner: Backend, fail_when: Callable[[Sequence[Op]], bool] | None = None
    ) -> None:
        self.inner = inner
        self.url = inner.url
        self.durable = inner.durable
        self.commits: list[list[Op]] = []
        self.fail_when = fail_when
        self.before_commit: Callable[[Sequence[Op]], None] | None = None

    def read_effects(
        self, session_id: str, tool_use_ids: Sequence[str] | None = None
    ) -> dict[str, EffectRecord]:
        return self.inner.read_effects(session_id, tool_use_ids)

    def apply(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        if self.before_commit is not None:
            self.before_commit(ops)
        if self.fail_when is not None and self.fail_when(ops):
            raise StoreUnavailableError("injected: disk I/O error", url=self.url)
        self.commits.append(list(ops))
        return self.inner.apply(session_id, ops)

    def __getattr__(self, name: str) -> object:
        # read_session, read_messages, list_sessions, … pass straight through.
        return getattr(self.inner, name)

    def session_ids(self) -> list[str]:
        return self.inner.session_ids()

    def close(self) -> None:
        self.inner.close()


def spy_store(store: tl.Store, **kwargs: object) -> tuple[tl.Store, SpyBackend]:
    spy = SpyBackend(store.backend, **kwargs)  # type: ignore[arg-type]
    return tl.Store(spy, clock=store.clock, worker_id=store.worker_id), spy


def writes_status(status: Status) -> Callable[[Sequence[Op]], bool]:
    """Fail commits that write an effect record with ``status``."""
    return lambda ops: any(
        isinstance(op, (InsertEffect, UpdateEffect)) and op.record.status is status for op in ops
    )


@contextlib.contextmanager
def held_elsewhere(
    store: tl.Store,
    session_id: str,
    *,
    ttl: float,
    every: float,
    token: int = 1,
    expect_token: int = 0,
    gives_back_after: float | None = None,
) -> Iterator[Lease]:
    """A live worker on another host holds ``session_id``: it takes the lease (``token``, over
    ``expect_token``), renews it every ``every`` seconds on the store's clock and — after
    ``gives_back_after`` seconds, if given — gives it back. Stopped when the block ends."""
    lease = Lease(
        session_id=session_id,
        owner="other-host:1:x",
        token=token,
        expires_at=store.now() + ttl,
        holder=Holder(host="other-host", pidns="1", pid=1, start=1),
        ttl=ttl,
    )
    store.backend.apply(session_id, [TakeLease(lease, expect_token=expect_token)])
    stop = threading.Event()
    began = time.monotonic()

    def renew() -> None:
        while not stop.wait(every):
            if gives_back_after is not None and time.monotonic() - began >= gives_back_after:
                store.backend.apply(session_id, [DropLease(session_id, token)])
                return
            store.backend.apply(session_id, [HoldLease(session_id, token, store.now() + ttl)])

    renewer = threading.Thread(target=renew, daemon=True)
    renewer.start()
    try:
        yield lease
    finally:
        stop.set()
        renewer.join()
