"""Claude Agent SDK: in-process tools whose calls go through the toolledger ledger.

The SDK's in-process tools (`@claude_agent_sdk.tool`) get their arguments but not the call's
`tool_use_id`; its `PreToolUse` hook gets both. So a hook passes the id on to the tool inside its
input (`updatedInput`), and the tool's handler runs the toolledger tool through the ledger with
that id: a resumed session that repeats a call gets the recorded result, and the effect happens
once. See docs/integrations/claude-agent-sdk.md.

The SDK's agent loop needs the Claude Code CLI and the Anthropic API (the network); this example
runs offline by calling the hook and the tool handler exactly as the SDK would, with the SDK's
own types. It exits 0 with a note when claude-agent-sdk is not installed:

    pip install claude-agent-sdk && python examples/recipe_claude_agent_sdk.py
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import toolledger as tl

try:
    import claude_agent_sdk as sdk
    import mcp
except ImportError:
    print("claude-agent-sdk is not installed: pip install claude-agent-sdk (skipping this recipe)")
    sys.exit(0)

ID_KEY = "_toolledger_tool_use_id"  # carries the call's id from the hook to the handler


def ledger_hook(tool_names: set[str]) -> sdk.HookCallback:
    """A `PreToolUse` hook handing each ledgered call its `tool_use_id`."""

    async def pre_tool_use(
        input_data: Any, tool_use_id: str | None, context: sdk.HookContext
    ) -> Any:
        if input_data["tool_name"] not in tool_names:
            return {}
        updated = {**input_data["tool_input"], ID_KEY: input_data["tool_use_id"]}
        return {
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "allow",
                "updatedInput": updated,
            }
        }

    return pre_tool_use


def ledgered(declared: tl.Tool[Any, Any], ledger: tl.Ledger, *, approve: Any = None) -> Any:
    """An SDK in-process tool running ``declared`` through the ledger."""

    # The SDK's server checks every call's arguments against this schema before the handler
    # runs, so the id the hook adds must be a property of it (an optional one, overwritten by
    # the hook whatever the model sends).
    schema = dict(declared.input_schema)
    schema["properties"] = {
        **schema.get("properties", {}),
        ID_KEY: {"type": "string", "description": "set by the runtime; leave it out"},
    }

    @sdk.tool(declared.name, declared.description, schema)
    async def handler(args: dict[str, Any]) -> dict[str, Any]:
        arguments = dict(args)
        tool_use_id = arguments.pop(ID_KEY, None)
        if not tool_use_id:
            raise RuntimeError(f"{declared.name}: install ledger_hook as a PreToolUse hook")
        block = {"type": "tool_use", "id": tool_use_id, "name": declared.name, "input": arguments}
        (result,) = await tl.arun_tool_uses([block], [declared], ledger=ledger, approve=approve)
        return {
            "content": [{"type": "text", "text": result["content"]}],
            "is_error": bool(result.get("is_error")),
        }

    return handler


tickets: list[str] = []


@tl.tool(effect="non_idempotent")
def create_ticket(title: str) -> dict[str, str]:
    """Open a support ticket."""
    tickets.append(title)
    return {"ticket": f"T-{len(tickets)}"}


async def main() -> None:
    with tl.open_store("memory://claude-agent-sdk-recipe") as store:
        ticket_tool = ledgered(create_ticket, store.ledger("claude-session-1"))
        server = sdk.create_sdk_mcp_server("tickets", tools=[ticket_tool])
        hook = ledger_hook({"mcp__tickets__create_ticket"})
        options = sdk.ClaudeAgentOptions(  # what you pass to ClaudeSDKClient / query()
            mcp_servers={"tickets": server},
            allowed_tools=["mcp__tickets__create_ticket"],
            hooks={"PreToolUse": [sdk.HookMatcher(matcher="mcp__tickets__.*", hooks=[hook])]},
        )
        # What Claude Code does for one call, twice (the second time as after a crash and
        # resume): the hook, then `tools/call` with the hook's `updatedInput` to the SDK's
        # in-process server, which checks the arguments against the tool's schema.
        call = {
            "hook_event_name": "PreToolUse",
            "session_id": "claude-session-1",
            "transcript_path": "",
            "cwd": ".",
            "tool_name": "mcp__tickets__create_ticket",
            "tool_input": {"title": "Checkout down"},
            "tool_use_id": "toolu_01",
        }
        answers = []
        async with mcp.Client(server["instance"]) as claude_code:
            for _ in range(2):
                decision = await hook(call, call["tool_use_id"], {"signal": None})
                arguments = decision["hookSpecificOutput"]["updatedInput"]
                result = await claude_code.call_tool("create_ticket", arguments)
                text = result.content[0].text if result.content else ""
                answers.append(f"error: {text}" if result.is_error else text)
    print(f"answers: {answers}; tickets opened: {len(tickets)}; hooks: {list(options.hooks or {})}")
    if len(tickets) != 1 or answers[0] != answers[1] or answers[0].startswith("error"):
        sys.exit("the call did not open one ticket and answer the same twice")


if __name__ == "__main__":
    asyncio.run(main())
