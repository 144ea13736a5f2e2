"""A ``started`` record: in progress elsewhere (refuse) or in doubt (rule 6)?"""

from __future__ import annotations

import multiprocessing
import os
import socket
import time
from dataclasses import replace

import pytest

import toolledger as tl
from toolledger.codec import input_hash
from toolledger.leases import claim_is_live
from toolledger.records import EffectRecord, Status
from toolledger.stores.base import InsertEffect

from .conftest import tool_use
from .test_in_doubt import crash_left_started

HOST = socket.gethostname()


def started_by(worker: str, *, at: float) -> EffectRecord:
    return EffectRecord(
        session_id="s",
        tool_use_id="t",
        tool="send",
        input_hash="h",
        status=Status.STARTED,
        attempt=1,
        created_at=at,
        updated_at=at,
        worker=worker,
    )


def dead_pid() -> int:
    child = multiprocessing.get_context("fork").Process(target=os._exit, args=(0,))
    child.start()
    child.join()
    assert child.pid is not None
    return child.pid


def test_claims_by_processes_of_this_host_are_checked_exactly() -> None:
    now = time.time()
    assert claim_is_live(started_by(f"{HOST}:{os.getppid()}:x", at=0), now=now, claim_timeout=1)
    assert not claim_is_live(
        started_by(f"{HOST}:{dead_pid()}:x", at=now), now=now, claim_timeout=1e9
    )
    assert not claim_is_live(
        started_by(f"{HOST}:{os.getpid()}:x", at=now), now=now, claim_timeout=1e9
    ), "this process is not running it"


def test_claims_from_other_hosts_age_into_doubt() -> None:
    now = time.time()
    assert claim_is_live(started_by("far-away:12:x", at=now - 10), now=now, claim_timeout=300)
    assert not claim_is_live(started_by("far-away:12:x", at=now - 301), now=now, claim_timeout=300)


def test_a_call_running_in_another_live_process_is_refused(ledger: tl.Ledger) -> None:
    record = replace(
        started_by(f"{HOST}:{os.getppid()}:x", at=time.time()),
        session_id=ledger.session_id,
        input_hash=input_hash({"to": "a"}),
    )
    ledger.store.backend.apply(ledger.session_id, [InsertEffect(record)])

    @tl.tool
    def send(to: str) -> str:
        raise AssertionError("must not run")

    with pytest.raises(tl.EffectInProgressError) as info:
        tl.run_tool_uses([tool_use("t", "send", to="a")], [send], ledger=ledger)
    assert info.value.holder == f"{HOST}:{os.getppid()}:x"


def test_an_old_foreign_claim_is_in_doubt(ledger: tl.Ledger) -> None:
    crash_left_started(ledger, "send", "t", to="a")  # worker "dead-worker", written long ago

    @tl.tool
    def send(to: str) -> str:
        raise AssertionError("must not run")

    (result,) = tl.run_tool_uses([tool_use("t", "send", to="a")], [send], ledger=ledger)
    assert result["is_error"] and "may already have happened" in result["content"]
