"""SQLite group commit: threads sharing one store share transactions and fsyncs, and so do
asyncio tasks (``InlineAsync``) — and every batch keeps its own meaning (conditions,
all-or-nothing guards, errors)."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import toolledger as tl
from toolledger.ops import AbandonMessages, AppendMessages, InsertEffect, PutSession, UpdateEffect
from toolledger.records import Status
from toolledger.stores.contract import Pending
from toolledger.stores.sqlite import SQLiteBackend
from toolledger.testing import Counter
from toolledger.testing.conformance import make_message, make_record, make_state

from ..conftest import tool_use
from ..helpers import spy_store

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

    def full_disk(session_id: str, ops: object, form: object) -> list[bool]:
        import sqlite3

        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(backend, "_apply_batch", full_disk)
    with pytest.raises(tl.StoreUnavailableError, match="disk is full"):
        backend.apply("s", [InsertEffect(make_record())])
    monkeypatch.setattr(backend, "_apply_batch", original)
    assert store.ledger("s").records() == []
    assert backend.apply("s", [InsertEffect(make_record())]) == [True]
    store.close()


# -- asyncio tasks ------------------------------------------------------------------------------

TASKS = 16
CALLS_PER_TASK = 10


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[tl.Store]:
    store = tl.open_store(f"sqlite:///{tmp_path / 'g.db'}")
    yield store
    store.close()


def _commits(store: tl.Store) -> int:
    backend = store.backend
    assert isinstance(backend, SQLiteBackend)
    return backend.commits


def _tasks_each_running_calls(store: tl.Store, tool: tl.Tool[Any, Any]) -> list[list[str]]:
    async def task(k: int) -> list[str]:
        ledger = store.ledger(f"s{k}")
        out: list[str] = []
        for n in range(CALLS_PER_TASK):
            block = tool_use(f"toolu_{n}", tool.name, n=n)
            (result,) = await tl.arun_tool_uses([block], [tool], ledger=ledger)
            out.append(result["content"])
        return out

    async def main() -> list[list[str]]:
        return await asyncio.gather(*(task(k) for k in range(TASKS)))

    return asyncio.run(main())


@pytest.mark.parametrize("kind", ["async def", "def"])
def test_concurrent_tasks_share_commits_and_run_every_effect_once(
    sqlite_store: tl.Store, kind: str
) -> None:
    """16 tasks, each running 10 non-idempotent calls one after another on its own session:
    alone, a call commits twice (its intent, its outcome); here the tasks' batches share
    transactions. An ``async def`` tool keeps the tasks in step (groups of all 16); a plain
    one runs in a worker thread, and the tasks drift apart after their first commit, which
    they still share."""
    counter = Counter()

    if kind == "async def":

        @tl.tool(effect="non_idempotent")
        async def send(n: int, ctx: tl.ToolContext) -> str:
            counter.hit(f"{ctx.session_id}/{n}")
            return f"sent {n}"

    else:

        @tl.tool(effect="non_idempotent")
        def send(n: int, ctx: tl.ToolContext) -> str:
            counter.hit(f"{ctx.session_id}/{n}")
            return f"sent {n}"

    before = _commits(sqlite_store)
    answers = _tasks_each_running_calls(sqlite_store, send)
    commits = _commits(sqlite_store) - before
    calls = TASKS * CALLS_PER_TASK
    assert answers == [[f"sent {n}" for n in range(CALLS_PER_TASK)]] * TASKS
    assert counter.total == calls
    for k in range(TASKS):
        assert [counter[f"s{k}/{n}"] for n in range(CALLS_PER_TASK)] == [1] * CALLS_PER_TASK
        records = sqlite_store.ledger(f"s{k}").records()
        assert [(r.status, r.attempt) for r in records] == [(Status.SUCCEEDED, 1)] * CALLS_PER_TASK
    if kind == "async def":
        assert commits < calls, f"{commits} commits for {calls} calls"
    else:
        assert commits <= 2 * calls - (TASKS - 1), f"{commits} commits for {2 * calls} batches"


def test_a_task_that_committed_alone_shares_commits_once_others_come(
    sqlite_store: tl.Store,
) -> None:
    """A task alone commits at once, without waiting for company; when other tasks start
    beside it, it and they share commits again."""
    counter = Counter()

    @tl.tool(effect="non_idempotent")
    async def send(n: int, ctx: tl.ToolContext) -> str:
        counter.hit(f"{ctx.session_id}/{n}")
        return f"sent {n}"

    async def calls(k: int, first: int) -> None:
        ledger = sqlite_store.ledger(f"s{k}")
        for n in range(first, first + CALLS_PER_TASK):
            (result,) = await tl.arun_tool_uses(
                [tool_use(f"toolu_{n}", "send", n=n)], [send], ledger=ledger
            )
            assert result["content"] == f"sent {n}"

    commits: list[int] = []

    async def main() -> None:
        before = _commits(sqlite_store)
        await calls(0, 0)  # alone: two commits a call
        commits.append(_commits(sqlite_store) - before)
        before = _commits(sqlite_store)
        others = [asyncio.create_task(calls(k, 0)) for k in range(1, TASKS)]
        await calls(0, CALLS_PER_TASK)  # the same task, now with company
        await asyncio.gather(*others)
        commits.append(_commits(sqlite_store) - before)

    asyncio.run(main())
    assert commits[0] == 2 * CALLS_PER_TASK
    assert commits[1] < TASKS * CALLS_PER_TASK, f"{commits[1]} commits for the shared calls"
    assert counter.total == (TASKS + 1) * CALLS_PER_TASK
    assert {counter[f"s{k}/{n}"] for k in range(TASKS) for n in range(CALLS_PER_TASK)} == {1}


def test_concurrent_tasks_batches_keep_their_conditions(sqlite_store: tl.Store) -> None:
    """What the thread test above checks, for tasks: in a shared transaction each batch is
    still evaluated in order, all or nothing, and a failed guard fails its batch alone."""

    async def task(n: int) -> tuple[bool, BaseException | None]:
        (won,) = await sqlite_store.aapply(
            "shared", [InsertEffect(make_record("shared", "contested"))]
        )
        try:
            await sqlite_store.aapply(
                "shared",
                [
                    PutSession(make_state("shared"), None),
                    InsertEffect(make_record("shared", f"only-with-{n}")),
                ],
            )
        except tl.SessionConflictError as exc:
            return won, exc
        return won, None

    async def main() -> list[tuple[bool, BaseException | None]]:
        return await asyncio.gather(*(task(n) for n in range(TASKS)))

    before = _commits(sqlite_store)
    answers = asyncio.run(main())
    assert sorted(won for won, _ in answers) == [False] * (TASKS - 1) + [True]
    assert sum(error is not None for _, error in answers) == TASKS - 1
    shared = {r.tool_use_id for r in sqlite_store.ledger("shared").records()}
    assert len(shared - {"contested"}) == 1, "only the batch whose guard held left a record"
    assert _commits(sqlite_store) - before == 2, "each round of batches was one transaction"


@pytest.mark.parametrize("cancelled", ["leader", "follower"])
def test_a_task_cancelled_while_its_batch_is_in_a_group_is_cancelled_once_it_committed(
    sqlite_store: tl.Store, cancelled: str
) -> None:
    """Task ``a`` queues first and gathers the group; ``b`` queues behind it. Whichever is
    cancelled meanwhile, the group is committed whole — the other task's batch too — and the
    cancelled task ends (``CancelledError``) only once its batch is in the store."""

    async def main() -> tuple[list[bool], list[bool]]:
        a = asyncio.create_task(
            sqlite_store.aapply("a", [InsertEffect(make_record("a", "toolu_a"))])
        )
        b = asyncio.create_task(
            sqlite_store.aapply("b", [InsertEffect(make_record("b", "toolu_b"))])
        )
        await asyncio.sleep(0)  # a leads; b has queued its batch behind a's
        victim, other = (a, b) if cancelled == "leader" else (b, a)
        victim.cancel()
        with pytest.raises(asyncio.CancelledError):
            await victim
        assert sqlite_store.ledger((victim is a and "a") or "b").records() != [], (
            "the cancelled task's batch was committed before it ended"
        )
        return await other, []

    before = _commits(sqlite_store)
    other, _ = asyncio.run(main())
    assert other == [True]
    assert _commits(sqlite_store) - before == 1, "a and b were committed together"
    assert [r.tool_use_id for r in sqlite_store.ledger("a").records()] == ["toolu_a"]
    assert [r.tool_use_id for r in sqlite_store.ledger("b").records()] == ["toolu_b"]


def test_a_task_cancelled_while_its_outcome_commits_loses_nothing(
    sqlite_store: tl.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``b`` is cancelled while the group holding its call's outcome is being committed. The
    outcome lands (the effect is not left in doubt), ``b`` ends cancelled (it reports nothing),
    and running its content again answers from the ledger without running the tool again."""
    counter = Counter()

    @tl.tool(effect="non_idempotent")
    async def send(n: int, ctx: tl.ToolContext) -> str:
        counter.hit(ctx.session_id)
        return f"sent {n}"

    backend = sqlite_store.backend
    assert isinstance(backend, SQLiteBackend)
    original = backend.apply_group
    tasks: dict[str, asyncio.Task[list[dict[str, Any]]]] = {}
    shared_with: list[list[str]] = []

    def outcome_of_b(p: Pending) -> bool:
        return p.session_id == "b" and any(
            isinstance(op, UpdateEffect) and op.record.status is Status.SUCCEEDED for op in p.ops
        )

    def apply_group(group: list[Pending]) -> None:
        if any(outcome_of_b(p) for p in group):
            shared_with.append([p.session_id for p in group])
            tasks["b"].cancel()  # mid-commit: its batch is in this transaction
        original(group)

    monkeypatch.setattr(backend, "apply_group", apply_group)
    block = tool_use("toolu_1", "send", n=1)

    async def main() -> list[dict[str, Any]]:
        for sid in ("a", "b"):
            tasks[sid] = asyncio.create_task(
                tl.arun_tool_uses([block], [send], ledger=sqlite_store.ledger(sid))
            )
        with pytest.raises(asyncio.CancelledError):
            await tasks["b"]
        return await tasks["a"]

    (result_a,) = asyncio.run(main())
    assert result_a["content"] == "sent 1"
    assert shared_with == [["a", "b"]], "b's outcome was committed in a's group"
    record = sqlite_store.ledger("b").get("toolu_1")
    assert record is not None and record.status is Status.SUCCEEDED
    assert counter["a"] == counter["b"] == 1
    (again,) = asyncio.run(tl.arun_tool_uses([block], [send], ledger=sqlite_store.ledger("b")))
    assert again["content"] == "sent 1" and not again.get("is_error")
    assert counter["b"] == 1, "answered from the ledger: the effect ran once"


def test_a_wrapper_that_writes_through_its_own_apply_sees_every_async_commit(
    sqlite_store: tl.Store,
) -> None:
    """Tasks share commits through ``apply_group``, a method of the backend's class; a wrapper
    that hands unknown attributes to the backend it wraps (``SpyBackend``) is not taken for one
    that can, so every batch still goes through its ``apply``."""
    spied, spy = spy_store(sqlite_store)

    @tl.tool(effect="non_idempotent")
    async def send(n: int) -> str:
        return f"sent {n}"

    async def main() -> None:
        await asyncio.gather(
            *(
                tl.arun_tool_uses(
                    [tool_use("toolu_1", "send", n=k)], [send], ledger=spied.ledger(f"s{k}")
                )
                for k in range(4)
            )
        )

    asyncio.run(main())
    assert len(spy.commits) == 4 * 2, "each call's intent and outcome, through the spy"


def test_rewinds_in_one_group_keep_their_guards(tmp_path: Path) -> None:
    """Three callers' batches in one transaction: a refused rewind rolls its own batch back
    (its savepoint), never its neighbours'."""
    with tl.open_store(f"sqlite:///{tmp_path / 'g.db'}") as store:
        backend = store.backend
        assert isinstance(backend, SQLiteBackend)
        for sid in ("a", "b"):
            messages = tuple(make_message(i) for i in range(4))
            store.apply(
                sid, [PutSession(make_state(sid, messages=4), None), AppendMessages(messages)]
            )
        before = backend.commits
        group = [
            Pending("a", [AbandonMessages(2, 1), AppendMessages((make_message(2, "user", "x"),))]),
            Pending("b", [AbandonMessages(9, 1), InsertEffect(make_record("b"))]),
            Pending("b", [AbandonMessages(1, 1)]),
        ]
        backend.apply_group(group)
        assert backend.commits == before + 1
        assert group[0].flags == [True, True] and group[2].flags == [True]
        assert isinstance(group[1].error, tl.SessionConflictError)
        assert [m.content for m in store.messages("a")] == ["message 0", "message 1", "x"]
        assert [m.seq for m in store.abandoned("a")[1]] == [2, 3]
        assert [m.seq for m in store.messages("b")] == [0]
        assert [m.seq for m in store.abandoned("b")[1]] == [1, 2, 3]
        assert store.ledger("b").records() == [], "the refused batch's record rolled back"


@pytest.mark.parametrize("grouped", [False, True], ids=["alone", "in-a-group"])
def test_an_interrupt_wherever_a_function_is_entered_leaves_the_store_writable(
    tmp_path: Path, grouped: bool
) -> None:
    """Python raises a ``KeyboardInterrupt`` (a signal) where a function is entered. Raised at
    each such point of one commit in turn — a caller alone, and a caller going through the
    group — it goes up, and it never leaves the store led by nobody: the next write, from
    another thread, commits."""
    store = tl.open_store(f"sqlite:///{tmp_path / 'i.db'}")
    backend = store.backend
    assert isinstance(backend, SQLiteBackend)
    at = 0
    while _commit_interrupted(backend, grouped, at):
        assert _written_from_another_thread(backend, f"after-{at}"), f"interrupted at call {at}"
        assert not backend._leading and not backend._queue
        at += 1
    assert at > 3  # the commit entered that many functions, each one interrupted in turn
    assert _written_from_another_thread(backend, "last")
    store.close()


def _commit_interrupted(backend: SQLiteBackend, grouped: bool, at: int) -> bool:
    """Commit one effect, a ``KeyboardInterrupt`` raised as the commit enters its function
    number ``at`` (from 0): whether it was (the commit entered fewer functions if not)."""
    entered = 0

    def interrupt(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal entered
        if event == "call":
            entered += 1
            if entered == at + 1:
                raise KeyboardInterrupt

    ops = [InsertEffect(make_record("s", f"t{at}"))]
    sys.settrace(interrupt)
    try:
        if grouped:
            backend.apply_group([Pending("s", list(ops))])
        else:
            backend.apply("s", ops)
    except KeyboardInterrupt:
        return True
    finally:
        sys.settrace(None)
    return False


def _written_from_another_thread(backend: SQLiteBackend, tool_use_id: str) -> bool:
    after: list[list[bool]] = []

    def write() -> None:
        after.append(backend.apply("s", [InsertEffect(make_record("s", tool_use_id))]))

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    writer.join(10)
    return after == [[True]]


class _Writers:
    """Threads of one store each writing one effect named after the thread, and what each got:
    its flags, or what it raised."""

    def __init__(self, backend: SQLiteBackend) -> None:
        self.backend = backend
        self.results: dict[str, object] = {}

    def _write(self, name: str) -> None:
        try:
            self.results[name] = self.backend.apply("s", [InsertEffect(make_record("s", name))])
        except BaseException as exc:
            self.results[name] = exc

    def start(self, names: str, trace: Any = None) -> list[threading.Thread]:
        """A thread for each of ``names``, started with ``trace`` (``threading.settrace``)."""
        threading.settrace(trace)
        try:
            threads = [threading.Thread(target=self._write, args=(n,), name=n) for n in names]
            for t in threads:
                t.start()
        finally:
            threading.settrace(None)  # type: ignore[arg-type]
        return threads

    def stalled_leader(self) -> threading.Thread:
        """ "A" writing alone, leading, and waiting for the connection, which the test holds
        (``backend._lock``) until it releases it."""
        self.backend._lock.acquire()
        [a] = self.start("A")
        while not self.backend._leading:
            time.sleep(0.001)
        return a


@pytest.mark.parametrize("at", ["_commit_group", "_check_identity", "_form", "_apply_batch"])
def test_a_leader_interrupted_before_it_commits_tells_the_callers_it_took(
    tmp_path: Path, at: str
) -> None:
    """A caller leading a group is interrupted (a ``KeyboardInterrupt`` where ``at`` is entered:
    before its transaction, or inside it) after it took the queue: the caller whose batch it
    took is told that nothing of it was written — not left with no answer (an
    ``AssertionError`` in ``apply``), not told it landed, not handed the leader's interrupt —
    and the store goes on."""
    store = tl.open_store(f"sqlite:///{tmp_path / 'l.db'}")
    backend = store.backend
    assert isinstance(backend, SQLiteBackend)
    writers = _Writers(backend)
    results = writers.results
    interrupted: list[str] = []

    def interrupt(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name == at and not interrupted:
            interrupted.append(threading.current_thread().name)
            raise KeyboardInterrupt

    a = writers.stalled_leader()
    others = writers.start("BC", interrupt)
    while backend._waiting < 2:  # B and C queued behind A
        time.sleep(0.001)
    backend._lock.release()
    for t in (a, *others):
        t.join(10)
    [leader] = interrupted
    [other] = {"B", "C"} - {leader}
    assert results["A"] == [True]
    assert isinstance(results[leader], KeyboardInterrupt)
    told = results[other]
    assert isinstance(told, tl.StoreError) and "nothing of it was written" in str(told)
    assert sorted(backend.read_effects("s")) == ["A"]
    assert backend.apply("s", [InsertEffect(make_record("s", other))]) == [True]
    assert not backend._leading and not backend._queue
    store.close()


def test_a_caller_interrupted_while_it_waits_never_has_its_batch_written(tmp_path: Path) -> None:
    """A caller waiting for another's commit is interrupted (a ``KeyboardInterrupt``): its
    batch, which no leader took yet, is never written — not by the commit it waited for, not by
    the next caller's — since it was told it failed."""
    store = tl.open_store(f"sqlite:///{tmp_path / 'w.db'}")
    backend = store.backend
    assert isinstance(backend, SQLiteBackend)
    writers = _Writers(backend)
    results = writers.results

    def interrupt(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name == "wait":  # ``Condition.wait``
            raise KeyboardInterrupt

    a = writers.stalled_leader()
    [b] = writers.start("B", interrupt)
    b.join(10)
    assert isinstance(results["B"], KeyboardInterrupt)
    assert not backend._queue  # withdrawn, not left for the next leader
    backend._lock.release()
    a.join(10)
    assert results["A"] == [True]
    assert backend.apply("s", [InsertEffect(make_record("s", "C"))]) == [True]
    assert sorted(backend.read_effects("s")) == ["A", "C"]
    assert not backend._leading and not backend._queue
    store.close()


def test_a_task_interrupted_while_it_gathers_a_group_leaves_the_loop_able_to_commit(
    tmp_path: Path,
) -> None:
    """The task leading a group is interrupted (a ``KeyboardInterrupt``, as a signal raises
    one where a function is entered or resumed) at each point of its gathering in turn, on a
    loop that is run again afterwards: the task queued behind it is answered — told its batch
    was not written, or that it was, truthfully — and the next commit on that loop goes
    through instead of waiting forever for a group nobody leads."""
    store = tl.open_store(f"sqlite:///{tmp_path / 'g.db'}")
    at = 0
    while _gathering_interrupted(store, at):
        at += 1
    assert at >= 5  # the gathering was entered (and resumed) that many times, each interrupted
    store.close()


def _gathering_interrupted(store: tl.Store, at: int) -> bool:
    """Two tasks commit one effect each, ``leader`` first; ``leader`` is interrupted as it
    enters (or resumes) a function of its gathering for the ``at``-th time (from 0): whether it
    was. Checks what each task was told against the store, then that the loop commits again."""
    loop = asyncio.new_event_loop()
    entered = 0

    def interrupt(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal entered
        task = asyncio.current_task(loop) if event == "call" else None
        # its gathering, and the store's function it hands the group to, entered: what a
        # signal raised there leaves is the followers' to be told, not a commit nobody makes
        in_gathering = frame.f_code.co_name in {"_lead", "sleep", "apply_group"}
        if task is not None and task.get_name() == "leader" and in_gathering:
            entered += 1
            if entered == at + 1:
                raise KeyboardInterrupt
        return None

    leader_id, follower_id = f"lead-{at}", f"follow-{at}"

    def commit(tool_use_id: str, name: str) -> asyncio.Task[list[bool]]:
        ops = [InsertEffect(make_record("s", tool_use_id))]
        return loop.create_task(_coroutine(store.aapply("s", ops)), name=name)

    leader, follower = commit(leader_id, "leader"), commit(follower_id, "follower")
    sys.settrace(interrupt)
    try:
        loop.run_until_complete(leader)  # the follower queues behind it as it gathers
        interrupted = False
    except KeyboardInterrupt:
        interrupted = True
    finally:
        sys.settrace(None)
    try:
        told = loop.run_until_complete(_answer(follower))
        after = loop.run_until_complete(_answer(commit(f"after-{at}", "after")))
    finally:
        loop.close()
    assert after == [True], f"interrupted at {at}: the loop could not commit again ({after})"
    written = set(store.backend.read_effects("s"))
    if interrupted:
        if told == [True]:
            assert follower_id in written
        else:
            assert isinstance(told, tl.StoreError) and "nothing of it was written" in str(told)
            assert follower_id not in written
        assert leader_id not in written, "the interrupted task was told its batch failed"
    return interrupted


def test_a_task_interrupted_while_its_batch_waits_in_a_group_never_has_it_written(
    tmp_path: Path,
) -> None:
    """A task whose batch waits in the group another task is gathering is cancelled, then
    interrupted (a ``KeyboardInterrupt``, as a signal raises one where the task resumes) before
    the group is committed: it ends with the interrupt, and its batch leaves the group — never
    written after the task ended. The leader's batch is written, and the loop commits again."""
    store = tl.open_store(f"sqlite:///{tmp_path / 'f.db'}")
    loop = asyncio.new_event_loop()
    entered = 0

    def interrupt(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal entered
        task = asyncio.current_task(loop) if event == "call" else None
        if task is not None and task.get_name() == "follower" and frame.f_code.co_name == "_follow":
            entered += 1
            if entered == 1:
                task.cancel()  # it queues its batch, then wakes up cancelled at its ``await``
            elif entered == 2:
                raise KeyboardInterrupt
        return None

    def commit(tool_use_id: str, name: str) -> asyncio.Task[list[bool]]:
        ops = [InsertEffect(make_record("s", tool_use_id))]
        return loop.create_task(_coroutine(store.aapply("s", ops)), name=name)

    leader, follower = commit("lead", "leader"), commit("follow", "follower")
    sys.settrace(interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(leader)
    finally:
        sys.settrace(None)
    try:
        assert entered == 2 and isinstance(follower.exception(), KeyboardInterrupt)
        assert loop.run_until_complete(_answer(leader)) == [True]
        after = loop.run_until_complete(_answer(commit("after", "after")))
    finally:
        loop.close()
    assert after == [True]
    assert sorted(store.backend.read_effects("s")) == ["after", "lead"], "not the interrupted one"
    store.close()


async def _coroutine(awaitable: Awaitable[list[bool]]) -> list[bool]:
    return await awaitable


async def _answer(task: asyncio.Task[list[bool]]) -> list[bool] | BaseException | None:
    """What ``task`` was told: its flags, or the error it raised — ``None`` if it was told
    nothing within 5 seconds (not cancelled: a task that waits forever would wait on)."""
    await asyncio.wait({task}, timeout=5)
    if not task.done():
        return None
    return task.exception() or task.result()


def test_a_task_interrupted_once_another_threads_commit_took_its_group_is_told_the_truth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task leading a group hands it to the store while thread B commits; it waits, thread
    C takes the queued batches — the group's among them — and the task is interrupted while it
    waits. C commits them: the task queued behind the interrupted one waits for C's answer and
    is told its batch landed, not that nothing of it was written."""
    store = tl.open_store(f"sqlite:///{tmp_path / 'x.db'}")
    backend = store.backend
    assert isinstance(backend, SQLiteBackend)
    commit_group = backend._commit_group
    entered = {name: threading.Event() for name in "BC"}
    go = {name: threading.Event() for name in "BC"}

    def held_commit(group: list[Pending]) -> None:
        name = threading.current_thread().name
        if name in entered:
            entered[name].set()
            go[name].wait(10)
        commit_group(group)

    monkeypatch.setattr(backend, "_commit_group", held_commit)

    def thread(name: str) -> threading.Thread:
        batch = [Pending("s", [InsertEffect(make_record("s", name))])]
        return threading.Thread(target=backend.apply_group, args=(batch,), name=name)

    b, c = thread("B"), thread("C")
    condition = backend._queue_cv

    class Interrupting:
        """The store's condition, but the loop's thread, told to wait (B leads), lets B finish
        and C take the queue, then is interrupted."""

        def __enter__(self) -> Any:
            return condition.__enter__()

        def __exit__(self, *exc: Any) -> Any:
            return condition.__exit__(*exc)

        def notify_all(self) -> None:
            condition.notify_all()

        def wait(self, timeout: float | None = None) -> bool:
            if threading.current_thread() is not threading.main_thread():
                return condition.wait(timeout)
            condition.release()
            try:
                go["B"].set()
                b.join(10)
                c.start()
                entered["C"].wait(10)
            finally:
                condition.acquire()
            raise KeyboardInterrupt

    monkeypatch.setattr(backend, "_queue_cv", Interrupting())
    b.start()
    assert entered["B"].wait(10)
    loop = asyncio.new_event_loop()
    try:
        leader = loop.create_task(
            _coroutine(store.aapply("s", [InsertEffect(make_record("s", "lead"))]))
        )
        follower = loop.create_task(
            _coroutine(store.aapply("s", [InsertEffect(make_record("s", "follow"))]))
        )
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(leader)
        # C commits a while after the follower is woken: it waits for C's answer, not reading
        # one nobody gave yet.
        threading.Timer(0.2, go["C"].set).start()
        told = loop.run_until_complete(_answer(follower))
        c.join(10)
    finally:
        loop.close()
    written = set(backend.read_effects("s"))
    assert "follow" in written, "C's commit wrote the follower's batch"
    assert told == [True], f"told {told!r} of a batch that was written"
    store.close()


def test_a_follower_no_commit_took_is_told_even_if_its_leader_is_interrupted_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C twice: the task leading a group is interrupted as it hands the group to the
    store, then again as it tells the task queued behind it that its batch was not written.
    That task is still answered — not left waiting, for ever, for a commit nobody makes."""
    from toolledger.stores import contract

    real = contract.interrupted

    def interrupted_again(url: str, exc: BaseException | None = None) -> tl.StoreError:
        monkeypatch.setattr(contract, "interrupted", real)
        raise KeyboardInterrupt

    monkeypatch.setattr(contract, "interrupted", interrupted_again)
    store = tl.open_store(f"sqlite:///{tmp_path / 'd.db'}")
    loop = asyncio.new_event_loop()
    hit: list[str] = []

    def interrupt(frame: FrameType, event: str, arg: Any) -> Any:
        task = asyncio.current_task(loop) if event == "call" else None
        named = task is not None and task.get_name() == "leader"
        if named and frame.f_code.co_name == "apply_group" and not hit:
            hit.append("apply_group")
            raise KeyboardInterrupt
        return None

    def commit(tool_use_id: str, name: str) -> asyncio.Task[list[bool]]:
        ops = [InsertEffect(make_record("s", tool_use_id))]
        return loop.create_task(_coroutine(store.aapply("s", ops)), name=name)

    leader, follower = commit("lead", "leader"), commit("follow", "follower")
    sys.settrace(interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(leader)
    finally:
        sys.settrace(None)
    try:
        told = loop.run_until_complete(_answer(follower))
        if not follower.done():
            follower.cancel()
            loop.run_until_complete(asyncio.wait({follower}, timeout=2))
    finally:
        loop.close()
    assert hit == ["apply_group"]
    assert isinstance(told, tl.StoreError) and "nothing of it was written" in str(told), told
    assert store.backend.read_effects("s") == {}
    store.close()


def test_a_cancelled_task_whose_batch_another_threads_commit_took_ends_once_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above (thread C takes the group a task handed over, and that task is interrupted),
    and the task queued behind it is cancelled meanwhile (a caller's timeout): it ends only
    once C's commit answered its batch — nothing of it lands after it ended."""
    store = tl.open_store(f"sqlite:///{tmp_path / 'x.db'}")
    backend = store.backend
    assert isinstance(backend, SQLiteBackend)
    commit_group = backend._commit_group
    entered = {name: threading.Event() for name in "BC"}
    go = {name: threading.Event() for name in "BC"}

    def held_commit(group: list[Pending]) -> None:
        name = threading.current_thread().name
        if name in entered:
            entered[name].set()
            go[name].wait(10)
        commit_group(group)

    monkeypatch.setattr(backend, "_commit_group", held_commit)

    def thread(name: str) -> threading.Thread:
        batch = [Pending("s", [InsertEffect(make_record("s", name))])]
        return threading.Thread(target=backend.apply_group, args=(batch,), name=name)

    b, c = thread("B"), thread("C")
    condition = backend._queue_cv
    tasks: dict[str, asyncio.Task[list[bool]]] = {}

    class Interrupting:
        """The store's condition; the loop's thread, told to wait, lets B finish and C take
        the queue, then its follower is cancelled and it is interrupted."""

        def __enter__(self) -> Any:
            return condition.__enter__()

        def __exit__(self, *exc: Any) -> Any:
            return condition.__exit__(*exc)

        def notify_all(self) -> None:
            condition.notify_all()

        def wait(self, timeout: float | None = None) -> bool:
            if threading.current_thread() is not threading.main_thread():
                return condition.wait(timeout)
            condition.release()
            try:
                go["B"].set()
                b.join(10)
                c.start()
                entered["C"].wait(10)
            finally:
                condition.acquire()
            tasks["follower"].cancel()
            raise KeyboardInterrupt

    monkeypatch.setattr(backend, "_queue_cv", Interrupting())
    b.start()
    assert entered["B"].wait(10)
    loop = asyncio.new_event_loop()
    written_when_it_ended: list[bool] = []
    try:
        leader = loop.create_task(
            _coroutine(store.aapply("s", [InsertEffect(make_record("s", "lead"))]))
        )
        follower = tasks["follower"] = loop.create_task(
            _coroutine(store.aapply("s", [InsertEffect(make_record("s", "follow"))]))
        )
        follower.add_done_callback(
            lambda _: written_when_it_ended.append("follow" in backend.read_effects("s"))
        )
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(leader)
        threading.Timer(0.2, go["C"].set).start()
        loop.run_until_complete(asyncio.wait({follower}, timeout=5))
        assert follower.cancelled()
        c.join(10)
    finally:
        loop.close()
    assert "follow" in backend.read_effects("s"), "C's commit wrote it"
    assert written_when_it_ended == [True], "the task ended only once its batch was written"
    store.close()


def test_ctrl_c_twice_as_a_group_rolls_back_tells_no_caller_its_batch_landed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C as the leader writes the group's second batch (its transaction rolled back), and
    again as it tells the first batch's caller so: that caller is never told its batch landed —
    it was in the transaction rolled back — and neither caller is left with no answer (an
    ``AssertionError`` in ``apply``): each is told nothing was written, or that nobody knows,
    which its caller reads back."""
    from toolledger.stores import contract, sqlite

    store = tl.open_store(f"sqlite:///{tmp_path / 'r.db'}")
    backend = store.backend
    assert isinstance(backend, SQLiteBackend)
    real_batch, real_told = backend._apply_batch, sqlite.interrupted
    batches = 0

    def second_interrupted(*args: Any) -> list[bool]:
        nonlocal batches
        batches += 1
        if batches == 2:
            raise KeyboardInterrupt("the first Ctrl-C")
        return real_batch(*args)

    def told_interrupted(url: str, exc: BaseException | None = None) -> tl.StoreError:
        monkeypatch.setattr(sqlite, "interrupted", real_told)
        raise KeyboardInterrupt("the second Ctrl-C")

    monkeypatch.setattr(backend, "_apply_batch", second_interrupted)
    monkeypatch.setattr(sqlite, "interrupted", told_interrupted)
    group = [Pending("s", [InsertEffect(make_record("s", f"t{n}"))]) for n in (1, 2)]
    with pytest.raises(KeyboardInterrupt, match="second"):
        backend.apply_group(group)
    monkeypatch.setattr(backend, "_apply_batch", real_batch)
    assert backend.read_effects("s") == {}
    for p in group:
        assert p.done and p.flags is None, (p.flags, p.error)
        with pytest.raises(tl.StoreError) as told:
            contract.answer(p, backend.url)
        assert "nothing of it was written" in str(told.value) or told.value.outcome_unknown
    store.close()


def test_ctrl_c_as_a_waiting_caller_takes_the_queue_back_leaves_another_thread_s_hold(
    tmp_path: Path,
) -> None:
    """A caller waiting for another's commit is woken while a third thread holds the queue's
    lock, and Ctrl-C lands as it waits to take that lock back (``Condition.wait``). Its
    interrupt goes up once it holds the lock again: it never releases the third thread's hold
    (a ``RuntimeError`` there, and the queue's state changed by two threads at once), and its
    batch is never written."""
    import signal

    store = tl.open_store(f"sqlite:///{tmp_path / 'q.db'}")
    backend = store.backend
    assert isinstance(backend, SQLiteBackend)
    writers = _Writers(backend)
    a = writers.stalled_leader()
    main = threading.main_thread().ident
    assert main == threading.get_ident()
    seen: dict[str, object] = {}

    def third() -> None:
        while backend._waiting < 1:  # this thread, queued behind A
            time.sleep(0.001)
        try:
            with backend._queue_cv:
                backend._queue_cv.notify_all()  # it wakes, and waits for this hold to end
                time.sleep(0.2)
                signal.pthread_kill(main, signal.SIGINT)
                time.sleep(0.2)
                seen["queue"] = list(backend._queue)
        except BaseException as exc:
            seen["error"] = exc
        seen["done"] = True

    t = threading.Thread(target=third)
    t.start()
    with pytest.raises(KeyboardInterrupt):
        backend.apply("s", [InsertEffect(make_record("s", "B"))])
    t.join(10)
    assert seen.get("done") and "error" not in seen, seen
    assert [p.ops[0].record.tool_use_id for p in seen["queue"]] == ["B"]  # type: ignore[attr-defined]
    backend._lock.release()
    a.join(10)
    assert writers.results["A"] == [True]
    assert backend.apply("s", [InsertEffect(make_record("s", "C"))]) == [True]
    assert sorted(backend.read_effects("s")) == ["A", "C"]
    assert not backend._leading and not backend._queue
    store.close()
