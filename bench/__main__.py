"""``python -m bench [--quick] [--dir DIR] [--n N]``: every figure measured in one run, on one disk,
interleaved with the raw floor it is compared to."""

from __future__ import annotations

import argparse
import platform
import tempfile
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console
from rich.table import Table

from . import core, floor
from .measure import interleaved


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small N, about a minute")
    parser.add_argument("--n", type=int, default=None, help="operations per measurement")
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path("bench-out"),
        help="where the files go (a temporary directory inside it)",
    )
    args = parser.parse_args(argv)
    n = args.n or (400 if args.quick else 2000)
    args.dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp, ExitStack() as stack:
        d = Path(tmp)
        contenders = [
            floor.append_fsync(d, stack),
            floor.pwrite_fdatasync(d, stack, n),
            core.per_record("sqlite", d, stack),
            core.per_call("sqlite", d, stack, "noop_effect"),
            core.per_call("sqlite", d, stack, "noop_read"),
            core.agent_turn("sqlite", d, stack),
        ]
        rows = interleaved(contenders, n)
        json_rows = interleaved(
            [
                floor.append_fsync(d, stack),
                core.per_record("json", d, stack),
                core.per_call("json", d, stack, "noop_effect"),
            ],
            min(n, 300),
        )
    table = Table(title=f"toolledger bench — {platform.node()}, {platform.platform()}")
    for col in (
        "measurement",
        "N",
        "median µs",
        "p99 µs",
        "writes",
        "x raw fsync",
        "x (writes x raw)",
    ):
        table.add_column(col, justify="left" if col == "measurement" else "right")
    for group in (rows, json_rows):
        raw = group[0]
        for s in group:
            per_write = s.median_us / (s.writes * raw.median_us) if s.writes else 0.0
            table.add_row(
                s.name,
                str(s.n),
                f"{s.median_us:,.0f}",
                f"{s.p99_us:,.0f}",
                f"{s.writes:.3g}",
                f"{s.ratio(raw):.2f}",
                f"{per_write:.2f}",
            )
        table.add_section()
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
