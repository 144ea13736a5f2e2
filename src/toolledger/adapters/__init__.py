"""Adapters between model APIs (Anthropic, OpenAI, MCP) and toolledger's calls and results."""
