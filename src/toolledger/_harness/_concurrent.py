"""The concurrency torture behind ``python -m toolledger._harness.concurrent_torture``: what it does
and checks is told there. Here: the report, the store of the run, and the run itself — the chaos
(``_concurrent_chaos``) with the operator acting beside it (``_concurrent_operator``), the quiet
phase, the checks (``_concurrent_checks``). The world, the tools and the model are in
``_concurrent_world``, the worker processes in ``_concurrent_worker``.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from .._liveness import this_process
from .._verify import Severity, verify
from ..stores import open_store
from ._concurrent_chaos import Chaos
from ._concurrent_checks import check_run
from ._concurrent_evidence import Evidence, SessionEvidence
from ._concurrent_operator import Operator, Pool
from ._concurrent_report import ConcurrentReport
from ._concurrent_worker import Shared
from ._concurrent_world import ScriptServer, SharedWorld
from ._run_setup import admin_url, check_backend, drop_schema, scratch_dir, store_url

__all__ = ["ConcurrentReport", "run_concurrent_torture"]

MAX_TURNS = 3
LEASE_TTLS = (0.5, 0.75, 1.0)
TIMEOUTS = (0.5, 0.75, 1.0, 1.5, 2.0)
QUIET_LIMIT_S = 120.0  # the quiet phase gives up after this long


class _Backend:
    def __init__(self, kind: str, root: Path, postgres_url: str | None, seed: int) -> None:
        check_backend(kind)
        self.kind = kind
        self.admin = admin_url(postgres_url)
        self.schema = f"tl_concurrent_{seed}_{os.getpid()}"
        self.url = store_url(kind, root, self.admin, self.schema)

    def drop(self) -> None:
        if self.kind == "postgres":
            drop_schema(self.admin, self.schema)


# -- the run --------------------------------------------------------------------------------------


@contextlib.contextmanager
def _workdir(directory: str | Path | None, report: ConcurrentReport) -> Iterator[Path]:
    if directory is not None:
        path = Path(directory) / f"concurrent-{report.backend}-{report.seed}"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        yield path
        return
    with scratch_dir("toolledger-concurrent-", lambda: report.ok) as path:
        yield path


def run_concurrent_torture(
    *,
    seconds: float = 30.0,
    backend: str = "sqlite",
    seed: int | None = None,
    workers: int = 4,
    other_hosts: int = 1,
    sessions: int = 12,
    duplicate_fraction: float = 0.2,
    directory: str | Path | None = None,
    postgres_url: str | None = None,
    worker_setup: Callable[[], None] | None = None,
    progress: Callable[[ConcurrentReport], None] | None = None,
) -> ConcurrentReport:
    """Run ``workers`` worker processes on one shared store for ``seconds`` of chaos, then drive
    every session to its end and check the world; see ``toolledger._harness.concurrent_torture``.

    ``other_hosts`` of the worker processes act as other hosts (a ``TOOLLEDGER_HOST_ID`` of
    their own); ``sessions`` are kept on offer at once; ``duplicate_fraction`` of the workers'
    turns hand a session's pending calls to ``run_tool_uses`` again instead of running it.
    ``worker_setup`` is called in each worker process once it has forked (to patch a broken
    build in, say). ``progress`` is called with the report every 10 s of chaos. The run's files
    live under ``directory`` (default: a temporary directory, removed unless the run failed).
    """
    import anthropic  # noqa: F401 - imported once here, inherited by every forked worker

    if not 0 <= other_hosts <= workers or workers < 2:
        raise ValueError("need at least 2 workers, and at most that many as other hosts")
    seed = random.SystemRandom().randrange(2**32) if seed is None else seed
    rng = random.Random(seed)  # noqa: S311 - a reproducible test schedule, not a secret
    report = ConcurrentReport(backend=backend, seed=seed, chaos_seconds=seconds)
    started = time.perf_counter()
    holder = this_process().holder
    this_host = holder.host if holder else ""
    with _workdir(directory, report) as root, ScriptServer(MAX_TURNS) as model:
        store_of = _Backend(backend, root, postgres_url, seed)
        world = SharedWorld(root / "world")
        report.lease_ttl = rng.choice(LEASE_TTLS)
        report.tool_timeouts = {
            t: rng.choice(TIMEOUTS)
            for t in (
                "create_ticket",
                "create_ticket_checked",
                "create_ticket_keyed",
                "ensure_ticket",
                "open_incident",
                "list_tickets",
            )
        }
        shared = Shared(
            store_url=store_of.url,
            model_url=model.url,
            world=world,
            tools=world.toolset(report.tool_timeouts),
            lease_ttl=report.lease_ttl,
            duplicate_fraction=duplicate_fraction,
            setup=worker_setup,
        )
        open_store(store_of.url).close()  # created (and migrated) once, before anyone races
        pool = Pool(world, model, random.Random(rng.randrange(2**32)), target=sessions)  # noqa: S311
        operator = Operator(shared, pool, random.Random(rng.randrange(2**32)), report)  # noqa: S311
        try:
            pool.fill(operator.store)
            chaos = Chaos(
                report,
                rng,
                shared,
                workers=workers,
                other_hosts=other_hosts,
                max_timeout=max(report.tool_timeouts.values()),
                this_host=this_host,
                forking=operator.forking,
            )
            stop = threading.Event()
            acting = threading.Thread(target=operator.loop, args=(stop,), daemon=True)
            acting.start()
            try:
                chaos.run(seconds, progress)
            finally:
                stop.set()
                chaos.stop()  # first: the operator may be waiting on a paused worker's lock
                acting.join()
            report.phases["chaos"] = time.perf_counter() - started
            operator.finish(QUIET_LIMIT_S)
            report.phases["quiet"] = time.perf_counter() - started - report.phases["chaos"]
            _check(
                report,
                operator=operator,
                chaos=chaos,
                model=model,
                this_host=this_host,
                other_hosts=other_hosts,
            )
            report.phases["checks"] = time.perf_counter() - started - sum(report.phases.values())
        finally:
            operator.store.close()
            report.seconds = time.perf_counter() - started
            if report.ok:
                store_of.drop()
            else:
                report.kept = str(root) + (
                    f" (and schema {store_of.schema})" if backend == "postgres" else ""
                )
    return report


def _check(
    report: ConcurrentReport,
    *,
    operator: Operator,
    chaos: Chaos,
    model: ScriptServer,
    this_host: str,
    other_hosts: int,
) -> None:
    store = operator.store
    world = operator.shared.world
    sessions: dict[str, SessionEvidence] = {}
    for sid in sorted(operator.pool.scripts):
        state = store.session(sid)
        sessions[sid] = SessionEvidence(
            status=state.status if state else None,
            messages=store.messages(sid),
            records={r.tool_use_id: r for r in store.ledger(sid).records()},
        )
    events = world.events()
    evidence = Evidence(
        this_host=this_host,
        other_hosts=other_hosts,
        sessions=sessions,
        scripts=operator.pool.scripts,
        tickets=world.tickets(),
        events=events,
        workers=dict(chaos.all),
        actions=operator.actions,
        verify_errors=[p.message for p in verify(store) if p.severity is Severity.ERROR],
        rejected=list(model.rejected),
    )
    found = check_run(evidence)
    report.sessions = len(sessions)
    report.runs = Counter(str(e["what"]) for e in events if e["ev"] == "run")
    report.alerts = Counter(str(e["type"]) for e in events if e["ev"] == "alert")
    report.store_errors += sum(1 for e in events if e["ev"] == "store_error")
    report.tool_calls = found.tool_calls
    report.executions = found.executions
    report.effects_checked = found.effects
    report.late_effects = found.late_effects
    report.late_outcomes = found.late_outcomes
    report.cut_off = found.cut_off
    report.settled_elsewhere_past_deadline = found.settled_elsewhere_past_deadline
    report.judged_ended = found.judged_ended
    report.not_executed = found.not_executed
    report.invariants_checked = found.checks.count
    report.violations += found.checks.failed
