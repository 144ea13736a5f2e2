"""Tool declarations: ``@tool``, ``Tool``, ``ToolSet`` and the ``ToolContext`` a tool may ask for.

The input schema comes from the function's signature (through pydantic), the description from its
docstring; a parameter annotated ``ToolContext`` is injected at call time and never shown to the
model.
"""

from __future__ import annotations

import inspect
import time
import types
import typing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, Literal, ParamSpec, TypeVar, overload

import pydantic

from .codec import DEFAULT_MAX_RESULT_BYTES
from .errors import ConfigurationError
from .records import EffectClass

__all__ = ["DEFAULT_TIMEOUT", "SchemaTool", "Tool", "ToolContext", "ToolSet", "tool"]

DEFAULT_TIMEOUT = 300.0
"""Seconds one attempt of a tool may take before it is past its deadline (``@tool(timeout=)``)."""

P = ParamSpec("P")
R = TypeVar("R")

EffectName = Literal["read_only", "idempotent", "non_idempotent"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolContext:
    """What a tool may know about the call it is serving.

    ``idempotency_key`` is stable for one ``(session_id, tool_use_id)`` on every process and
    machine, and different for every other call: forward it downstream so a repeat can be dropped
    there. ``in_doubt`` is true when an earlier attempt of this very call may have taken effect
    (the process died while it ran); ``attempt`` counts executions begun, this one included.
    """

    session_id: str
    tool_use_id: str
    idempotency_key: str
    in_doubt: bool = False
    attempt: int = 1
    deadline: float | None = None
    """When this attempt should be done, in epoch seconds on this worker's clock (``time.time``
    unless the store was given another): the tool's ``timeout`` after it started. Past it,
    another worker may judge the attempt over — pass what is left (``remaining()``) to your own
    client's timeout."""

    def remaining(self) -> float | None:
        """Seconds left before ``deadline`` (never negative); ``None`` without one."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.time())


class InputError(ValueError):
    """The model's input does not match a tool's schema (internal; becomes an is_error result)."""


def _clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop pydantic's generated titles: noise for the model, bytes in every request."""
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    return schema


class Tool(Generic[P, R]):
    """A function the model may call, with what running it twice would do.

    Calling the ``Tool`` calls the function directly (no ledger): the ledger applies through
    ``run_tool_uses`` and ``Agent``.
    """

    def __init__(
        self,
        fn: Callable[P, R],
        *,
        effect: EffectClass | EffectName = EffectClass.NON_IDEMPOTENT,
        high_impact: bool = False,
        forwards_idempotency_key: bool = False,
        name: str | None = None,
        description: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        try:
            self.effect = EffectClass(effect)
        except ValueError:
            choices = ", ".join(repr(e.value) for e in EffectClass)
            raise ConfigurationError(f"effect={effect!r} is not one of {choices}") from None
        self.timeout = _check_timeout(timeout, str(name or getattr(fn, "__name__", "?")))
        self.fn = fn
        self.name = name or fn.__name__
        if not self.name or len(self.name) > 128:
            raise ConfigurationError(f"tool name {self.name!r} must be 1-128 characters")
        self.description = description if description is not None else inspect.getdoc(fn) or ""
        self.high_impact = high_impact
        self.forwards_idempotency_key = forwards_idempotency_key
        self.is_async = inspect.iscoroutinefunction(fn)
        self._check: Callable[..., Any] | None = None
        self._check_context_param: str | None = None
        self._params, self._context_param, self._model = _input_model(fn, self.name)
        self.input_schema: dict[str, Any] = _clean_schema(
            self._model.model_json_schema(by_alias=True)
        )

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        flags = " high_impact" if self.high_impact else ""
        return f"<Tool {self.name} {self.effect.value}{flags}>"

    # -- what a resume may do -------------------------------------------------------------------

    @property
    def rerun_safe(self) -> bool:
        """Running it again leaves the world as one run would: read-only, idempotent, or a tool
        that forwards its idempotency key so the receiver drops repeats."""
        return self.effect is not EffectClass.NON_IDEMPOTENT or self.forwards_idempotency_key

    @property
    def needs_intent(self) -> bool:
        """Whether ``started`` must be durable before the tool runs.

        Needed when a re-run is unsafe, so that a call found without it is known never to have
        run, and for every high-impact call, whose intent carries its approval.
        """
        return self.high_impact or not self.rerun_safe

    @property
    def has_check(self) -> bool:
        return self._check is not None

    def check(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Register the "did this already happen?" function (decorator).

        It takes the tool's parameters (and ``ToolContext`` if it asks for it) and returns the
        existing result, or ``None`` when the effect did not happen. toolledger calls it only for
        a call found in doubt.
        """
        _, self._check_context_param, _ = _input_model(fn, f"{self.name}.check")
        self._check = fn
        return fn

    # -- calling ---------------------------------------------------------------------------------

    def validate(self, raw: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments for ``raw`` model input; raises ``InputError`` naming each
        problem."""
        try:
            model = self._model.model_validate(raw)
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(input)'}: {err['msg']}"
                for err in exc.errors(include_url=False)
            )
            raise InputError(
                f"input does not match the schema of {self.name!r}: {problems}"
            ) from None
        return {param: getattr(model, f"p{i}") for i, param in enumerate(self._params)}

    def invocation(self, kwargs: dict[str, Any], ctx: ToolContext) -> Callable[[], Any]:
        """A zero-argument callable running the tool for one call (``ctx`` injected if asked)."""
        return _bound(self.fn, kwargs, self._context_param, ctx)

    def check_invocation(self, kwargs: dict[str, Any], ctx: ToolContext) -> Callable[[], Any]:
        """Like ``invocation``, for the registered ``check``."""
        if self._check is None:
            raise ConfigurationError(f"tool {self.name!r} has no check")
        return _bound(self._check, kwargs, self._check_context_param, ctx)

    @property
    def check_is_async(self) -> bool:
        return self._check is not None and inspect.iscoroutinefunction(self._check)

    def to_anthropic(self) -> dict[str, Any]:
        """This tool as an entry of the Messages API ``tools=`` list."""
        out: dict[str, Any] = {"name": self.name, "input_schema": self.input_schema}
        if self.description:
            out["description"] = self.description
        return out

    def to_openai(self) -> dict[str, Any]:
        """This tool as an entry of the Chat Completions ``tools=`` list."""
        function: dict[str, Any] = {"name": self.name, "parameters": self.input_schema}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}

    def to_openai_responses(self) -> dict[str, Any]:
        """This tool as an entry of the Responses API ``tools=`` list.

        ``strict`` is false: the Responses API defaults it to true, which demands that every
        property be required — a schema with defaults would be refused.
        """
        out: dict[str, Any] = {
            "type": "function",
            "name": self.name,
            "parameters": self.input_schema,
            "strict": False,
        }
        if self.description:
            out["description"] = self.description
        return out


def _bound(
    fn: Callable[..., Any], kwargs: dict[str, Any], context_param: str | None, ctx: ToolContext
) -> Callable[[], Any]:
    if context_param is not None:
        kwargs = {**kwargs, context_param: ctx}

    def call() -> Any:
        return fn(**kwargs)

    return call


def _hints(fn: Callable[..., Any], where: str) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise ConfigurationError(
            f"cannot resolve the type annotations of {where}: {exc}; "
            "make every annotation importable at module level"
        ) from exc


def _is_context(annotation: Any) -> bool:
    """``ToolContext``, ``ToolContext | None`` or ``Annotated[ToolContext, …]``."""
    if annotation is ToolContext:
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _is_context(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return len(args) == 1 and args[0] is ToolContext
    return False


def _annotation(annotation: Any) -> Any:
    """``Annotated[T, "text"]`` becomes ``Annotated[T, Field(description="text")]``."""
    if typing.get_origin(annotation) is typing.Annotated:
        base, *meta = typing.get_args(annotation)
        converted = [pydantic.Field(description=m) if isinstance(m, str) else m for m in meta]
        return typing.Annotated[base, *converted]
    return annotation


def _input_model(
    fn: Callable[..., Any], where: str
) -> tuple[list[str], str | None, type[pydantic.BaseModel]]:
    """Build the pydantic model of a function's parameters.

    Fields are named ``p0, p1 …`` with the real names as aliases, so a parameter called ``json``
    or ``model_config`` cannot collide with pydantic's own attributes.
    """
    if not callable(fn):
        raise ConfigurationError(f"{where} is not callable")
    hints = _hints(fn, where)
    params: list[str] = []
    context_param: str | None = None
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        annotation = hints.get(param.name, Any)
        if _is_context(annotation):
            context_param = param.name
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise ConfigurationError(
                f"{where}: parameter {param.name!r} is {param.kind.description}; tool "
                "parameters must be nameable by the model (plain or keyword-only)"
            )
        default = ... if param.default is param.empty else param.default
        field_info = pydantic.Field(default, alias=param.name)
        fields[f"p{len(params)}"] = (_annotation(annotation), field_info)
        params.append(param.name)
    try:
        model = pydantic.create_model(
            f"{where}_input".replace(".", "_"),
            __config__=pydantic.ConfigDict(extra="forbid", arbitrary_types_allowed=False),
            **fields,
        )
    except (pydantic.PydanticSchemaGenerationError, TypeError) as exc:
        raise ConfigurationError(f"{where}: cannot build an input schema: {exc}") from exc
    return params, context_param, typing.cast(type[pydantic.BaseModel], model)


def _check_timeout(timeout: object, name: str) -> float:
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout < float("inf")
    ):
        raise ConfigurationError(
            f"tool {name!r}: timeout must be a positive, finite number of seconds, not {timeout!r}"
        )
    return float(timeout)


@overload
def tool(fn: Callable[P, R], /) -> Tool[P, R]: ...
@overload
def tool(
    *,
    effect: EffectClass | EffectName = ...,
    high_impact: bool = ...,
    forwards_idempotency_key: bool = ...,
    name: str | None = ...,
    description: str | None = ...,
    timeout: float = ...,
) -> Callable[[Callable[P, R]], Tool[P, R]]: ...
def tool(
    fn: Callable[P, R] | None = None,
    /,
    *,
    effect: EffectClass | EffectName = EffectClass.NON_IDEMPOTENT,
    high_impact: bool = False,
    forwards_idempotency_key: bool = False,
    name: str | None = None,
    description: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> Tool[P, R] | Callable[[Callable[P, R]], Tool[P, R]]:
    """Declare a tool: ``@tool`` or ``@tool(effect=..., high_impact=...)``.

    ``effect`` says what running it twice does (undeclared means ``non_idempotent``, the safe
    assumption); ``high_impact`` puts it behind the approval gate; ``forwards_idempotency_key``
    promises the tool passes ``ctx.idempotency_key`` downstream, so an in-doubt call may be re-run
    with the same key. ``timeout`` (seconds, default 300) bounds one attempt: it is the
    attempt's deadline (``ctx.deadline``), after which another worker may judge it over if its
    own worker's lease is gone too; an ``async def`` tool is cancelled there (and left in doubt),
    a plain one cannot be. Raises ``ConfigurationError`` at import time for a signature the model
    could not fill.
    """

    def wrap(f: Callable[P, R]) -> Tool[P, R]:
        return Tool(
            f,
            effect=effect,
            high_impact=high_impact,
            forwards_idempotency_key=forwards_idempotency_key,
            name=name,
            description=description,
            timeout=timeout,
        )

    return wrap(fn) if fn is not None else wrap


class ToolSet:
    """The tools one agent may call, by name.

    Plain functions are accepted and declared with the defaults (``non_idempotent``).
    ``max_result_bytes`` caps what the ledger stores per result (larger ones become a note).
    """

    def __init__(
        self,
        tools: Iterable[Tool[Any, Any] | Callable[..., Any]] = (),
        *,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    ) -> None:
        if max_result_bytes <= 0:
            raise ConfigurationError("max_result_bytes must be positive")
        self.max_result_bytes = max_result_bytes
        self._tools: dict[str, Tool[Any, Any]] = {}
        for item in tools:
            declared = item if isinstance(item, Tool) else Tool(item)
            if declared.name in self._tools:
                raise ConfigurationError(f"two tools are named {declared.name!r}")
            self._tools[declared.name] = declared

    def get(self, name: str) -> Tool[Any, Any] | None:
        return self._tools.get(name)

    def __getitem__(self, name: str) -> Tool[Any, Any]:
        return self._tools[name]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool[Any, Any]]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"ToolSet({list(self._tools)})"

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def to_anthropic(self) -> list[dict[str, Any]]:
        """The Messages API ``tools=`` list."""
        return [t.to_anthropic() for t in self._tools.values()]

    def to_openai(self) -> list[dict[str, Any]]:
        """The Chat Completions ``tools=`` list."""
        return [t.to_openai() for t in self._tools.values()]

    def to_openai_responses(self) -> list[dict[str, Any]]:
        """The Responses API ``tools=`` list."""
        return [t.to_openai_responses() for t in self._tools.values()]


# -- tools declared by a JSON schema (MCP servers, other frameworks) ----------------------------

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
        try:
            self.effect = EffectClass(effect)
        except ValueError:
            choices = ", ".join(repr(e.value) for e in EffectClass)
            raise ConfigurationError(f"effect={effect!r} is not one of {choices}") from None
        self.timeout = _check_timeout(timeout, name)
        if not name or len(name) > 128:
            raise ConfigurationError(f"tool name {name!r} must be 1-128 characters")
        if not callable(fn):
            raise ConfigurationError(f"tool {name!r}: fn is not callable")
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

    def invocation(self, kwargs: dict[str, Any], ctx: ToolContext) -> Callable[[], Any]:
        return _positional(self.fn, kwargs[_ARGUMENTS], self._context_param is not None, ctx)

    def check(self, fn: Callable[..., Any]) -> Callable[..., Any]:
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
    fn: Callable[..., Any], arguments: dict[str, Any], with_ctx: bool, ctx: ToolContext
) -> Callable[[], Any]:
    def call() -> Any:
        return fn(arguments, ctx) if with_ctx else fn(arguments)

    return call
