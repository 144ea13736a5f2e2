"""Fork and rewind under ``SIGKILL``: the crash matrix run on a forked session, and forks and
rewinds killed at random instants — each leaves the whole branch or nothing.

Effects are counted in the world the tools write (ticket files), never in toolledger's records.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

import toolledger as tl
from toolledger._crash import POINTS
from toolledger._verify import Severity, verify
from toolledger.ops import AppendMessages, PutSession
from toolledger.records import RunStatus, SessionState, StoredMessage
from toolledger.testing.scripted import Reply, ScriptedModel
from toolledger.testing.world import KINDS, AgentSpec, World, run_agent

from ..crashcase import (
    KILLED,
    SESSION,
    assert_one_effect_per_call,
    crash_and_recover,
    script,
)

ORIGIN = "origin"


def write_origin(store: tl.Store) -> None:
    """A finished one-turn session to fork from: a greeting, answered with no call."""
    now = store.clock()
    state = SessionState(
        session_id=ORIGIN,
        status=RunStatus.COMPLETED,
        version=1,
        turns=1,
        messages=2,
        created_at=now,
        updated_at=now,
    )
    messages = (
        StoredMessage(seq=0, role="user", content="Say hello.", created_at=now),
        StoredMessage(
            seq=1, role="assistant", content=[{"type": "text", "text": "Hello."}], created_at=now
        ),
    )
    store.apply(ORIGIN, [PutSession(state, None), AppendMessages(messages)])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("point", POINTS)
def test_the_crash_matrix_on_a_fork(shared_url: str, point: str, kind: str, tmp_path: Path) -> None:
    """The session the matrix crashes and resumes is a fork of another one: every point, every
    recovery strategy, two calls in the turn; one effect per call in the world."""
    with tl.open_store(shared_url) as store:
        write_origin(store)
        assert tl.fork(store, ORIGIN, at_turn=1, new_session=SESSION) == SESSION
    world = World(tmp_path / "world")
    # The fork already holds one answer: the script's first step is that turn's.
    with ScriptedModel([Reply(text="Hello."), *script(kind, 2)]) as model:
        spec = AgentSpec(
            store_url=shared_url, base_url=model.url, world=str(world.path), session=SESSION
        )
        crash_and_recover(
            lambda at: run_agent(spec, crash_at=at), shared_url, point=point, kind=kind, calls=2
        )
        assert model.rejected == [], "every request obeyed the pairing rule"
        first = model.requests[0]["messages"]
        assert first[:2] == [
            {"role": "user", "content": "Say hello."},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
        ]
    assert_one_effect_per_call(world, kind, 2)
    with tl.open_store(shared_url) as store:
        assert store.messages(ORIGIN)[-1].role == "assistant"  # the parent never moved
        assert [p for p in verify(store) if p.severity is Severity.ERROR] == []


@pytest.mark.parametrize("kind", ["plain", "checked"])  # the kinds that write an intent
def test_a_fork_killed_between_its_claim_and_its_intent(
    shared_url: str, kind: str, tmp_path: Path
) -> None:
    """A fork's fresh call is claimed in its lineage's first session before the fork records
    it (``toolledger.engine._claims``). Killed right after the claim is durable: the resumed
    fork finds the claim its own and makes each call once; the parent, asked for the same ids
    afterwards, takes the fork's outcomes and makes nothing."""
    with tl.open_store(shared_url) as store:
        write_origin(store)
        tl.fork(store, ORIGIN, at_turn=1, new_session=SESSION)
    world = World(tmp_path / "world")
    with ScriptedModel([Reply(text="Hello."), *script(kind, 2)]) as model:
        spec = AgentSpec(
            store_url=shared_url, base_url=model.url, world=str(world.path), session=SESSION
        )
        code, _ = run_agent(spec, crash_at="after_claim:1")
        assert code == KILLED
        with tl.open_store(shared_url) as store:
            (claim,) = store.ledger(ORIGIN).records()
            assert (claim.status, claim.origin) == (tl.Status.NOT_HAPPENED, SESSION)
            assert store.ledger(SESSION).get(claim.tool_use_id) is None, "killed before"
        assert world.tickets() == []
        code, result = run_agent(spec)
        assert code == 0 and result is not None and result["status"] == "completed", result
    assert_one_effect_per_call(world, kind, 2)

    with tl.open_store(shared_url) as store:
        with ScriptedModel.from_session(store, SESSION, branched=True) as replay:
            run = tl.Agent(
                client=replay.client(), model="m", tools=world.toolset(), store=store
            ).run(session=ORIGIN, prompt="Open the tickets.")
        assert run.status is tl.RunStatus.COMPLETED
        for r in store.ledger(ORIGIN).records():
            assert r.status is tl.Status.SUCCEEDED and r.origin == SESSION, r
        assert [p for p in verify(store) if p.severity is Severity.ERROR] == []
    assert_one_effect_per_call(world, kind, 2)


def test_a_fork_killed_after_pinning_key_forwarding_calls_holds_up_no_one(
    shared_url: str, tmp_path: Path
) -> None:
    """A fork's fresh key-forwarding call is pinned in its lineage's first session before it
    runs (``toolledger.engine._claims.look_up``). Killed right after the pin, the fork leaves
    the pin standing; the parent, asked for the same ids meanwhile, runs them itself under its
    own key — the receiver's key is their guard, and a dead fork settles nothing — and the fork,
    resumed, makes them again under that same key: one ticket per call."""
    with tl.open_store(shared_url) as store:
        write_origin(store)
        tl.fork(store, ORIGIN, at_turn=1, new_session=SESSION)
    world = World(tmp_path / "world")
    with ScriptedModel([Reply(text="Hello."), *script("keyed", 2)]) as model:
        spec = AgentSpec(
            store_url=shared_url, base_url=model.url, world=str(world.path), session=SESSION
        )
        code, _ = run_agent(spec, crash_at="after_claim:1")
        assert code == KILLED
        with tl.open_store(shared_url) as store:
            (pin,) = store.ledger(ORIGIN).records()
            assert (pin.status, pin.origin) == (tl.Status.NOT_HAPPENED, SESSION)
            assert store.ledger(SESSION).get(pin.tool_use_id) is None, "killed before"
            asked = ScriptedModel.from_session(store, SESSION, branched=True).script
            with ScriptedModel([*asked, Reply(text="All tickets are open.")]) as replay:
                run = tl.Agent(
                    client=replay.client(), model="m", tools=world.toolset(), store=store
                ).run(session=ORIGIN, prompt="Open the tickets.")
            assert run.status is tl.RunStatus.COMPLETED, run.final_text
            for r in store.ledger(ORIGIN).records():
                assert r.status is tl.Status.SUCCEEDED and r.key_session == ORIGIN, r
        assert_one_effect_per_call(world, "keyed", 2)
        code, result = run_agent(spec)
        assert code == 0 and result is not None and result["status"] == "completed", result
    assert_one_effect_per_call(world, "keyed", 2)
    with tl.open_store(shared_url) as store:
        for r in store.ledger(SESSION).records():
            assert r.status is tl.Status.SUCCEEDED and r.key_session == ORIGIN, r
        assert [p for p in verify(store) if p.severity is Severity.ERROR] == []


def _four_turns(url: str) -> None:
    from toolledger.testing import Counter

    from ..test_history import run_four_turns

    with tl.open_store(url) as store:
        run_four_turns(store, ORIGIN, Counter())


def _kill_soon(pid: int, rng: random.Random) -> None:
    time.sleep(rng.uniform(0.05, 0.4))
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def test_a_fork_killed_at_any_instant_leaves_all_of_it_or_nothing(shared_url: str) -> None:
    _four_turns(shared_url)
    with tl.open_store(shared_url) as store:
        parent = store.messages(ORIGIN)
        records = {r.tool_use_id: r for r in store.ledger(ORIGIN).records()}
    rng = random.Random(15)
    start = 0
    for _ in range(6):
        pid = os.fork()
        if pid == 0:
            try:
                with tl.open_store(shared_url) as store:
                    for i in range(start, start + 10_000):
                        tl.fork(store, ORIGIN, at_turn=2, new_session=f"k-{i:05d}")
            finally:
                os._exit(0)
        _kill_soon(pid, rng)
        with tl.open_store(shared_url) as store:
            forks = [s for s in store.sessions() if s.startswith("k-")]
            start = len(forks) + 1
    with tl.open_store(shared_url) as store:
        forks = [s for s in store.sessions() if s.startswith("k-")]
        assert len(forks) >= 6, "the forks ran before they were killed"
        for sid in forks:
            state = store.session(sid)
            assert state is not None, f"{sid}: records without a session"
            messages = store.messages(sid)
            # Nothing after turn 2 took effect (the refund was declined): no note.
            assert messages == parent[:5] and state.messages == 5
            # Every call of its lineage, copied whole (docs/design.md, rule 19): each record, and
            # each call asked for and never recorded (a safe tool's failure) as not having happened.
            copies = {r.tool_use_id: r for r in store.ledger(sid).records()}
            asked = {i for m in parent for i in _ids(m)}
            assert set(copies) == asked and set(records) < asked
            assert all(r.session_id == sid and r.origin == ORIGIN for r in copies.values())
            assert all(
                r.status is tl.Status.NOT_HAPPENED for i, r in copies.items() if i not in records
            )
        assert [p for p in verify(store) if p.severity is Severity.ERROR] == []


def test_a_rewind_killed_at_any_instant_leaves_the_session_whole(shared_url: str) -> None:
    _four_turns(shared_url)
    rng = random.Random(16)
    for _ in range(6):
        pid = os.fork()
        if pid == 0:
            try:
                with tl.open_store(shared_url) as store:
                    for _ in range(10_000):  # each abandons the last note: a branch of one
                        tl.rewind(store, ORIGIN, to_turn=1)
            finally:
                os._exit(0)
        _kill_soon(pid, rng)
    with tl.open_store(shared_url) as store:
        state = store.session(ORIGIN)
        assert state is not None
        messages = store.messages(ORIGIN)
        assert len(messages) == state.messages == 4 and state.turns == 1
        abandoned = store.abandoned(ORIGIN)
        branches = [b.branch for b in state.lineage]
        assert branches == list(range(1, len(branches) + 1)) and len(branches) >= 6
        assert sorted(abandoned) == branches
        assert len(abandoned[1]) == 5 and all(len(abandoned[n]) == 1 for n in branches[1:])
        assert [p for p in verify(store) if p.severity is Severity.ERROR] == []


def _ids(m: StoredMessage) -> list[str]:
    if m.role != "assistant" or not isinstance(m.content, list):
        return []
    return [b["id"] for b in m.content if b.get("type") == "tool_use"]
