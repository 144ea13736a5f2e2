"""What one simulated run holds and how hard it is shaken: ``SimConfig``."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SimConfig"]


@dataclass(frozen=True)
class SimConfig:
    """What one simulated run holds and how hard it is shaken."""

    hosts: int = 2  # distinct hosts
    containers: int = 1  # process tables (PID namespaces) per host
    processes: int = 3  # worker processes at any time
    threads: int = 2  # workers per process
    sessions: int = 4
    kinds: tuple[str, ...] = ("plain", "checked", "keyed", "idempotent", "read_only", "high_impact")
    chaos_steps: int = 3_000  # steps with faults, then a quiet phase until every session ends
    max_steps: int = 30_000
    lease_ttl: float = 1.0
    tool_timeout: float = 2.0
    max_offset: float = 120.0  # a host's clock is off by up to this many seconds
    crash: float = 0.002  # per step: the chance of each fault
    pause: float = 0.003
    partition: float = 0.002
    lost_reply: float = 0.0  # a commit lands but its answer is lost
    op_timeout: float = 0.3  # a store operation cut off by the network hangs this long, then fails
    operator: float = 0.01
    force: float = 0.0  # an operator forcing a resolution of a running call
    sloppy: float = 0.0  # a process whose tools send past their deadline
    duplicate_delivery: float = 0.2  # a worker runs a session's pending calls by run_tool_uses
    # Where liveness can be fooled (toolledger._liveness._procview, docs/design.md, rule 18):
    proc_modes: tuple[str, ...] = ("own",)  # each table's /proc: own | none | hidden | host
    uids: int = 1  # processes run as one of this many uids (a hidden /proc hides the others)
    time_namespaces: float = 0.0  # the chance a process runs in a time namespace of its own
    store_clock: str = "server"  # server: one clock (PostgreSQL's); local: each host's; either
    clock_step: float = 0.0  # per step: the chance a host's clock steps (±40 s or ±600 s)
    branch: float = 0.003  # per step: the operator forks or rewinds a session (_branches)
    blanket_yes: float = 0.2  # the share of processes whose approver says yes to everything
