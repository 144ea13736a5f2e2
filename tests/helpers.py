"""Backend wrappers for tests: count commits, fail chosen ones, race a second worker."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import toolledger as tl
from toolledger.errors import StoreUnavailableError
from toolledger.ops import InsertEffect, Op, UpdateEffect
from toolledger.records import EffectRecord, Status
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
