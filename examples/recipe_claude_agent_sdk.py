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

    @sdk.tool(declared.name, declared.description, declared.input_schema)
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
        # What the SDK does for one call, twice: the second time as after a crash and resume.
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
        for _ in range(2):
            decision = await hook(call, call["tool_use_id"], {"signal": None})
            result = await ticket_tool.handler(decision["hookSpecificOutput"]["updatedInput"])
            answers.append(result["content"][0]["text"])
    print(f"answers: {answers}; tickets opened: {len(tickets)}; hooks: {list(options.hooks or {})}")
    if len(tickets) != 1 or answers[0] != answers[1]:
        sys.exit("a ticket was opened twice")


if __name__ == "__main__":
    asyncio.run(main())
