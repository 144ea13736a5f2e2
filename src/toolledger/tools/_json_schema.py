"""Tools declared by a JSON schema (MCP servers, other frameworks): ``SchemaTool``, and the light
top-level check of their input (``check_json_input``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ..errors import ConfigurationError
from ..records import EffectClass
from ._context import ToolContext
from ._signature import InputError
from ._tool import (
    DEFAULT_TIMEOUT,
    EffectName,
    Tool,
    checked_effect,
    checked_function,
    checked_name,
    checked_timeout,
)

__all__ = ["SchemaTool", "check_json_input"]

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
    "null": (type(None),),
}


def _json_type_ok(value: Any, expected: Any) -> bool:
    names = expected if isinstance(expected, list) else [expected]
    known = [n for n in names if isinstance(n, str) and n in _JSON_TYPES]
    if len(known) != len(names):
        return True  # a type we do not check: the receiver validates it
    for n in known:
        if isinstance(value, bool) and n in ("integer", "number"):
            continue  # JSON has no bool-as-number; Python does
        if isinstance(value, _JSON_TYPES[n]):
            return True
    return False


def check_json_input(schema: dict[str, Any], raw: Any) -> list[str]:
    """Light validation of ``raw`` against a JSON schema: the top level only.

    Checked: the input is an object; every ``required`` key is present; a property with a plain
    ``type`` (or a list of them) holds a value of that JSON type; no unknown key when
    ``additionalProperties`` is false. Not checked: anything nested, formats, ranges, ``$ref``,
    combinators — the receiver (an MCP server, an API) validates fully.
    """
    if not isinstance(raw, dict):
        return [f"(input): expected an object, got {type(raw).__name__}"]
    problems: list[str] = []
    properties = schema.get("properties")
    props: dict[str, Any] = properties if isinstance(properties, dict) else {}
    for key in schema.get("required") or []:
        if isinstance(key, str) and key not in raw:
            problems.append(f"{key}: Field required")
    for key, value in raw.items():
        spec = props.get(key)
        if spec is None:
            if schema.get("additionalProperties") is False:
                problems.append(f"{key}: Extra inputs are not permitted")
            continue
        if isinstance(spec, dict) and "type" in spec and not _json_type_ok(value, spec["type"]):
            problems.append(f"{key}: expected {spec['type']}, got {type(value).__name__}")
    return problems


class SchemaTool(Tool[..., Any]):
    """A tool declared by a name, a JSON schema and a callable taking the input dict.

    For tools that come with a schema rather than a Python signature (an MCP server's tools,
    another framework's). ``fn(arguments, ctx)`` receives the model's input as one dict, and
    ``ctx`` (a ``ToolContext``) when its signature has a second parameter; it may be
    ``async def``. Input is checked lightly before anything runs (``check_json_input``: the top
    level — required keys, JSON types of known properties, ``additionalProperties: false``);
    deeper validation is left to the receiver. A ``check`` takes the same ``(arguments, ctx)``.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str,
        input_schema: dict[str, Any],
        description: str = "",
        effect: EffectClass | EffectName = EffectClass.NON_IDEMPOTENT,
        high_impact: bool = False,
        forwards_idempotency_key: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.effect = checked_effect(effect)
        self.timeout = checked_timeout(timeout, name)
        checked_name(name)
        if not callable(fn):
            raise ConfigurationError(f"tool {name!r}: fn is not callable")
        checked_function(fn, name)
        if not isinstance(input_schema, dict):
            raise ConfigurationError(f"tool {name!r}: input_schema must be a JSON schema object")
        self.fn = fn
        self.name = name
        self.description = description
        self.high_impact = high_impact
        self.forwards_idempotency_key = forwards_idempotency_key
        self.is_async = inspect.iscoroutinefunction(fn)
        self._check = None
        self._check_context_param = None
        self._context_param = _second_param(fn, name)
        self.input_schema = dict(input_schema)

    def validate(self, raw: dict[str, Any]) -> dict[str, Any]:
        problems = check_json_input(self.input_schema, raw)
        if problems:
            raise InputError(
                f"input does not match the schema of {self.name!r}: {'; '.join(problems)}"
            )
        return {_ARGUMENTS: raw}

    def invocation(self, kwargs: dict[str, Any], ctx: ToolContext | None) -> Callable[[], Any]:
        return _positional(self.fn, kwargs[_ARGUMENTS], self._context_param is not None, ctx)

    def check(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        checked_function(fn, f"{self.name}.check")
        self._check_context_param = _second_param(fn, f"{self.name}.check")
        self._check = fn
        return fn

    def check_invocation(self, kwargs: dict[str, Any], ctx: ToolContext) -> Callable[[], Any]:
        if self._check is None:
            raise ConfigurationError(f"tool {self.name!r} has no check")
        wants_ctx = self._check_context_param is not None
        return _positional(self._check, kwargs[_ARGUMENTS], wants_ctx, ctx)


_ARGUMENTS = "arguments"


def _second_param(fn: Callable[..., Any], where: str) -> str | None:
    """The name of ``fn``'s context parameter (its second one), or ``None`` if it takes one."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"{where}: cannot read its signature: {exc}") from exc
    if not params or len(params) > 2:
        raise ConfigurationError(
            f"{where} must take (arguments) or (arguments, ctx), not {len(params)} parameters"
        )
    return params[1].name if len(params) == 2 else None


def _positional(
    fn: Callable[..., Any], arguments: dict[str, Any], with_ctx: bool, ctx: ToolContext | None
) -> Callable[[], Any]:
    def call() -> Any:
        return fn(arguments, ctx) if with_ctx else fn(arguments)

    return call
