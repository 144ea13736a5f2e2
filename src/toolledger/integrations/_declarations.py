"""How an integration knows what running a framework's tool twice would do: a ``Declaration`` per
tool name, turned into a one-call ``SchemaTool`` whose function is the framework's own execution.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..errors import ConfigurationError
from ..tools import SchemaTool, Tool, ToolContext
from ..tools._tool import checked_effect, checked_timeout

__all__ = ["Declaration", "checked_declarations", "one_call_tool"]

Declaration = Mapping[str, Any] | Tool[..., Any]
"""What running one tool twice would do: a mapping of ``@tl.tool``'s keyword arguments
(``effect``, ``high_impact``, ``forwards_idempotency_key``, ``timeout``), or a toolledger ``Tool``
whose declaration — and ``check``, if it has one — is taken. An undeclared tool is
``non_idempotent``, the safe assumption."""

_KEYS = frozenset({"effect", "high_impact", "forwards_idempotency_key", "timeout"})


def checked_declarations(
    effects: Mapping[str, Declaration] | Iterable[Tool[..., Any]] | None,
) -> dict[str, Declaration]:
    """``effects`` by tool name, checked now (at construction) rather than at the first call:
    raises ``ConfigurationError`` for an unknown key, effect class or timeout."""
    if effects is None:
        return {}
    named: dict[str, Declaration] = (
        dict(effects) if isinstance(effects, Mapping) else {t.name: t for t in effects}
    )
    for name, declaration in named.items():
        if isinstance(declaration, Tool):
            continue
        if not isinstance(declaration, Mapping):
            raise ConfigurationError(
                f"the declaration of {name!r} must be a mapping or a toolledger Tool, "
                f"not {type(declaration).__name__}"
            )
        unknown = sorted(set(declaration) - _KEYS)
        if unknown:
            raise ConfigurationError(
                f"the declaration of {name!r} has unknown keys {unknown}; known: {sorted(_KEYS)}"
            )
        if "effect" in declaration:
            checked_effect(declaration["effect"])
        if "timeout" in declaration:
            checked_timeout(declaration["timeout"], name)
    return named


def one_call_tool(
    name: str, fn: Callable[[dict[str, Any], ToolContext], Any], declaration: Declaration | None
) -> SchemaTool:
    """A ``SchemaTool`` named ``name`` that runs ``fn(arguments, ctx)`` — the framework's execution
    of one call — declared as ``declaration`` says.

    Its schema is permissive (``{"type": "object"}``): the framework validates the arguments
    itself, inside ``fn``, exactly as it would without the ledger.
    """
    schema: dict[str, Any] = {"type": "object"}
    if declaration is None:
        return SchemaTool(fn, name=name, input_schema=schema)
    if not isinstance(declaration, Tool):
        return SchemaTool(fn, name=name, input_schema=schema, **declaration)
    tool = SchemaTool(
        fn,
        name=name,
        input_schema=schema,
        effect=declaration.effect,
        high_impact=declaration.high_impact,
        forwards_idempotency_key=declaration.forwards_idempotency_key,
        timeout=declaration.timeout,
    )
    if declaration.has_check:
        tool.check(_check_of(declaration))
    return tool


def _check_of(declared: Tool[..., Any]) -> Callable[[dict[str, Any], ToolContext], Any]:
    """``declared``'s check, called as a ``SchemaTool``'s check is: ``(arguments, ctx)``."""
    if declared.check_is_async:

        async def acheck(arguments: dict[str, Any], ctx: ToolContext) -> Any:
            return await declared.check_invocation(declared.validate(arguments), ctx)()

        return acheck

    def check(arguments: dict[str, Any], ctx: ToolContext) -> Any:
        return declared.check_invocation(declared.validate(arguments), ctx)()

    return check
