"""What a concurrency torture run leaves for its checks (``_concurrent_checks``): the processes
and the operator's actions as the harness saw them, each session as the store shows it, the
world's tickets and execution log — and what the checks count beside the violations."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..records import EffectRecord, RunStatus, StoredMessage
from ._concurrent_world import Call
from ._invariants import Checks

__all__ = ["Action", "Evidence", "Findings", "SessionEvidence", "WorkerInfo"]


@dataclass(slots=True, kw_only=True)
class WorkerInfo:
    """One process of the run, as the harness saw it."""

    serial: str
    pid: int
    host: str
    offset: float
    threads: int
    started: float
    ended: float | None = None  # time.time() when it was killed or found exited
    killed: bool = False
    exit_code: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    """Something the harness's operator (a person, on this host) did, between ``t0`` and ``t1``."""

    kind: str  # "resolve" | "approve"
    sid: str
    tid: str
    t0: float
    t1: float
    ok: bool
    attempt: int | None = None  # resolve: the attempt it settled
    happened: bool | None = None
    in_doubt: bool | None = None  # approve: a re-run of an in-doubt call
    error: str | None = None
    quiet: bool = False  # after the chaos


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionEvidence:
    status: RunStatus | None
    messages: list[StoredMessage]
    records: dict[str, EffectRecord]


@dataclass(slots=True, kw_only=True)
class Evidence:
    this_host: str
    other_hosts: int
    sessions: dict[str, SessionEvidence]
    scripts: dict[str, list[list[Call]]]
    tickets: list[dict[str, Any]]
    events: list[dict[str, Any]]
    workers: dict[str, WorkerInfo]
    actions: list[Action]
    verify_errors: list[str]
    rejected: list[str]


@dataclass(slots=True, kw_only=True)
class Findings:
    """What the checks counted, beside the violations."""

    checks: Checks = field(default_factory=Checks)
    tool_calls: int = 0
    executions: int = 0
    effects: int = 0
    late_effects: int = 0  # a second ticket from an attempt that woke past its deadline, alerted
    late_outcomes: int = 0  # such an attempt's outcome, that added no ticket
    cut_off: int = 0  # such an attempt killed between its effect and its report: silent
    settled_elsewhere_past_deadline: int = 0  # settled while alive on another host, past deadline
    judged_ended: int = 0  # same-host "its process has ended" judgements, each held to the kill
    not_executed: list[str] = field(default_factory=list)  # calls answered "not executed"
