"""``Tool`` and ``@tool``: a Python function the model may call, with what running it twice
would do."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Generic, Literal, ParamSpec, TypeVar, overload

import pydantic

from ..errors import ConfigurationError
from ..records import EffectClass
from ._context import ToolContext
from ._signature import InputError, bound, clean_schema, input_model

__all__ = [
    "DEFAULT_TIMEOUT",
    "EffectName",
    "Tool",
    "checked_effect",
    "checked_function",
    "checked_name",
    "checked_timeout",
    "tool",
]

DEFAULT_TIMEOUT = 300.0
"""Seconds one attempt of a tool may take before it is past its deadline (``@tool(timeout=)``)."""

P = ParamSpec("P")
R = TypeVar("R")

EffectName = Literal["read_only", "idempotent", "non_idempotent"]


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
        self.effect = checked_effect(effect)
        self.timeout = checked_timeout(timeout, str(name or getattr(fn, "__name__", "?")))
        checked_function(fn, str(name or getattr(fn, "__name__", "?")))
        self.fn = fn
        self.name = checked_name(name or fn.__name__)
        self.description = description if description is not None else inspect.getdoc(fn) or ""
        self.high_impact = high_impact
        self.forwards_idempotency_key = forwards_idempotency_key
        self.is_async = inspect.iscoroutinefunction(fn)
        self._check: Callable[..., Any] | None = None
        self._check_context_param: str | None = None
        self._params, self._context_param, self._model = input_model(fn, self.name)
        # Each parameter with the model field that holds it (``input_model`` names them p0, p1…).
        self._fields = [(param, f"p{i}") for i, param in enumerate(self._params)]
        self.input_schema: dict[str, Any] = clean_schema(
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
        checked_function(fn, f"{self.name}.check")
        _, self._check_context_param, _ = input_model(fn, f"{self.name}.check")
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
        return {param: getattr(model, name) for param, name in self._fields}

    @property
    def takes_context(self) -> bool:
        """Whether the tool asks for the call's ``ToolContext``: it is built (its idempotency
        key a SHA-256) only for a tool that will see it."""
        return self._context_param is not None

    def invocation(self, kwargs: dict[str, Any], ctx: ToolContext | None) -> Callable[[], Any]:
        """A zero-argument callable running the tool for one call (``ctx`` injected if asked:
        ``None`` only for a tool that does not, ``takes_context``)."""
        return bound(self.fn, kwargs, self._context_param, ctx)

    def check_invocation(self, kwargs: dict[str, Any], ctx: ToolContext) -> Callable[[], Any]:
        """Like ``invocation``, for the registered ``check``."""
        if self._check is None:
            raise ConfigurationError(f"tool {self.name!r} has no check")
        return bound(self._check, kwargs, self._check_context_param, ctx)

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


def checked_effect(effect: EffectClass | str) -> EffectClass:
    """``effect`` as an ``EffectClass``; raises ``ConfigurationError`` naming the choices."""
    try:
        return EffectClass(effect)
    except ValueError:
        choices = ", ".join(repr(e.value) for e in EffectClass)
        raise ConfigurationError(f"effect={effect!r} is not one of {choices}") from None


def checked_function(fn: object, name: str) -> None:
    """Raise ``ConfigurationError`` for a generator function (``def`` or ``async def`` with
    ``yield``): calling one runs none of its body, so its call would be recorded done — and
    answered so for ever — without its effect ever happening."""
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise ConfigurationError(
            f"tool {name!r}: a generator function cannot be a tool or a check (calling it runs "
            "none of its body); return the value instead of yielding it"
        )


def checked_name(name: str) -> str:
    """``name`` when the APIs accept it as a tool's name; raises ``ConfigurationError``."""
    if not name or len(name) > 128:
        raise ConfigurationError(f"tool name {name!r} must be 1-128 characters")
    if not name.isprintable():
        # Stored, compared on every replay and printed: a NUL fails every write on PostgreSQL,
        # and a control or invisible character shows a person another name than the one run.
        raise ConfigurationError(
            f"tool name {name!r} holds a control or invisible character; no model API accepts "
            "one: name it with letters, digits, '_' and '-'"
        )
    return name


def checked_timeout(timeout: object, name: str) -> float:
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
