"""The torture harness behind ``python -m toolledger.testing.torture``: what it does and checks
is told there. Here: the report, the world, one scripted model for every session, the loop that
forks, kills, resumes and settles, and the stores it makes per session."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from .._crash import POINTS
from .._crash import arm as arm_crash
from ..adapters.anthropic import read_tool_uses
from ..records import RunStatus
from ..stores import Store, open_store
from ..tools import ToolSet
from ..verify import verify
from ._forked import HUNG, KILLED, Attempt, spawn
from ._invariants import Checks, Evidence, check_session
from .scripted import Reply, ScriptedModel, ToolUse
from .world import TOOL_OF_KIND, World

__all__ = ["BACKENDS", "TortureReport", "TortureWorld", "run_torture"]

BACKENDS = ("sqlite", "json", "postgres")
KINDS = ("plain", "checked", "keyed", "idempotent", "read_only")
POSTGRES_URL_ENV = "TOOLLEDGER_TEST_POSTGRES_URL"
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
MAX_TURNS = 4
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
        width = max(len(k) for k, _ in rows)
        lines = [f"toolledger torture: {'OK' if self.ok else 'VIOLATIONS FOUND'}"]
        lines += [f"  {k.ljust(width)}  {v}" for k, v in rows]
        lines += [f"  ! {v}" for v in self.violations[:50]]
        if len(self.violations) > 50:
            lines.append(f"  ! … and {len(self.violations) - 50} more")
        return "\n".join(lines)


# -- the world ---------------------------------------------------------------------------------


class TortureWorld(World):
    """``World`` with ticket creation that is atomic, as a real ticket API's is: the ticket is
    written whole to a temporary file and linked into place (``link`` fails if the name is
    taken). A kill cannot leave half a ticket, so a ticket file is an effect, whole."""

    def _write_ticket(self, name: str, ticket: dict[str, Any]) -> dict[str, Any] | None:
        path = self.path / "tickets" / f"{name}.json"
        tmp = path.with_name(f".{name}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_text(json.dumps(ticket))
        try:
            os.link(tmp, path)
        except FileExistsError:
            return None
        finally:
            tmp.unlink(missing_ok=True)
        return ticket

    def titles(self) -> Counter[str]:
        return Counter(str(t.get("title")) for t in self.tickets())


# -- scripts -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    kind: str
    title: str

    def tool_use(self) -> ToolUse:
        if self.kind == "read_only":
            return ToolUse("list_tickets", {})
        return ToolUse(TOOL_OF_KIND[self.kind], {"title": self.title})


def _script(rng: random.Random) -> list[list[_Call]]:
    return [
        [_Call(rng.choice(KINDS), f"t{turn}c{i}") for i in range(rng.randint(1, 3))]
        for turn in range(rng.randint(2, MAX_TURNS))
    ]


class _Model(ScriptedModel):
    """One scripted server for every session: the prompt names the session's script."""

    def __init__(self) -> None:
        self.scripts: dict[str, list[list[_Call]]] = {}
        super().__init__([self._step(i) for i in range(MAX_TURNS + 1)])

    def __enter__(self) -> _Model:
        return self.start()

    def _step(self, turn: int) -> Callable[[dict[str, Any]], Reply]:
        def reply(body: dict[str, Any]) -> Reply:
            prompt = body["messages"][0]["content"]
            script = self.scripts.get(prompt) if isinstance(prompt, str) else None
            if script is None or turn > len(script):
                with self._lock:
                    self.rejected.append(f"turn {turn + 1} asked beyond the script of {prompt!r}")
                return Reply(text="(beyond the script)")
            if turn == len(script):
                return Reply(text="All done.")
            return Reply(text=f"Turn {turn + 1}.", tool_uses=[c.tool_use() for c in script[turn]])

        return reply

    def start(self) -> _Model:
        super().start()
        assert self._server is not None
        # A child killed mid-request leaves a broken connection behind: expected, not news.
        self._server.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
        return self


def _child(store_url: str, client: Any, tools: ToolSet, session: str, crash_at: str | None) -> Any:
    """One ``Agent.run`` of ``session``, in the forked child."""
    from ..agent import Agent

    arm_crash(crash_at)  # what TOOLLEDGER_CRASH_AT does at import time
    try:
        with open_store(store_url) as store:
            agent = Agent(client=client, model="claude-scripted", tools=tools, store=store)
            run = agent.run(session=session, prompt=_prompt(session))
            return {"status": run.status.value, "reason": run.reason, "alerts": len(run.alerts)}
    except BaseException as exc:
        return {"error": type(exc).__name__, "message": str(exc)}


def _prompt(session: str) -> str:
    return f"torture session {session}: open the tickets the script asks for"


# -- stores ------------------------------------------------------------------------------------


class _Backend:
    """Creates a fresh store per session, and removes it."""

    def __init__(self, kind: str, root: Path, postgres_url: str | None) -> None:
        if kind not in BACKENDS:
            raise ValueError(f"unknown backend {kind!r}; one of {', '.join(BACKENDS)}")
        self.kind = kind
        self.root = root
        self.postgres_url = postgres_url or os.environ.get(POSTGRES_URL_ENV, DEFAULT_POSTGRES_URL)
        # This run's own schemas: another run on the same database at the same time, or one
        # killed before it could drop its schemas, must never share a session's store.
        self.run = uuid.uuid4().hex[:10]

    def url(self, session: str) -> str:
        if self.kind == "sqlite":
            return f"sqlite:///{self.root / session / 'ledger.db'}"
        if self.kind == "json":
            return f"json:///{self.root / session / 'ledger'}"
        sep = "&" if "?" in self.postgres_url else "?"
        return f"{self.postgres_url}{sep}schema={self._schema(session)}"

    def _schema(self, session: str) -> str:
        return f"tl_torture_{self.run}_{session.replace('-', '_')}"

    def remove(self, session: str) -> None:
        shutil.rmtree(self.root / session, ignore_errors=True)
        if self.kind == "postgres":
            import psycopg

            with psycopg.connect(self.postgres_url, autocommit=True) as admin:
                admin.execute(f'DROP SCHEMA IF EXISTS "{self._schema(session)}" CASCADE')


# -- the harness -------------------------------------------------------------------------------


@dataclass
class _Session:
    name: str
    script: list[list[_Call]]
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
        model: _Model,
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
            script=_script(self.rng),
            world=world,
            store_url=self.backend.url(name),
            tools=world.toolset(),
        )
        self.model.scripts[_prompt(name)] = s.script
        rejected_before = len(self.model.rejected)
        target = min(self.rng.randint(0, self.max_kills), kills_left)
        killed = 0
        finished = False
        for _ in range(MAX_RUNS_PER_SESSION):
            crash_at, kill_after = self._plan(s) if killed < target else (None, None)
            attempt = spawn(
                partial(_child, s.store_url, self.client, s.tools, name, crash_at),
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
        self.model.scripts.pop(_prompt(name), None)
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
            state = store.backend.read_session(s.name)
            if state is None:
                return "no session yet"
            last = store.backend.read_messages(s.name, state.messages - 1)
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
            state = store.backend.read_session(s.name)
            evidence = Evidence(
                status=state.status if state else None,
                messages=store.backend.read_messages(s.name),
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
        for m in store.backend.read_messages(session)
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
    path = Path(tempfile.mkdtemp(prefix="toolledger-torture-"))
    try:
        yield path
    finally:
        if report.ok:
            shutil.rmtree(path, ignore_errors=True)


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
    with _workdir(directory, report) as root, _Model() as model:
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
