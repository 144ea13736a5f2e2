"""A process table that cannot be read, is hidden, or belongs to someone else: toolledger must
never take "I cannot see it" for "it has ended" (docs/design.md, rule 18).

Worker A enters a non-idempotent tool (with a ``check``) and holds there, alive; worker B comes
for the same call. B must leave it alone — a second ticket in the world is the failure. Then A
finishes: one ticket.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import toolledger as tl
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

from .harness import (
    PLAIN,
    SESSION,
    TOOL_USE_ID,
    Workers,
    container,
    hidden_proc,
    no_proc,
    pid_namespace_seeing_the_hosts_proc,
    require,
    time_namespace,
    wait_entered,
    world,
)

pytestmark = pytest.mark.slow

TOOLLEDGER = str(Path(sys.executable).with_name("toolledger"))


def _script() -> list[Reply]:
    return [
        Reply(tool_uses=[ToolUse("create_ticket", {"title": "outage"}, id=TOOL_USE_ID)]),
        Reply(text="Ticket opened."),
    ]


def _store_url(kind: str, request: pytest.FixtureRequest) -> str | None:
    if kind != "postgres":
        return None
    url: str = request.getfixturevalue("postgres_store_url")
    return url


def _refused_to_run(b: dict[str, object], mode: str) -> None:
    if mode == "ledger":
        assert b.get("error") == "EffectInProgressError", b
    else:
        assert b.get("error") == "SessionBusyError", b


@pytest.mark.parametrize("mode", ["ledger", "agent"])
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_without_a_readable_proc_a_running_call_runs_once(
    kind: str, mode: str, workers: Workers, request: pytest.FixtureRequest
) -> None:
    """Point 1: no /proc (macOS, Windows, a masked /proc). The worker cannot name itself; that
    is an unknown identity, judged by its lease and deadline — not an attempt given up."""
    require([*no_proc(), "true"], "no /proc")
    with ScriptedModel(_script()) as model, world(kind, _store_url(kind, request)) as w:
        common = {"place": no_proc(), "mode": mode, "model_url": model.url, "lease_ttl": 2.0}
        a = workers.spawn(w, "a", **common)
        wait_entered(w, a)
        b = workers.spawn(w, "b", **common).result()
        _refused_to_run(b, mode)
        w.go()
        first = a.result()
        assert first.get("status") in ("ok", "completed"), first
        assert len(w.tickets) == 1, w.tickets
        with tl.open_store(w.store) as store:
            (record,) = store.ledger(SESSION).records()
            assert record.status is tl.Status.SUCCEEDED


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_hidden_proc_never_makes_another_uid_s_worker_dead(
    kind: str, workers: Workers, request: pytest.FixtureRequest
) -> None:
    """Point 2: /proc mounted hidepid=2; A and B (and the operator) run as different uids, so
    neither can read the other's entry. B must not run the call again, and the operator's
    ``resolve --not-happened`` must be refused while A runs."""
    require([*hidden_proc(64000), "true"], "hidden /proc across uids")
    with world(kind, _store_url(kind, request)) as w:
        a = workers.spawn(w, "a", place=hidden_proc(64001))
        wait_entered(w, a)
        b = workers.spawn(w, "b", place=hidden_proc(64002)).result()
        assert b.get("error") == "EffectInProgressError", b
        resolve = subprocess.run(
            [
                *hidden_proc(64003),
                TOOLLEDGER,
                "--store",
                w.store,
                "resolve",
                SESSION,
                TOOL_USE_ID,
                "--not-happened",
                "--by",
                "ops",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
            env={**os.environ, "USER": "ops"},
        )
        assert resolve.returncode != 0, resolve.stdout
        assert "in progress" in resolve.stdout + resolve.stderr, resolve
        w.go()
        assert a.result().get("status") == "ok"
        assert len(w.tickets) == 1, w.tickets
        with tl.open_store(w.store) as store:
            (record,) = store.ledger(SESSION).records()
            assert record.status is tl.Status.SUCCEEDED


def test_a_time_namespace_never_makes_a_live_worker_look_ended(workers: Workers) -> None:
    """Point 3: A runs in a time namespace whose boot-time clock is 5000 s ahead, so the start
    time /proc shows for it differs by 5000 s between A and B. A live A is still A."""
    require([*time_namespace(5000), "true"], "time namespaces")
    with world("sqlite") as w:
        a = workers.spawn(w, "a", place=time_namespace(5000))
        wait_entered(w, a)
        b = workers.spawn(w, "b", place=PLAIN).result()
        assert b.get("error") == "EffectInProgressError", b
        listed = subprocess.run(
            [TOOLLEDGER, "--store", w.store, "resolve", SESSION, TOOL_USE_ID, "--not-happened"],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert listed.returncode != 0, listed.stdout
        assert "has ended" not in listed.stdout + listed.stderr
        w.go()
        assert a.result().get("status") == "ok"
        assert len(w.tickets) == 1, w.tickets


def test_a_pid_namespace_without_its_own_proc_frees_a_dead_worker_s_session(
    workers: Workers,
) -> None:
    """Point 4: ``unshare --pid`` without ``--mount-proc``. A's pid in its namespace (2) names
    another process in the /proc it sees (the host's pid 2, alive for ever). A is SIGKILLed in
    its tool; B, in the same namespace, must get the session within about one lease TTL (and
    then find the call in doubt, check it and run it: one ticket)."""
    place = pid_namespace_seeing_the_hosts_proc()
    require(["unshare", "--pid", "--fork", "true"], "PID namespaces")
    ttl = 2.0
    with ScriptedModel(_script()) as model, world("sqlite") as w:
        a = workers.spawn(
            w,
            "a",
            place=place,
            mode="agent",
            model_url=model.url,
            lease_ttl=ttl,
            tool_timeout=3.0,
            then={"retry_busy": 40.0, "retry_on": ["SessionBusyError", "EffectInProgressError"]},
        )
        entered = wait_entered(w, a)
        assert entered["pid"] < 10, entered  # its pid in the namespace is tiny
        assert entered["proc_self"] != str(entered["pid"]), entered  # /proc is the host's
        os.kill(int(entered["proc_self"]), signal.SIGKILL)
        assert a.then is not None
        b = a.then.result(timeout=120)
        assert b.get("status") == "completed", b
        # One lease TTL of watching, then the call's 3 s deadline; generous for a loaded host.
        assert b["took"] < ttl + 3.0 + 10.0, b
        assert len(w.tickets) == 1, w.tickets


def test_an_operator_gets_the_same_verdicts(workers: Workers) -> None:
    """While worker A (in a container: its process table is not this one's) runs its call and
    renews its lease, ``resolve --not-happened`` is refused, having seen the renewal. Once A is
    dead, ``in-doubt --watch`` lists the call in doubt and ``resolve`` settles it — nothing ran
    twice, nothing was settled while it could still take effect."""
    require([*container(), "true"], "containers (PID namespaces)")
    with ScriptedModel(_script()) as model, world("sqlite") as w:
        a = workers.spawn(
            w,
            "a",
            place=container(),
            mode="agent",
            model_url=model.url,
            lease_ttl=2.0,
            tool_timeout=3.0,
        )
        wait_entered(w, a)

        def cli(*argv: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [TOOLLEDGER, "--store", w.store, *argv],
                capture_output=True,
                text=True,
                check=False,
                timeout=120,
                env={**os.environ, "USER": "ops"},
            )

        refused = cli("resolve", SESSION, TOOL_USE_ID, "--not-happened")
        assert refused.returncode != 0, refused.stdout
        assert "renewed" in refused.stdout + refused.stderr, refused
        a.kill()
        listed = cli("in-doubt", "--watch", "20", "--json")
        (row,) = json.loads(listed.stdout)
        assert (row["tool_use_id"], row["state"]) == (TOOL_USE_ID, "in_doubt"), row
        settled = cli("resolve", SESSION, TOOL_USE_ID, "--not-happened")
        assert settled.returncode == 0, settled
        assert w.tickets == []
        with tl.open_store(w.store) as store:
            (record,) = store.ledger(SESSION).records()
            assert record.status is tl.Status.NOT_HAPPENED
