"""``toolledger audit MODULE:TOOLSET`` — the brief's first exercise, as a command.

For each tool: its effect class, whether it needs a person's approval, what a resume does with an
interrupted call of it (docs/design.md, rule 6), and a risk level with the reason. The risk is that
of the call being interrupted — the process dying while it runs — given what the declaration lets
toolledger do about it:

* **low** — a re-run is harmless (read-only, idempotent), or the resume can settle it without a
  person (it forwards its idempotency key, or has a check) and it is not high-impact;
* **medium** — a re-run is safe only as far as something holds that toolledger cannot see (an
  idempotent high-impact tool; a high-impact tool settled by its key or check), or a duplicate
  costs little but an interrupted call still waits for a person;
* **high** — every run adds an effect that matters (high-impact) and nothing can tell whether an
  interrupted call happened: a person must resolve it.

``audit(tools)`` is pure (rows and warnings); the command prints them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.markup import escape

from .._shell import shown, shown_id
from ..errors import ConfigurationError
from ..records import EffectClass
from ..tools import Tool, ToolSet
from .loading import built, load_object, refused_arguments

__all__ = ["Audit", "AuditRow", "audit", "lines", "load_toolset"]

# A name starting with one of these verbs promises an effect.
EFFECT_VERBS = frozenset(
    {
        "add", "append", "cancel", "charge", "create", "delete", "drop", "insert", "move", "pay",
        "post", "publish", "put", "refund", "remove", "send", "set", "submit", "transfer",
        "update", "upload", "write",
    }
)  # fmt: skip
# ... and these add one more of something on every run.
ACCUMULATING_VERBS = frozenset({"add", "append", "charge", "insert", "pay", "post", "send"})


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditRow:
    tool: str
    effect: str
    needs_approval: bool
    forwards_idempotency_key: bool
    has_check: bool
    on_resume: str
    risk: str  # high | medium | low
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Audit:
    rows: list[AuditRow]
    warnings: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"tools": [asdict(r) for r in self.rows], "warnings": list(self.warnings)}


def _first_word(name: str) -> str:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return re.split(r"[_\-.\s]+", spaced.lower().lstrip("_"))[0]


def _on_resume(t: Tool[Any, Any]) -> str:
    if t.effect is EffectClass.READ_ONLY:
        return "runs it again"
    if t.effect is EffectClass.IDEMPOTENT:
        return "runs it again" + (" (approved once; not asked again)" if t.high_impact else "")
    if t.forwards_idempotency_key:
        return "runs it again with the same idempotency key"
    if t.has_check:
        return "asks its check whether it happened; runs it only if not"
    return "never re-runs it silently: asks the approver (in doubt) or stops for a person"


def _risk(t: Tool[Any, Any]) -> tuple[str, str]:
    if t.effect is EffectClass.READ_ONLY:
        return "low", "read-only: no side effect, a re-run just reads again"
    if t.effect is EffectClass.IDEMPOTENT:
        careful = (
            "as long as the implementation keeps it idempotent (an ensure-exists is only as good "
            "as its lookup; a delete must count 'already gone' as success)"
        )
        if t.high_impact:
            return (
                "medium",
                f"high-impact; a resume re-runs it without asking again — safe {careful}",
            )
        return "low", f"idempotent: N runs leave the world one run leaves, {careful}"
    if t.forwards_idempotency_key or t.has_check:
        how = (
            "forwards its idempotency key: a re-run is dropped downstream, if the receiver "
            "honours the key"
            if t.forwards_idempotency_key
            else "its check settles an interrupted call — only as well as the check finds it"
        )
        if t.high_impact:
            return "medium", f"non-idempotent and high-impact; {how}"
        return "low", f"non-idempotent; {how}"
    if t.high_impact:
        return "high", (
            "non-idempotent and high-impact: every run adds an effect that matters (a second "
            "e-mail, a second payment), and nothing can tell whether an interrupted call "
            "happened — a person must resolve it. Forward its idempotency key or add a check"
        )
    return "medium", (
        "non-idempotent: every run adds one more (a duplicate line, a duplicate record), and an "
        "interrupted call waits for a person. Forward its idempotency key, add a check, or make "
        "it idempotent"
    )


def audit(tools: ToolSet | Iterable[Any]) -> Audit:
    """Rows for every tool of ``tools``, and warnings about the set."""
    toolset = tools if isinstance(tools, ToolSet) else ToolSet(tools)
    rows: list[AuditRow] = []
    warnings: list[str] = []
    for t in toolset:
        risk, reason = _risk(t)
        rows.append(
            AuditRow(
                tool=t.name,
                effect=t.effect.value,
                needs_approval=t.high_impact,
                forwards_idempotency_key=t.forwards_idempotency_key,
                has_check=t.has_check,
                on_resume=_on_resume(t),
                risk=risk,
                reason=reason,
            )
        )
        verb = _first_word(t.name)
        if t.effect is EffectClass.READ_ONLY and verb in EFFECT_VERBS:
            warnings.append(
                f"{t.name!r} is declared read_only, but its name says it {verb}s something: a "
                "resume will re-run it freely. Declare what running it twice does."
            )
        elif t.effect is EffectClass.IDEMPOTENT and verb in ACCUMULATING_VERBS:
            warnings.append(
                f"{t.name!r} is declared idempotent, but {verb!r} usually adds one more on every "
                "run: is a second run really harmless?"
            )
    if not rows:
        warnings.append("the toolset is empty")
    elif all(t.effect is EffectClass.READ_ONLY for t in toolset):
        warnings.append(
            "every tool is read-only: a ledger may not be worth it here (a re-run costs nothing)"
        )
    return Audit(rows=rows, warnings=warnings)


def load_toolset(target: str) -> ToolSet:
    """The toolset named ``MODULE:ATTRIBUTE`` (a ``ToolSet``, a list of tools, one tool, or a
    function of no arguments returning one), imported with the working directory on the path."""
    value = load_object(target, shape="MODULE:TOOLSET", example="myapp.tools:TOOLS")
    if callable(value) and not isinstance(value, (Tool, ToolSet)):
        needs = refused_arguments(value)
        if needs is not None:
            raise ConfigurationError(
                f"{target} is a function of {needs}: name a ToolSet, a list of tools, a tool, "
                "or a function of no arguments returning one"
            )
        value = built(value, target, "a ToolSet")
    if isinstance(value, ToolSet):
        return value
    if isinstance(value, Tool):
        return ToolSet([value])
    if isinstance(value, (list, tuple, set, frozenset)):
        return ToolSet(value)
    raise ConfigurationError(
        f"{target} is a {type(value).__name__}, not a ToolSet, a list of tools or a tool"
    )


_RISK_STYLE = {"high": "bold red", "medium": "yellow", "low": "green"}


def lines(result: Audit) -> list[str]:
    """The audit as rich-markup lines: one block per tool, then the warnings."""
    width = max((len(shown_id(r.tool)) for r in result.rows), default=0)
    out: list[str] = []
    for r in result.rows:
        extras = [
            x for x, on in (("key", r.forwards_idempotency_key), ("check", r.has_check)) if on
        ]
        declared = r.effect + (f" + {' + '.join(extras)}" if extras else "")
        approval = ", needs approval" if r.needs_approval else ""
        style = _RISK_STYLE[r.risk]
        out.append(
            f"[bold]{escape(shown_id(r.tool)):<{width}}[/bold]  {declared}{approval}  "
            f"risk [{style}]{r.risk}[/{style}]"
        )
        out.append(f"  interrupted, a resume {r.on_resume}")
        out.append(f"  why: {escape(shown(r.reason))}")
    out += [f"[yellow]warning[/yellow] {escape(shown(w))}" for w in result.warnings]
    return out
