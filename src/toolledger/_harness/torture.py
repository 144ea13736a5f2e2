"""Torture: agent sessions ``SIGKILL``ed at random instants, resumed until they finish, and the
promise checked against the world after every one of them.

```sh
python -m toolledger._harness.torture --kills 10000                  # sqlite, a random seed
python -m toolledger._harness.torture --kills 300 --backend json --seed 7
python -m toolledger._harness.torture --kills 300 --backend postgres --postgres-url postgresql://…
```

Each session plays a script of 2-4 turns against the scripted model (the real ``anthropic`` SDK
over HTTP), each turn asking for 1-3 calls of a random mix of tools: plain non-idempotent, with a
``check``, key-forwarding, idempotent and read-only. Every run of the agent is a forked process,
and most are killed from here with ``SIGKILL`` after a random delay drawn over the length of a
whole run — before the store is opened, inside a commit, inside a tool, while the model answers —
and some at a named crash point (``TOOLLEDGER_CRASH_AT``, armed in the child). A session is killed
up to ``max_kills_per_session`` times, resumes included, then runs to the end.

When a run stops with ``needs_attention`` because a plain non-idempotent call is in doubt, the
harness plays the person: it looks in the world (the ticket files are the ground truth a person
would check) and resolves the call as happened or not. Those resolutions are counted.

After each session, checked against the world and the store, never against toolledger's own
opinion of itself:

* every ticket-creating call of the final transcript left **exactly one** ticket — never two (no
  effect executed twice), never none (nothing lost) — and the world holds no ticket of a call the
  transcript does not have;
* a plain call executed at most once, plus once per "did not happen" resolution of that call
  (counted in the world's execution log);
* every ``succeeded`` record of a ticket tool has its ticket;
* every tool_use of the transcript is answered exactly once, by a successful tool_result, first
  in the next user message, and the model never rejected a request;
* the script was played once: each scripted call appears once in the transcript;
* ``verify(store)`` finds nothing (engine integrity check included);
* every run ended ``completed``, or ``needs_attention`` with a reason, and the session ended
  ``completed``.

Each session has a store of its own (a SQLite file, a JSON directory or a PostgreSQL schema) and a
world of its own, removed once the session has passed; a session that fails is kept under
``--dir`` for inspection. Exit status: 0 when there was no violation.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ._run_setup import BACKENDS, add_backend_options, add_keep_options
from ._torture import TortureReport, TortureWorld, run_torture

__all__ = ["BACKENDS", "TortureReport", "TortureWorld", "main", "run_torture"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m toolledger._harness.torture",
        description="SIGKILL agent sessions at random instants, resume them, check the world.",
    )
    parser.add_argument("--kills", type=int, default=1000, help="kills in all (default 1000)")
    add_backend_options(parser)
    add_keep_options(parser, dir_help="keep failed sessions here")
    args = parser.parse_args(argv)
    last = [0.0]

    def progress(r: TortureReport) -> None:
        if args.quiet or r.seconds - last[0] < 10:
            return
        last[0] = r.seconds
        print(
            f"  {r.kills:,} kills, {r.sessions:,} sessions, {r.effects_checked:,} effects, "
            f"{len(r.violations)} violations, {r.seconds:,.0f} s",
            file=sys.stderr,
            flush=True,
        )

    report = run_torture(
        kills=args.kills,
        backend=args.backend,
        seed=args.seed,
        directory=args.dir,
        postgres_url=args.postgres_url,
        progress=progress,
    )
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
