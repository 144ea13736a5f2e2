"""The torture harness behind ``python -m toolledger._harness.torture``: what it does and checks
is told there. Here: the report, the world, one scripted model for every session, the loop that
forks, kills, resumes and settles, and the stores it makes per session."""

from __future__ import annotations

import contextlib
import random
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from .._crash import POINTS
from .._verify import verify
from ..adapters.anthropic import read_tool_uses
from ..records import RunStatus
from ..stores import Store, open_store
from ..tools import ToolSet
from ._forked import HUNG, KILLED, Attempt, spawn
from ._invariants import Checks, Evidence, check_session
from ._report import summary_lines, violation_lines
from ._run_setup import BACKENDS, admin_url, check_backend, drop_schema, scratch_dir, store_url
from ._torture_script import Call, ScriptModel, TortureWorld, child, new_script, prompt_of

__all__ = ["BACKENDS", "TortureReport", "TortureWorld", "run_torture"]

MAX_RUNS_PER_SESSION = 40  # kills + resolutions + the last run; far more means it is stuck
RUN_TIMEOUT_S = 60.0


@dataclass
class TortureReport:
    """What one torture run did and found. ``violations`` is empty when the promise held."""

    backend: str
    seed: int
    kills: int = 0
    kills_at_random_instant: int = 0
    kills_at_crash_point: int = 0
    kills_by_moment: Counter[str] = field(default_factory=Counter)
    runs: int = 0
    sessions: int = 0
    tool_calls: int = 0
    effects_checked: int = 0
    resolutions: int = 0
    invariants_checked: int = 0
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        rows = [
            ("backend", self.backend),
            ("seed", str(self.seed)),
            (
                "kills survived",
                f"{self.kills:,} ({self.kills_at_random_instant:,} at a random instant, "
                f"{self.kills_at_crash_point:,} at a named crash point)",
            ),
            *((f"  …left {k}", f"{n:,}") for k, n in sorted(self.kills_by_moment.items())),
            ("sessions", f"{self.sessions:,}"),
            ("agent runs", f"{self.runs:,}"),
            ("tool calls", f"{self.tool_calls:,}"),
            ("effects checked", f"{self.effects_checked:,} (ticket files counted in the world)"),
            ("in-doubt resolutions", f"{self.resolutions:,} (settled from the world's evidence)"),
            ("invariant checks", f"{self.invariants_checked:,}"),
            ("violations", f"{len(self.violations):,}"),
            ("time", f"{self.seconds:,.1f} s"),
        ]
        lines = summary_lines("torture", self.ok, rows)
        return "\n".join(lines + violation_lines(self.violations))


# -- stores ------------------------------------------------------------------------------------


class _Backend:
    """Creates a fresh store per session, and removes it."""

    def __init__(self, kind: str, root: Path, postgres_url: str | None) -> None:
        check_backend(kind)
        self.kind = kind
        self.root = root
        self.postgres_url = admin_url(postgres_url)
        # This run's own schemas: another run on the same database at the same time, or one
        # killed before it could drop its schemas, must never share a session's store.
        self.run = uuid.uuid4().hex[:10]

    def url(self, session: str) -> str:
        return store_url(self.kind, self.root / session, self.postgres_url, self._schema(session))

    def _schema(self, session: str) -> str:
        return f"tl_torture_{self.run}_{session.replace('-', '_')}"

    def remove(self, session: str) -> None:
        shutil.rmtree(self.root / session, ignore_errors=True)
        if self.kind == "postgres":
            drop_schema(self.postgres_url, self._schema(session))


# -- the harness -------------------------------------------------------------------------------


@dataclass
class _Session:
    name: str
    script: list[list[Call]]
    world: TortureWorld
    store_url: str
    tools: ToolSet
    not_happened: Counter[str] = field(default_factory=Counter)  # tool_use_id -> resolutions
    problems: list[str] = field(default_factory=list)


class _Harness:
    def __init__(
        self,
        report: TortureReport,
        *,
        rng: random.Random,
        backend: _Backend,
        model: ScriptModel,
        client: Any,
        crash_point_fraction: float,
        max_kills_per_session: int,
    ) -> None:
        self.report = report
        self.rng = rng
        self.backend = backend
        self.model = model
        self.client = client
        self.crash_point_fraction = crash_point_fraction
        self.max_kills = max_kills_per_session
        self.seconds_per_turn = 0.05  # recalibrated from every run that was not killed

    def session(self, number: int, kills_left: int) -> int:
        """Play one session to the end; returns the kills it took."""
        name = f"s{number:06d}"
        world = TortureWorld(self.backend.root / name / "world")
        s = _Session(
            name=name,
            script=new_script(self.rng),
            world=world,
            store_url=self.backend.url(name),
            tools=world.toolset(),
        )
        self.model.scripts[prompt_of(name)] = s.script
        rejected_before = len(self.model.rejected)
        target = min(self.rng.randint(0, self.max_kills), kills_left)
        killed = 0
        finished = False
        for _ in range(MAX_RUNS_PER_SESSION):
            crash_at, kill_after = self._plan(s) if killed < target else (None, None)
            attempt = spawn(
                partial(child, s.store_url, self.client, s.tools, name, crash_at),
                kill_after=kill_after,
                timeout=RUN_TIMEOUT_S,
            )
            self.report.runs += 1
            if attempt.exit_code == KILLED:
                killed += 1
                self.report.kills += 1
                if crash_at is not None:
                    self.report.kills_at_crash_point += 1
                else:
                    self.report.kills_at_random_instant += 1
                self.report.kills_by_moment[self._moment(s)] += 1
                continue
            finished = self._after_run(s, attempt)
            if finished or s.problems:
                break
        else:
            s.problems.append(f"did not finish in {MAX_RUNS_PER_SESSION} runs")
        if finished:
            self._check(s)
        s.problems += self.model.rejected[rejected_before:]
        self.model.scripts.pop(prompt_of(name), None)
        self.model.requests.clear()
        self.report.sessions += 1
        if s.problems:
            self.report.violations += [f"{name} ({s.store_url}): {p}" for p in s.problems]
        else:
            self.backend.remove(name)
        return killed

    def _plan(self, s: _Session) -> tuple[str | None, float | None]:
        if self.rng.random() < self.crash_point_fraction:
            return f"{self.rng.choice(POINTS)}:{self.rng.randint(1, 3)}", None
        # A whole run: starting up, then each turn (with its commits and tools).
        expected = self.seconds_per_turn * (len(s.script) + 2)
        return None, self.rng.uniform(0.0, expected)

    def _moment(self, s: _Session) -> str:
        """Where a kill left the session, as the store shows it."""
        with open_store(s.store_url) as store:
            state = store.session(s.name)
            if state is None:
                return "no session yet"
            last = store.messages(s.name, state.messages - 1)
            if not (last and last[0].role == "assistant" and read_tool_uses(last[0].content)):
                return "between turns"
            if store.ledger(s.name).in_doubt():
                return "a turn's calls pending, a call in doubt"
            return "a turn's calls pending, none in doubt"

    def _after_run(self, s: _Session, attempt: Attempt) -> bool:
        """A run that was not killed: True when the session completed."""
        out = attempt.result
        if attempt.exit_code == HUNG:
            s.problems.append(f"an agent run hung for {RUN_TIMEOUT_S:.0f} s and was killed")
            return False
        if attempt.exit_code != 0 or out is None:
            s.problems.append(f"an agent run exited with code {attempt.exit_code}")
            return False
        self.seconds_per_turn = 0.9 * self.seconds_per_turn + 0.1 * (
            attempt.seconds / (len(s.script) + 2)
        )
        if "error" in out:
            s.problems.append(f"a run raised {out['error']}: {out['message']}")
            return False
        status = RunStatus(out["status"])
        if status is RunStatus.COMPLETED:
            return True
        if status is not RunStatus.NEEDS_ATTENTION or not out.get("reason"):
            s.problems.append(f"a run ended {status.value} ({out.get('reason')!r})")
            return False
        self._resolve(s, out["reason"])
        return False

    def _resolve(self, s: _Session, reason: str) -> None:
        """Play the person: settle each in-doubt call from the world's evidence."""
        with open_store(s.store_url) as store:
            ledger = store.ledger(s.name)
            doubts = ledger.in_doubt()
            if not doubts:
                s.problems.append(f"needs_attention with nothing in doubt: {reason}")
                return
            calls = _calls(store, s.name)
            tickets = {str(t.get("title")): t for t in s.world.tickets()}
            for record in doubts:
                title = calls[record.tool_use_id].input.get("title", "")
                found = tickets.get(title)
                if found is not None:
                    ledger.resolve(record.tool_use_id, happened=True, result=found, by="torture")
                else:
                    ledger.resolve(record.tool_use_id, happened=False, by="torture")
                    s.not_happened[record.tool_use_id] += 1
                self.report.resolutions += 1

    def _check(self, s: _Session) -> None:
        """The invariants (``_invariants.check_session``), from the world and the store."""
        with open_store(s.store_url) as store:
            state = store.session(s.name)
            evidence = Evidence(
                status=state.status if state else None,
                messages=store.messages(s.name),
                records={r.tool_use_id: r for r in store.ledger(s.name).records()},
                verify_problems=[p.message for p in verify(store)],
                tickets=s.world.titles(),
                plain_runs=Counter(e["tool_use_id"] for e in s.world.executions("create_ticket")),
            )
        checks = Checks()
        tally = check_session(
            evidence,
            script_titles=[c.title for turn in s.script for c in turn if c.kind != "read_only"],
            reruns_allowed=s.not_happened,
            checks=checks,
        )
        s.problems += checks.failed
        self.report.invariants_checked += checks.count
        self.report.tool_calls += tally.tool_calls
        self.report.effects_checked += tally.effects


def _calls(store: Store, session: str) -> dict[str, Any]:
    return {
        c.tool_use_id: c
        for m in store.messages(session)
        if m.role == "assistant"
        for c in read_tool_uses(m.content)
    }


@contextlib.contextmanager
def _workdir(directory: str | Path | None, report: TortureReport) -> Iterator[Path]:
    """``directory``, or a temporary one that is removed unless a session failed in it."""
    if directory is not None:
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with scratch_dir("toolledger-torture-", lambda: report.ok) as path:
        yield path


def run_torture(
    *,
    kills: int,
    backend: str = "sqlite",
    seed: int | None = None,
    directory: str | Path | None = None,
    postgres_url: str | None = None,
    crash_point_fraction: float = 0.2,
    max_kills_per_session: int = 4,
    progress: Callable[[TortureReport], None] | None = None,
) -> TortureReport:
    """Kill agent sessions ``kills`` times in all and check every session; see the module doc.

    Sessions live under ``directory`` (default: a temporary directory); a session that passed is
    removed, one that failed is kept for inspection.
    ``progress`` is called after every session. Stops early after 20 violations.
    """
    import anthropic

    seed = random.SystemRandom().randrange(2**32) if seed is None else seed
    report = TortureReport(backend=backend, seed=seed)
    started = time.perf_counter()
    with _workdir(directory, report) as root, ScriptModel() as model:
        client = anthropic.Anthropic(
            base_url=model.url, api_key="scripted", max_retries=0, timeout=RUN_TIMEOUT_S
        )
        harness = _Harness(
            report,
            rng=random.Random(seed),  # noqa: S311 - a reproducible test schedule, not a secret
            backend=_Backend(backend, root, postgres_url),
            model=model,
            client=client,
            crash_point_fraction=crash_point_fraction,
            max_kills_per_session=max_kills_per_session,
        )
        number = 0
        while report.kills < kills and len(report.violations) < 20:
            harness.session(number, kills - report.kills)
            number += 1
            report.seconds = time.perf_counter() - started
            if progress is not None:
                progress(report)
    report.seconds = time.perf_counter() - started
    return report
