"""MCP servers that honour the idempotency key: a tool run through a ledger keyed by the key its
client sent in ``_meta``, so a repeat of one call does its effect once.

```python
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from toolledger.integrations.mcp_server import ServerLedger

store = tl.open_store("sqlite:///server.db")
keyed = ServerLedger(store)             # each authenticated client in a ledger of its own

server = MCPServer("tickets")

@server.tool()
@keyed.tool(effect="non_idempotent")
def create_ticket(title: str, ctx: Context) -> dict:
    return tickets.create(title)
```

A ``tools/call`` whose ``_meta`` holds a key (``toolledger/idempotency-key``, or another name in
``meta_keys=``) runs through ``tl.arun_tool_uses`` as the call ``(principal's ledger, key)``:

* the first call with a key runs the tool and records its outcome;
* a repeat (the client died before it heard the answer, or timed out, and ran the call again
  under the same key) answers the recorded result, and the tool does not run;
* the same key with other arguments is refused with an error naming the key (a conflict, never
  a replay of another call's result);
* a repeat while the first attempt is still running, or after the server died in it (in doubt),
  is answered with the JSON-RPC error ``OUTCOME_UNKNOWN_CODE``: a toolledger client keeps its
  call in doubt instead of recording a failure;
* a call without a key runs as it would without the ledger.

The ledger of a call is its client's: ``principal(ctx)`` names it — by default the authenticated
client of the request (the SDK's access token: its client id, issuer and subject). Keys are
predictable (a hash of the client's session and call id), so two clients never share a ledger; a
server without authentication (stdio: one client, the process that started it) says whose calls
these are with ``principal=lambda ctx: "local"``. A call with a key but no principal is refused.

The tool must take the SDK's ``Context`` (``ctx: Context``): the key is read from the request it
carries. Wire shape, for servers in other languages: docs/integrations/mcp.md.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError

from .._tool_uses import arun_tool_uses
from ..adapters._shapes import check_call_id
from ..adapters.mcp import KEY_META, OUTCOME_UNKNOWN_CODE, key_from_meta
from ..engine._drivers import AlertHook
from ..errors import (
    ConfigurationError,
    EffectInProgressError,
    LedgerMismatchError,
    MalformedContentError,
)
from ..records import Status
from ..stores import Ledger, Store
from ..tools import ToolContext
from ._declarations import checked_declarations, one_call_tool

__all__ = ["OUTCOME_UNKNOWN_CODE", "ServerLedger", "authenticated_principal"]

F = TypeVar("F", bound=Callable[..., Any])
PrincipalOf = Callable[[Any], str | None]


def authenticated_principal(ctx: Any) -> str | None:
    """The authenticated client of the request being served: its access token's client id,
    issuer and subject (the SDK's ``principal_components``), or ``None`` without one."""
    try:
        from mcp.server.auth.middleware.auth_context import get_access_token
    except ImportError:  # an SDK without its auth module
        return None
    token = get_access_token()
    if token is None:
        return None
    try:
        from mcp.server.auth.provider import principal_components
    except ImportError:  # older SDKs: the client id alone
        return str(token.client_id)
    return json.dumps(list(principal_components(token)))


class ServerLedger:
    """Decorates the tools of an MCP server built with the Python SDK so each runs through the
    ledger of its client, keyed by the idempotency key in the call's ``_meta``.

    ``store`` holds the ledgers (one per principal: ``f"{namespace}:{principal}"``);
    ``principal(ctx)`` names the client of a request (default ``authenticated_principal``);
    ``meta_keys`` are the ``_meta`` names read for the key, first found wins; ``wait`` is how
    long a repeat waits for a first attempt still running in this server before it is answered
    ``OUTCOME_UNKNOWN_CODE``; ``on_alert`` is ``tl.arun_tool_uses``'. See the module docstring.
    """

    def __init__(
        self,
        store: Store,
        *,
        principal: PrincipalOf = authenticated_principal,
        meta_keys: Sequence[str] = (KEY_META,),
        namespace: str = "mcp",
        wait: float = 0.0,
        on_alert: AlertHook | None = None,
    ) -> None:
        if isinstance(meta_keys, str) or not meta_keys or not all(meta_keys):
            raise ConfigurationError(f"meta_keys must name one or more _meta keys: {meta_keys!r}")
        self.store = store
        self.principal = principal
        self.meta_keys = tuple(meta_keys)
        self.namespace = namespace
        self.wait = wait
        self.on_alert = on_alert

    def ledger_for(self, ctx: Any) -> Ledger:
        """The ledger of the client of the request ``ctx`` serves; ``ConfigurationError`` when
        it has no principal."""
        principal = self.principal(ctx)
        if not principal:
            raise ConfigurationError(
                "this call carries an idempotency key but its client is not authenticated: "
                "keys are predictable, so the server keeps one ledger per client. Serve it with "
                "authentication, or name the client with ServerLedger(principal=...) (for a "
                'stdio server, principal=lambda ctx: "local")'
            )
        return self.store.ledger(f"{self.namespace}:{principal}")

    def tool(self, fn: F | None = None, **declaration: Any) -> Any:
        """``@keyed.tool`` or ``@keyed.tool(effect=..., timeout=..., ...)`` (``@tl.tool``'s
        keywords: what running the tool twice would do, for a first attempt the server died in),
        under the SDK's ``@server.tool()``. Raises ``ConfigurationError`` for a bad declaration
        (``high_impact``: a server has no one to ask) or a function without a ``Context``
        parameter."""
        checked_declarations({"tool": declaration})
        if fn is None:
            return lambda f: self._wrap(f, declaration)
        return self._wrap(fn, declaration)

    def _wrap(self, fn: F, declaration: dict[str, Any]) -> F:
        name: str = getattr(fn, "__name__", "tool")
        if declaration.get("high_impact"):
            # No one to ask: a keyed call would be declined for ever, and one without a key
            # runs as it would without the ledger — approved by nobody.
            raise ConfigurationError(
                f"{name!r} is declared high_impact, but an MCP server's tools have no approval "
                "gate: a keyed call could never be approved, and a call without a key would run "
                "unapproved. Gate it in the client (its agent's approve=), or have the tool ask "
                "a person before it acts"
            )
        context_name = _context_parameter(fn)
        is_async = _is_async(fn)
        # On a worker thread, as the SDK runs a plain tool: on the event loop it would stop the
        # server — every other request, a repeat of this call among them. (``anyio``: the SDK's.)
        in_thread = None if is_async else importlib.import_module("anyio.to_thread").run_sync
        returns = _returns(fn)

        @functools.wraps(fn)
        async def ledgered(*args: Any, **kwargs: Any) -> Any:
            ctx = kwargs.get(context_name)
            meta = getattr(getattr(ctx, "request_context", None), "meta", None)
            key = key_from_meta(meta, self.meta_keys)

            async def run_tool() -> Any:
                if in_thread is None:
                    return await fn(*args, **kwargs)
                return await in_thread(functools.partial(fn, *args, **kwargs))

            if key is None:
                return await run_tool()
            arguments = {k: _plain(v) for k, v in kwargs.items() if k != context_name}
            call = _Call(name=name, key=key, arguments=arguments)
            return await self._call(call, run_tool, declaration, ctx, returns)

        return ledgered  # type: ignore[return-value]

    async def _call(
        self,
        call: _Call,
        run_tool: Callable[[], Awaitable[Any]],
        declaration: dict[str, Any],
        ctx: Any,
        returns: TypeAdapter[Any] | None,
    ) -> Any:
        name, key = call.name, call.key
        try:
            check_call_id(key, "the idempotency key in _meta")
        except MalformedContentError as exc:
            raise _tool_error(str(exc)) from exc
        try:
            ledger = self.ledger_for(ctx)
        except ConfigurationError as exc:
            raise _tool_error(str(exc)) from exc
        produced: list[Any] = []

        async def run(arguments: dict[str, Any], tool_ctx: ToolContext) -> Any:
            value = await run_tool()
            produced.append(value)
            return _recordable(value)

        block = {"type": "tool_use", "id": key, "name": name, "input": call.arguments}
        try:
            (result,) = await arun_tool_uses(
                [block],
                [one_call_tool(name, run, declaration)],
                ledger=ledger,
                on_alert=self.on_alert,
                wait=self.wait,
            )
        except LedgerMismatchError as exc:
            raise _tool_error(
                f"idempotency key {key!r} was first used for another call of {name!r} (other "
                "arguments): it is not run, and not answered with that call's result"
            ) from exc
        except EffectInProgressError as exc:
            raise _unknown(f"the first call with idempotency key {key!r} is still running") from exc
        if produced:
            return produced[-1]  # ran now: the tool's own value, as the SDK would return it
        record = ledger.get(key)
        if record is not None and record.status is Status.SUCCEEDED and record.result:
            # A repeat: what the first call returned, as the type the tool declares (the SDK's
            # CallToolResult, content blocks, a model): the SDK answers it as it did the first.
            return _as_returned(json.loads(record.result), returns)
        if record is not None and record.status is Status.STARTED:
            raise _unknown(str(result["content"]))  # in doubt: the first attempt may have run
        raise _tool_error(str(result["content"]))


def _context_parameter(fn: Callable[..., Any]) -> str:
    """The name of ``fn``'s ``Context`` parameter, found as the SDK finds it."""
    injection = _first_module(
        "mcp.server.mcpserver.utilities.context_injection",  # SDK 2.x
        "mcp.server.fastmcp.utilities.context_injection",  # SDK 1.x
    )
    found: str | None = injection.find_context_parameter(fn)
    if not found:
        raise ConfigurationError(
            f"{getattr(fn, '__name__', fn)!r} takes no Context parameter: a keyed tool reads the "
            "idempotency key from the request, so give it one (ctx: Context)"
        )
    return found


@dataclass(frozen=True, slots=True, kw_only=True)
class _Call:
    """One keyed ``tools/call``: the tool, the client's key, the arguments as JSON."""

    name: str
    key: str
    arguments: dict[str, Any]


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(inspect.unwrap(fn))


def _returns(fn: Callable[..., Any]) -> TypeAdapter[Any] | None:
    """What ``fn`` declares it returns, to rebuild a recorded result as (``None``: nothing, or
    an annotation that cannot be resolved)."""
    try:
        annotation = inspect.signature(fn, eval_str=True).return_annotation
        if annotation is inspect.Signature.empty:
            return None
        return TypeAdapter(annotation)
    except Exception:  # whatever resolving a user's annotation raises: answer it as recorded
        return None


def _recordable(value: Any) -> Any:
    """What a tool returned, as it is recorded: the SDK's ``Image`` and ``Audio`` (not JSON) as
    the content blocks the SDK sends for them, so a repeat answers the same image."""
    if isinstance(value, list | tuple):
        return [_recordable(item) for item in value]
    convert = getattr(value, "to_image_content", None) or getattr(value, "to_audio_content", None)
    return convert() if callable(convert) and not isinstance(value, type) else value


def _as_returned(value: Any, returns: TypeAdapter[Any] | None) -> Any:
    """A recorded result as the type the tool returned it as, else as recorded (a result
    recorded as a note, or by a tool whose annotation changed since). Without an annotation,
    the SDK's own types are known by their recorded shape (``_by_shape``)."""
    if returns is None:
        return _by_shape(value)
    try:
        return returns.validate_python(value)
    except ValidationError:
        return value


def _by_shape(value: Any) -> Any:
    """A recorded ``CallToolResult`` or content block (or a list of blocks) as that type: a
    dict whose keys are exactly the fields the SDK type's dump has (every one, ``meta`` and
    ``annotations`` among them — no dict a tool builds by hand looks like that by chance), and,
    for a block, whose ``type`` is that block's. Anything else as recorded."""
    if isinstance(value, list):
        blocks = [_by_shape(item) for item in value]
        return blocks if all(b is not v for b, v in zip(blocks, value, strict=True)) else value
    if not isinstance(value, dict):
        return value
    types: Any = importlib.import_module("mcp.types")
    for name in ("CallToolResult", *_BLOCKS):
        model = getattr(types, name, None)
        if model is None or set(value) != set(model.model_fields):
            continue
        kind = model.model_fields.get("type")
        if kind is not None and value.get("type") != kind.default:
            continue
        try:
            return model.model_validate(value)
        except ValidationError:
            return value
    return value


# The content blocks a tool may answer (mcp.types), tried by shape on a repeat.
_BLOCKS = ("TextContent", "ImageContent", "AudioContent", "ResourceLink", "EmbeddedResource")


def _plain(value: Any) -> Any:
    """An argument as JSON (the SDK may have made a pydantic model of it)."""
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if callable(dump) else value


def _tool_error(message: str) -> Exception:
    """An error the SDK answers with ``isError`` and this message (not a generic one)."""
    exceptions = _first_module("mcp.server.mcpserver.exceptions", "mcp.server.fastmcp.exceptions")
    error: Exception = exceptions.ToolError(message)
    return error


def _unknown(message: str) -> Exception:
    """The JSON-RPC error ``OUTCOME_UNKNOWN_CODE``: the client keeps its call in doubt."""
    exceptions: Any = importlib.import_module("mcp.shared.exceptions")
    if hasattr(exceptions, "MCPError"):  # SDK 2.x
        error: Exception = exceptions.MCPError(code=OUTCOME_UNKNOWN_CODE, message=message)
        return error
    from mcp.types import ErrorData  # SDK 1.x

    old: Exception = exceptions.McpError(ErrorData(code=OUTCOME_UNKNOWN_CODE, message=message))
    return old


def _first_module(*names: str) -> Any:
    """The first of ``names`` that imports (the SDK moved its server modules in 2.0)."""
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ConfigurationError(f"the mcp SDK has none of {', '.join(names)}: pip install mcp")
