"""What a bench run measured (``Results``), the table it is shown in (``Tab``), the targets it
is held against (``Target``), and how figures are written."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rich.table import Table

from .core import Statements
from .groupcommit import Cell
from .instructions import Counted
from .measure import Sample
from .pg import RoundTrips, Throughput
from .procs import Rate
from .scale import Lookup, SizeGroup


@dataclass
class Tab:
    title: str
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    sections: list[int] = field(default_factory=list)  # row indexes that start a new section

    def rich(self) -> Table:
        table = Table(title=self.title, title_justify="left")
        for i, h in enumerate(self.headers):
            table.add_column(h, justify="left" if i == 0 else "right")
        for i, row in enumerate(self.rows):
            if i in self.sections and i:
                table.add_section()
            table.add_row(*row)
        return table

    def markdown(self) -> str:
        out = [f"#### {self.title}", ""]
        out.append("| " + " | ".join(self.headers) + " |")
        out.append(
            "|" + "|".join("---" if i == 0 else "---:" for i in range(len(self.headers))) + "|"
        )
        out.extend(
            "| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in self.rows
        )
        out.extend(f"\n{n}" for n in self.notes)
        return "\n".join(out) + "\n"


def us(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}" if x >= 10 else f"{x:.2f}"


def ratio(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


@dataclass
class Target:
    what: str
    goal: str
    measured: str
    met: bool | None  # None: not measured in this run
    note: str = ""  # how it is measured, under the table


@dataclass
class Results:
    machine: dict[str, str]
    command: str
    seconds: float = 0.0
    main: list[Sample] = field(default_factory=list)
    sizes: list[SizeGroup] = field(default_factory=list)
    describe: dict[str, str] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    lookups: list[Lookup] = field(default_factory=list)
    longrun: list[Sample] = field(default_factory=list)
    long_start_turn: int = 0
    within_turn: list[Sample] = field(default_factory=list)
    concurrency: list[Cell] = field(default_factory=list)
    hot: list[Sample] = field(default_factory=list)
    cpu: list[Sample] = field(default_factory=list)
    cpu_where: str = ""
    micro: list[tuple[str, float]] = field(default_factory=list)
    scripted: list[Sample] = field(default_factory=list)
    json_store: list[Sample] = field(default_factory=list)
    turn_commits: tuple[float, float] = (0.0, 0.0)  # per tool turn, per run
    turn_statements: Statements | None = None
    callers: list[Cell] = field(default_factory=list)  # threads against asyncio tasks
    procs: list[Rate] = field(default_factory=list)
    pg: list[Sample] = field(default_factory=list)
    pg_throughput: list[Throughput] = field(default_factory=list)
    pg_procs: list[Rate] = field(default_factory=list)
    pg_round_trips: RoundTrips | None = None
    pg_cpu: list[Sample] = field(default_factory=list)  # client CPU beside a minimal ledger
    cli_reads: str = ""  # the markdown of bench/cli_reads.py
    instructions: Counted | None = None  # bench/instructions.py

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for c in data["concurrency"] + data["callers"]:
            c.pop("latencies_ns")
        return data


def by_key(samples: list[Sample]) -> dict[str, Sample]:
    return {s.key: s for s in samples if s.key}
