"""What the torture harness (``toolledger._harness.torture``) checks after each session.

The evidence comes from the world the tools wrote (ticket files, the execution log) and from the
store as any reader sees it; the checks never ask toolledger's runner what it thinks it did.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..adapters.anthropic import merged, pairing_errors, read_tool_uses
from ..records import EffectRecord, RunStatus, Status, StoredMessage, ToolCall

TICKET_TOOLS = frozenset(
    {"create_ticket", "create_ticket_checked", "create_ticket_keyed", "ensure_ticket"}
)


def calls_and_results(messages: list[StoredMessage]) -> tuple[list[ToolCall], list[Any]]:
    """A transcript's tool_use calls and its tool_result blocks, each in order."""
    uses = [c for m in messages if m.role == "assistant" for c in read_tool_uses(m.content)]
    results = [
        b
        for m in messages
        if m.role == "user" and isinstance(m.content, list)
        for b in m.content
        if b.get("type") == "tool_result"
    ]
    return uses, results


@dataclass
class Checks:
    """A tally of invariant checks and the ones that failed."""

    count: int = 0
    failed: list[str] = field(default_factory=list)

    def expect(self, holds: bool, problem: str) -> None:
        self.count += 1
        if not holds:
            self.failed.append(problem)


@dataclass(frozen=True)
class Evidence:
    """What one finished session left behind."""

    status: RunStatus | None
    messages: list[StoredMessage]
    records: dict[str, EffectRecord]
    verify_problems: list[str]
    tickets: Counter[str]  # ticket title -> tickets with it, in the world
    plain_runs: Counter[str]  # tool_use_id -> executions of create_ticket, in the world


@dataclass(frozen=True)
class Tally:
    tool_calls: int
    effects: int


def check_session(
    e: Evidence, *, script_titles: list[str], reruns_allowed: Counter[str], checks: Checks
) -> Tally:
    """Every invariant of one session; failures land in ``checks.failed``.

    ``script_titles``: the ticket titles the script asked for, one per ticket-creating call.
    ``reruns_allowed``: per plain call, how often a person said "it did not happen".
    """
    status = e.status.value if e.status else "missing"
    checks.expect(e.status is RunStatus.COMPLETED, f"the session ended {status}")
    checks.expect(not e.verify_problems, f"verify: {'; '.join(e.verify_problems)}")
    pairing = pairing_errors(merged(e.messages))
    checks.expect(not pairing, f"pairing rule: {'; '.join(pairing)}")

    uses, results = calls_and_results(e.messages)
    answered = Counter(b.get("tool_use_id") for b in results)
    unanswered = [c.tool_use_id for c in uses if answered[c.tool_use_id] != 1]
    checks.expect(
        not unanswered and len(results) == len(uses),
        f"tool_uses not answered exactly once: {unanswered} ({len(results)} results)",
    )
    errors = [str(b.get("content"))[:200] for b in results if b.get("is_error")]
    checks.expect(not errors, f"error results sent to the model: {errors}")
    asked = [str(c.input.get("title")) for c in uses if c.name in TICKET_TOOLS]
    checks.expect(
        sorted(asked) == sorted(script_titles),
        f"the transcript's calls {asked} are not the script's {script_titles}",
    )

    # The world: one ticket per call — never two (done twice), never none (lost).
    effects = 0
    for call in uses:
        if call.name in TICKET_TOOLS:
            title = str(call.input.get("title"))
            n = e.tickets[title]
            checks.expect(
                n == 1, f"{call.name} {title!r} ({call.tool_use_id}) left {n} tickets, not 1"
            )
            effects += 1
    titles_of = {c.tool_use_id: str(c.input.get("title")) for c in uses}
    for tid, record in e.records.items():
        if record.tool in TICKET_TOOLS and record.status is Status.SUCCEEDED:
            known = titles_of.get(tid)
            checks.expect(
                known is not None and e.tickets[known] >= 1,
                f"succeeded record {tid} ({record.tool}) has no ticket in the world",
            )
    strays = sorted(set(e.tickets) - set(asked))
    checks.expect(not strays, f"tickets no call of the transcript asked for: {strays}")
    for tid, n in e.plain_runs.items():
        checks.expect(
            n <= 1 + reruns_allowed[tid],
            f"create_ticket {tid} executed {n} times; {reruns_allowed[tid]} re-run(s) allowed",
        )
    return Tally(tool_calls=len(uses), effects=effects)
