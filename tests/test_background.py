"""The background lease renewer, at the interleavings a busy process produces; the writer of
kept writes."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import toolledger as tl
from toolledger.engine._background import Heartbeats, Keeper


@dataclass
class _Fence:
    ttl: float


@dataclass
class _Store:
    renewed: threading.Event = field(default_factory=threading.Event)

    def apply(self, session_id: str, ops: list[Any]) -> list[bool]:
        self.renewed.set()
        return []


@dataclass
class _Run:
    store: _Store
    session_id: str = "s"
    busy_since: float | None = None
    fence: _Fence = field(default_factory=lambda: _Fence(ttl=0.3))

    def fenced(self, ops: list[Any], fenced: bool = True) -> list[Any]:
        return ops


class _HeldBeforeWaiting:
    """The renewer's condition variable, holding the renewer thread back just before it takes
    the lock to go to sleep (after it handed out the renewals that were due) until a run has
    been added: the interleaving in which ``add``'s notify reaches nobody."""

    def __init__(self, inner: threading.Condition) -> None:
        self.inner = inner
        self.between = threading.Event()
        self.added = threading.Event()
        self.loop_enters = 0

    def __enter__(self) -> bool:
        if threading.current_thread().name == "renewer-under-test":
            self.loop_enters += 1
            if self.loop_enters == 2:  # the first sleep, with nothing to renew
                self.between.set()
                self.added.wait(10)
        return self.inner.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.inner.__exit__(*exc)

    def wait(self, timeout: float | None = None) -> bool:
        return self.inner.wait(timeout)

    def notify(self) -> None:
        self.inner.notify()


def test_a_run_added_while_the_renewer_hands_out_renewals_is_renewed_on_time() -> None:
    hb = Heartbeats()
    gate = _HeldBeforeWaiting(threading.Condition(threading.Lock()))
    hb._cv = gate  # type: ignore[assignment]
    hb._pool = ThreadPoolExecutor(2)
    hb._thread = threading.Thread(target=hb._loop, daemon=True, name="renewer-under-test")
    hb._thread.start()
    assert gate.between.wait(10)
    run = _Run(_Store())
    hb.add(run)  # type: ignore[arg-type]
    gate.added.set()
    # Due a third of its 0.3 s time to live from now. Before the fix the renewer slept out the
    # minute it had computed when nothing was due, and the lease expired under a healthy run.
    try:
        assert run.store.renewed.wait(10), "the lease was not renewed"
    finally:
        hb.remove(run)  # type: ignore[arg-type]


def test_writes_kept_for_one_store_give_it_one_close_hook(tmp_path: Path) -> None:
    """Every write the background writer keeps asks for a last try when its store closes. A
    long-lived worker keeps thousands over its life: its store holds one hook, not one each,
    and the last try runs once."""
    keeper = Keeper()
    tries: list[object] = []
    real = keeper.last_try
    keeper.last_try = lambda store: (tries.append(store), real(store))[1]  # type: ignore[method-assign]
    store = tl.open_store(f"sqlite:///{tmp_path / 'h.db'}")
    before = len(store._before_close)
    for _ in range(50):
        keeper.keep(store, "s", [], [])
    assert len(store._before_close) == before + 1
    store.close()
    assert tries == [store]
