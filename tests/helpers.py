"""Backend wrappers for tests: count commits, fail chosen ones, race a second worker; a live
worker elsewhere holding a session; a worker frozen between its writes."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import toolledger as tl
from toolledger.errors import StoreUnavailableError
from toolledger.ops import DropLease, HoldLease, InsertEffect, Op, TakeLease, UpdateEffect
from toolledger.records import EffectRecord, Holder, Lease, Status
from toolledger.stores.contract import Backend
from toolledger.stores.jsonfile._files import LOCK_FILE


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


def freeze_between_writes(url: str, *, stop: Callable[[], None], go: Callable[[], None]) -> None:
    """Freeze a worker (``stop``: ``SIGSTOP``, returning once it is stopped) at an instant it
    holds none of the store's write locks.

    Its lease keeper, a thread, renews the lease every third of it while its tool runs. Frozen
    in the middle of that commit, the worker would hold the SQLite file's write lock, the json
    store's flock or a PostgreSQL transaction's row locks, and every other writer would wait on
    a process that never goes on: a store outage, not the paused worker a test means. So this
    freezes it, looks, and if a write was under way lets it finish (``go``) and freezes again."""
    for _ in range(500):
        stop()
        if not write_held(url):
            return
        go()
        time.sleep(0.002)
    raise AssertionError(f"the worker held a write of {url} at each of 500 looks")


def write_held(url: str) -> bool:
    """Whether another process holds a write lock of the store at ``url``."""
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=0, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return False
        except sqlite3.OperationalError:
            return True
        finally:
            conn.close()
    if url.startswith("json:///"):
        fd = os.open(Path(url.removeprefix("json:///")) / LOCK_FILE, os.O_CREAT | os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing releases the flock
    # PostgreSQL: a transaction under way holds locks on the tables of the store's schema.
    import psycopg

    parts = urlsplit(url)
    params = parse_qs(parts.query)
    (schema,) = params.pop("schema")
    server = parts._replace(query=urlencode(params, doseq=True)).geturl()
    with psycopg.connect(server, autocommit=True) as conn:
        found = conn.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND l.pid <> pg_backend_pid()",
            (schema,),
        ).fetchone()
    return bool(found and found[0])


def awaiting_approval(url: str, session: str) -> tl.Run:
    """A run of ``session`` on the store at ``url`` stopped for a person: the model asked for
    ``wire(amount=3)``, a high-impact tool, and the request waits in the approval queue."""
    from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

    @tl.tool(high_impact=True)
    def wire(amount: int) -> str:
        """Wire money."""
        return "wired"

    script = [Reply(tool_uses=[ToolUse("wire", {"amount": 3})]), Reply(text="paid")]
    with ScriptedModel(script) as m, tl.open_store(url) as store:
        agent = tl.Agent(
            client=m.client(), model="x", tools=[wire], store=store, approve=tl.approvals.queue
        )
        run = agent.run(session=session, prompt="pay")
    assert run.status is tl.RunStatus.AWAITING_APPROVAL, run.reason
    return run
