"""A Python function read as a tool: the pydantic model of its parameters (the input schema the
model fills), which parameter takes the ``ToolContext``, and the call bound to one input."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

import pydantic

from ..errors import ConfigurationError
from ._context import ToolContext

__all__ = ["InputError", "bound", "clean_schema", "input_model"]


class InputError(ValueError):
    """The model's input does not match a tool's schema (internal; becomes an is_error result)."""


def clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop pydantic's generated titles: noise for the model, bytes in every request."""
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    return schema


def bound(
    fn: Callable[..., Any],
    kwargs: dict[str, Any],
    context_param: str | None,
    ctx: ToolContext | None,
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


def input_model(
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
