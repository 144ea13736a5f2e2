"""SQLite group commit: threads sharing one store share transactions and fsyncs — and every
batch keeps its own meaning (conditions, all-or-nothing guards, errors)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import toolledger as tl
from toolledger.ops import InsertEffect, PutSession
from toolledger.stores.sqlite import SQLiteBackend
from toolledger.testing.conformance import make_record, make_state

THREADS = 16
PER_THREAD = 40


def test_concurrent_batches_share_commits_and_keep_their_conditions(tmp_path: Path) -> None:
    store = tl.open_store(f"sqlite:///{tmp_path / 'g.db'}")
    backend = store.backend
    assert isinstance(backend, SQLiteBackend)
    start = threading.Barrier(THREADS)
    won: list[bool] = []
    conflicts: list[BaseException] = []

    def worker(n: int) -> None:
        start.wait()
        for i in range(PER_THREAD):
            # Each thread its own session; every thread also races for one contested record.
            assert backend.apply(f"s{n}", [InsertEffect(make_record(f"s{n}", f"t{i}"))]) == [True]
        won.append(backend.apply("shared", [InsertEffect(make_record("shared", "contested"))])[0])
        try:  # every thread tries to create the same session: one guard holds, the rest fail
            backend.apply(
                "shared",
                [
                    PutSession(make_state("shared"), None),
                    InsertEffect(make_record("shared", f"only-with-{n}")),
                ],
            )
        except tl.SessionConflictError as exc:
            conflicts.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batches = THREADS * (PER_THREAD + 2)
    assert sorted(won) == [False] * (THREADS - 1) + [True]
    assert len(conflicts) == THREADS - 1
    shared = {r.tool_use_id for r in store.ledger("shared").records()}
    assert len(shared - {"contested"}) == 1, "only the batch whose guard held left a record"
    for n in range(THREADS):
        assert len(store.ledger(f"s{n}").records()) == PER_THREAD
    assert backend.commits < batches, f"{backend.commits} commits for {batches} batches"
    store.close()


def test_a_failing_commit_fails_every_batch_of_its_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tl.open_store(f"sqlite:///{tmp_path / 'g.db'}")
    backend = store.backend
    assert isinstance(backend, SQLiteBackend)
    original = backend._apply_batch

    def full_disk(session_id: str, ops: object) -> list[bool]:
        import sqlite3

        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(backend, "_apply_batch", full_disk)
    with pytest.raises(tl.StoreUnavailableError, match="disk is full"):
        backend.apply("s", [InsertEffect(make_record())])
    monkeypatch.setattr(backend, "_apply_batch", original)
    assert store.ledger("s").records() == []
    assert backend.apply("s", [InsertEffect(make_record())]) == [True]
    store.close()
