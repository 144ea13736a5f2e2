"""Concurrency torture: worker processes that share one store and its sessions, paused with
``SIGSTOP`` past their leases and their tools' deadlines, killed with ``SIGKILL`` and replaced,
some acting as other hosts, each on a clock of its own — while an operator approves and resolves
at random moments — and the promise checked against the world at the end.

```sh
python -m toolledger._harness.concurrent_torture --seconds 600                 # sqlite
python -m toolledger._harness.concurrent_torture --seconds 120 --backend json --seed 7
python -m toolledger._harness.concurrent_torture --backend postgres --postgres-url postgresql://…
python -m toolledger._harness.concurrent_torture --other-hosts 0   # one host: no late effect at all
```

**What runs.** One store (a SQLite file, a JSON directory or a fresh PostgreSQL schema, dropped
after a run that passed) and one world directory: tickets as files, created whole; a key-forwarding
ticket API that de-duplicates by ``ctx.idempotency_key``; an execution log in which every tool
execution writes ``start`` and ``end`` (worker, pid, host identity, tool_use_id, attempt, time).
Sessions play 2-3 turns of 1-2 calls against the scripted model (the real ``anthropic`` SDK over
HTTP, one server in the harness): plain non-idempotent, checked (a ``check`` finds the ticket by
its title), key-forwarding, idempotent, read-only and high-impact (approved through
``toolledger.approvals.queue``). Tools sleep a few ms to tens of ms between their ``start`` and
their effect, and after it; their ``timeout=`` is 0.5-2 s and the agents' ``lease_ttl`` 0.5-1 s,
so leases expire and deadlines pass while a worker is paused. A completed session is replaced by
a new one until the chaos ends.

``--workers`` processes (forked), each with 1-3 threads, a clock offset of its own (from none to
a year: ``open_store(url, clock=...)``, which liveness never reads) and a host identity:
``--other-hosts`` of them set their own ``TOOLLEDGER_HOST_ID``, as workers on other machines,
which judge this host's attempts by lease and deadline only. Each thread picks an unfinished
session at random and runs it (``Agent.run``), or hands its pending calls to ``run_tool_uses``
again (a message delivered twice). ``SessionBusyError``, ``EffectInProgressError`` and
``LeaseLostError`` are normal outcomes; alerts (``on_alert``) go into the log.

**The chaos**, from the harness: ``SIGSTOP`` of a worker for a random time — shorter than the
lease, longer than it, or longer than every tool's timeout — then ``SIGCONT``; ``SIGKILL`` of a
worker, replaced by a fresh one; half of both aimed at a worker inside a non-idempotent tool, and
some kills at a worker that has just begun a call's second attempt (a call in doubt twice). And
an operator on this host, at random moments: approves queued calls (an in-doubt re-run only when
the world holds no ticket for the call) and resolves the calls ``store.in_doubt()`` lists —
happened if the world holds the call's ticket, not happened otherwise — recording when each
action began and ended. Then a quiet phase: every worker is continued and stopped, and the
harness drives each session to its end (resume, settle in-doubt calls from the world, approve).

**What is checked**, against the world, never by trusting the ledger:

1. a key-forwarding or idempotent call left exactly one ticket, always;
2. a plain, checked or high-impact call left exactly one ticket — unless an attempt of it woke
   past its deadline on another host after the call had been settled and run again, and then its
   late success is in the record's ``history`` and was raised as ``LateOutcomeError``
   (docs/design.md, rule 14, counted as *late effects*). The world must show it: that attempt's
   execution was settled only by another host's worker or operator, and only after its deadline.
   With ``--other-hosts 0`` there is no such case at all;
3. every ticket belongs to a call of a final transcript (its tool_use_id and title), and is
   recorded — a ``succeeded`` record, or a late outcome in the history. The one exception: an
   attempt of 2 that was killed between its late effect and its report — nothing can tell the
   ledger, so that duplicate is silent — counted apart (*killed before they could report*) when
   the world shows the same as for 2;
4. no attempt was settled while it ran in a live process of this host's identity — by the
   operator's ``resolve``, a worker's ``check``, a worker's judgement that it was over (each
   worker logs every such judgement, with when it began to look) or its next attempt; on another
   host, only past its deadline (counted). And no worker judged an attempt over because its
   process, of the same host, had ended before the harness had killed that process — a paused
   one included. A worker of the same host that judged only once the process was gone explains
   no late effect in 2: another host must still have settled it past its deadline;
5. every tool_use of every final transcript is answered exactly once, the script was played
   once, the model never rejected a request, every session ended ``completed``, and ``verify``
   finds no error but the late effects of 2;
6. an approval is used at most once: the n-th execution of a high-impact call had n approvals
   before it started; the n-th of a plain one, n-1 "did not happen"s or in-doubt approvals; the
   n-th of a checked one, n-1 checks that found nothing (or "did not happen"s).

A call the model was told was not executed (a store error before its intent; a person's resolve
racing its re-run) must have left no ticket; such calls are listed. No worker or operator may
raise anything but the normal errors above (and a store error while a paused worker holds the
store's lock, counted). Exit status: 0 when there was no violation. The seed fixes every random
draw — scripts, timeouts, lease, offsets, hosts, threads, pause lengths, the chaos's timing and
the operator's choices — but not the timing of the processes: what a pause or a kill lands on
varies from run to run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ._concurrent import ConcurrentReport, run_concurrent_torture
from ._run_setup import add_backend_options, add_keep_options

__all__ = ["ConcurrentReport", "main", "run_concurrent_torture"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m toolledger._harness.concurrent_torture",
        description="Workers sharing sessions, paused and killed at random; check the world.",
    )
    parser.add_argument("--seconds", type=float, default=60, help="of chaos (default 60)")
    add_backend_options(parser)
    parser.add_argument("--workers", type=int, default=4, help="processes at once (default 4)")
    parser.add_argument(
        "--other-hosts", type=int, default=1, help="of them acting as other hosts (default 1)"
    )
    parser.add_argument("--sessions", type=int, default=12, help="on offer at once (default 12)")
    add_keep_options(parser, dir_help="keep the run's files here")
    args = parser.parse_args(argv)

    def progress(r: ConcurrentReport) -> None:
        if not args.quiet:
            print(
                f"  {r.phases.get('chaos', 0):,.0f} s: {r.workers:,} workers, {r.pauses:,} "
                f"pauses, {r.kills:,} kills, {r.approvals:,} approvals, "
                f"{sum(r.resolves.values()):,} resolves",
                file=sys.stderr,
                flush=True,
            )

    report = run_concurrent_torture(
        seconds=args.seconds,
        backend=args.backend,
        seed=args.seed,
        workers=args.workers,
        other_hosts=args.other_hosts,
        sessions=args.sessions,
        directory=args.dir,
        postgres_url=args.postgres_url,
        progress=progress,
    )
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
