"""MCP: the tools of an MCP client session as toolledger tools.

```python
from toolledger.adapters.mcp import tools_from_session

async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
    await session.initialize()
    tools = await tools_from_session(session, overrides={"send_invoice": {"high_impact": True}})
    agent = tl.Agent(client=anthropic.AsyncAnthropic(), model=..., tools=tools, store=store)
    run = await agent.arun(session="s", prompt="...")
```

Each MCP tool becomes a ``SchemaTool``: its ``inputSchema`` is the schema the model sees, and a
call goes through the ledger, then ``session.call_tool``. The effect class comes from the tool's
annotations (``effect_of``):

| annotation | toolledger |
|---|---|
| ``readOnlyHint: true`` | ``read_only`` |
| ``idempotentHint: true`` | ``idempotent`` |
| ``destructiveHint: true`` | ``high_impact`` (a person approves each call) |
| none of these | ``non_idempotent`` |

MCP's own default for an absent ``destructiveHint`` is *true*; toolledger does not apply it, or
every unannotated tool would wait for a person. Annotations are hints from a server you may not
control: ``trust_hints=False`` ignores them (everything ``non_idempotent``), and ``overrides``
sets ``effect``, ``high_impact``, ``forwards_idempotency_key``, ``timeout`` or a ``check`` per
tool.

Every call carries ``ctx.idempotency_key`` in the request's ``_meta`` under ``KEY_META`` (and under
every other name in ``meta_keys=``, e.g. ``"idempotencyKey"`` for a server that reads that one),
merged with any ``_meta`` of yours (``meta=``). A server that drops repeats by it deserves
``forwards_idempotency_key=True``; ``toolledger.integrations.mcp_server`` is such a server's half,
and docs/integrations/mcp.md the wire shape for servers in other languages. A session whose
``call_tool`` takes no ``meta`` cannot carry the key: a tool declared to forward it is refused when
the tools are built (``ConfigurationError``), and the others are called without ``_meta``.

A result with ``isError`` is a tool failure (an error result, recorded ``failed``). A call whose
answer never came (the connection closed, a timeout), or that a keyed server answered with
``OUTCOME_UNKNOWN_CODE`` (its own first attempt is in progress or in doubt), raises
``OutcomeUnknown``: the request may have run on the server, so the call stays in doubt.

The tools are ``async``: run them with ``await agent.arun(...)`` or ``await arun_tool_uses(...)``
on the event loop that holds the session. Nothing here imports the ``mcp`` SDK: sessions, tools
and results are read by duck typing (SDK v1 camelCase and v2 snake_case alike).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..codec import DEFAULT_MAX_RESULT_BYTES
from ..errors import ConfigurationError, MCPToolError, OutcomeUnknown
from ..records import EffectClass
from ..tools import DEFAULT_TIMEOUT, SchemaTool, ToolContext, ToolSet

__all__ = [
    "KEY_META",
    "OUTCOME_UNKNOWN_CODE",
    "MCPToolError",
    "MetaOf",
    "effect_of",
    "key_from_meta",
    "tools_from_list",
    "tools_from_session",
]

KEY_META = "toolledger/idempotency-key"
"""The ``_meta`` key of every ``tools/call`` that carries ``ctx.idempotency_key``."""

OUTCOME_UNKNOWN_CODE = -32050
"""The JSON-RPC error code (implementation-defined server error range) of a keyed server's answer
"the first call with this key is still running, or its outcome is unknown": the client keeps the
call in doubt (``OutcomeUnknown``) rather than recording a failure that did not happen."""

MetaOf = Callable[[str, dict[str, Any], ToolContext], Mapping[str, Any] | None]
"""``meta=`` as a function: ``(MCP tool name, arguments, ctx)`` to the ``_meta`` of one call."""

_OVERRIDE_KEYS = frozenset(
    {"effect", "high_impact", "forwards_idempotency_key", "check", "timeout"}
)
# JSON-RPC codes of an MCP request whose answer never came: it may have run on the server.
# A keyed server's OUTCOME_UNKNOWN_CODE says the same of its own first attempt.
_NO_ANSWER = frozenset({-32000, -32001, 408, OUTCOME_UNKNOWN_CODE})


def _get(obj: Any, *names: str) -> Any:
    """The first of ``names`` that ``obj`` has (dict key or attribute), else ``None``."""
    for name in names:
        value = obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)
        if value is not None:
            return value
    return None


def effect_of(annotations: Any) -> tuple[EffectClass, bool]:
    """``(effect, high_impact)`` for an MCP tool's annotations (object or dict, or ``None``)."""
    if annotations is None:
        return EffectClass.NON_IDEMPOTENT, False
    if _get(annotations, "read_only_hint", "readOnlyHint") is True:
        return EffectClass.READ_ONLY, False
    idempotent = _get(annotations, "idempotent_hint", "idempotentHint") is True
    destructive = _get(annotations, "destructive_hint", "destructiveHint") is True
    return (EffectClass.IDEMPOTENT if idempotent else EffectClass.NON_IDEMPOTENT), destructive


def key_from_meta(meta: Mapping[str, Any] | None, names: Sequence[str] = (KEY_META,)) -> str | None:
    """Server side: the idempotency key a client sent in a call's ``_meta`` — the value of the
    first of ``names`` it holds as a non-empty string — or ``None``."""
    for name in names:
        value = meta.get(name) if meta else None
        if isinstance(value, str) and value:
            return value
    return None


async def tools_from_session(
    session: Any,
    *,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    trust_hints: bool = True,
    prefix: str = "",
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    meta_keys: Sequence[str] = (KEY_META,),
    meta: Mapping[str, Any] | MetaOf | None = None,
) -> ToolSet:
    """Every tool of an initialised MCP ``ClientSession`` (all pages of ``tools/list``) as a
    ``ToolSet``.

    ``overrides`` maps a tool's MCP name to any of ``effect``, ``high_impact``,
    ``forwards_idempotency_key``, ``timeout`` and ``check`` (``check(arguments, ctx)``, async or
    not, returns the existing result or ``None``); a name the server does not list raises
    ``ConfigurationError``. ``prefix`` is put before every name the model sees (the call goes to
    the MCP name).

    ``meta_keys`` names the ``_meta`` entries that carry the idempotency key (``KEY_META``, and
    e.g. ``"idempotencyKey"`` too); ``meta`` is more ``_meta`` for every call — a mapping, or a
    function of ``(name, arguments, ctx)`` — merged with the key (a different value under one of
    ``meta_keys`` fails the call before it is sent). Raises ``ConfigurationError`` when the
    session's ``call_tool`` takes no ``meta`` and a tool is declared to forward the key: the key
    could not reach the server, and a resume would re-run a call nobody drops.
    """
    listed: list[Any] = []
    cursor: str | None = None
    while True:
        page = await _list_page(session, cursor)
        listed.extend(_get(page, "tools") or [])
        cursor = _get(page, "next_cursor", "nextCursor")
        if not cursor:
            break
    return tools_from_list(
        session,
        listed,
        overrides=overrides,
        trust_hints=trust_hints,
        prefix=prefix,
        max_result_bytes=max_result_bytes,
        meta_keys=meta_keys,
        meta=meta,
    )


async def _list_page(session: Any, cursor: str | None) -> Any:
    if cursor is None:
        return await session.list_tools()
    try:
        from mcp.types import PaginatedRequestParams  # SDK v2

        return await session.list_tools(params=PaginatedRequestParams(cursor=cursor))
    except (ImportError, TypeError):
        return await session.list_tools(cursor=cursor)  # SDK v1


def tools_from_list(
    session: Any,
    tools: Iterable[Any],
    *,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    trust_hints: bool = True,
    prefix: str = "",
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    meta_keys: Sequence[str] = (KEY_META,),
    meta: Mapping[str, Any] | MetaOf | None = None,
) -> ToolSet:
    """Like ``tools_from_session``, for tools already listed (``list_tools().tools``, or a subset
    of them)."""
    overrides = dict(overrides or {})
    loop = _running_loop()
    sender = _Sender(session, _checked_meta_keys(meta_keys), meta)
    declared: list[SchemaTool] = []
    names: set[str] = set()
    for mcp_tool in tools:
        name = _get(mcp_tool, "name")
        if not isinstance(name, str):
            raise ConfigurationError(f"an MCP tool without a name: {mcp_tool!r:.200}")
        names.add(name)
        effect, high_impact = effect_of(_get(mcp_tool, "annotations") if trust_hints else None)
        extra = dict(overrides.get(name, {}))
        unknown = set(extra) - _OVERRIDE_KEYS
        if unknown:
            raise ConfigurationError(
                f"overrides[{name!r}] has unknown keys {sorted(unknown)}; use "
                f"{', '.join(sorted(_OVERRIDE_KEYS))}"
            )
        check = extra.pop("check", None)
        forwards = bool(extra.pop("forwards_idempotency_key", False))
        if forwards and sender.takes_meta is False:
            raise ConfigurationError(
                f"MCP tool {name!r} is declared to forward its idempotency key, but this "
                f"session's call_tool takes no meta= ({type(session).__name__}): the key could "
                "not reach the server, and a resume would run the call again unseen. Use an "
                "mcp SDK whose ClientSession.call_tool takes meta= (1.2 or later), or do not "
                "declare the tool forwards_idempotency_key"
            )
        tool = SchemaTool(
            _caller(sender, name, loop, forwards=forwards),
            name=prefix + name,
            input_schema=_get(mcp_tool, "input_schema", "inputSchema") or {"type": "object"},
            description=_get(mcp_tool, "description") or _get(mcp_tool, "title") or "",
            effect=extra.pop("effect", effect),
            high_impact=bool(extra.pop("high_impact", high_impact)),
            forwards_idempotency_key=forwards,
            timeout=extra.pop("timeout", DEFAULT_TIMEOUT),
        )
        if check is not None:
            tool.check(check)
        declared.append(tool)
    missing = sorted(set(overrides) - names)
    if missing:
        raise ConfigurationError(
            f"overrides name tools the MCP server does not list: {', '.join(missing)}"
        )
    return ToolSet(declared, max_result_bytes=max_result_bytes)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _caller(
    sender: _Sender, name: str, loop: asyncio.AbstractEventLoop | None, *, forwards: bool
) -> Callable[[dict[str, Any], ToolContext], Any]:
    async def call(arguments: dict[str, Any], ctx: ToolContext) -> Any:
        if loop is not None and _running_loop() is not loop:
            raise ConfigurationError(
                f"MCP tool {name!r} was called outside the event loop of its session; run it "
                "with `await agent.arun(...)` or `await arun_tool_uses(...)` there"
            )
        try:
            result = await sender.call(name, arguments, ctx, forwards=forwards)
        except ConfigurationError:
            raise  # nothing was sent
        except Exception as exc:
            code = getattr(getattr(exc, "error", None), "code", None)
            if type(exc).__name__ in ("MCPError", "McpError") and code not in _NO_ANSWER:
                # The server answered with an error: the call did not run.
                raise MCPToolError(
                    f"the MCP server refused {name!r}: {exc}", tool=name, content=str(exc)
                ) from exc
            # No answer: the request may have reached the server and run there.
            raise OutcomeUnknown(
                f"no answer from the MCP server for {name!r} ({type(exc).__name__}: {exc})"
            ) from exc
        return _value(result, name)

    return call


def _checked_meta_keys(meta_keys: Sequence[str]) -> tuple[str, ...]:
    keys = (meta_keys,) if isinstance(meta_keys, str) else tuple(meta_keys)
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise ConfigurationError(
            f"meta_keys must be one or more non-empty _meta names, not {meta_keys!r}"
        )
    return keys


def _takes_meta(session: Any) -> bool | None:
    """Whether ``session.call_tool`` takes ``meta=``; ``None`` when its signature cannot be read."""
    try:
        parameters = inspect.signature(session.call_tool).parameters
    except (AttributeError, TypeError, ValueError):
        return None
    return "meta" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


class _Sender:
    """Sends one ``tools/call`` with the key in its ``_meta``, merged with the caller's."""

    def __init__(
        self, session: Any, meta_keys: tuple[str, ...], meta: Mapping[str, Any] | MetaOf | None
    ) -> None:
        self.session = session
        self.meta_keys = meta_keys
        self.meta = meta
        self.takes_meta = _takes_meta(session)

    def meta_of(self, name: str, arguments: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        extra = self.meta(name, arguments, ctx) if callable(self.meta) else self.meta
        merged = dict(extra or {})
        for key_name in self.meta_keys:
            if merged.get(key_name, ctx.idempotency_key) != ctx.idempotency_key:
                raise ConfigurationError(
                    f"the _meta given for MCP tool {name!r} holds {key_name!r}, which carries "
                    "the call's idempotency key, with another value; nothing was sent"
                )
            merged[key_name] = ctx.idempotency_key
        return merged

    async def call(
        self, name: str, arguments: dict[str, Any], ctx: ToolContext, *, forwards: bool
    ) -> Any:
        if self.takes_meta is False:  # never a forwarding tool: refused when it was built
            return await self.session.call_tool(name, arguments)
        meta = self.meta_of(name, arguments, ctx)
        try:
            return await self.session.call_tool(name, arguments, meta=meta)
        except TypeError as exc:
            if self.takes_meta or "meta" not in str(exc):
                raise
            if forwards:
                raise ConfigurationError(
                    f"MCP tool {name!r} forwards its idempotency key, but this session's "
                    "call_tool refused meta=; nothing was sent"
                ) from exc
            return await self.session.call_tool(name, arguments)  # an SDK without _meta


def _value(result: Any, name: str) -> Any:
    """What a ``CallToolResult`` returns to the model: its structured content if any, else its
    text, else its content blocks as JSON. ``isError`` raises ``MCPToolError``."""
    content = list(_get(result, "content") or [])
    texts = [_get(b, "text") for b in content if _get(b, "type") == "text"]
    if _get(result, "is_error", "isError") is True:
        text = "\n".join(t for t in texts if t) or "the server reported an error"
        raise MCPToolError(text, tool=name, content=text)
    structured = _get(result, "structured_content", "structuredContent")
    if structured is not None:
        return structured
    if len(texts) == len(content):
        return "\n".join(t or "" for t in texts)
    return [_plain(b) for b in content]


def _plain(block: Any) -> Any:
    if isinstance(block, Mapping):
        return dict(block)
    dump = getattr(block, "model_dump", None)
    return dump(mode="json", by_alias=True, exclude_none=True) if callable(dump) else repr(block)
