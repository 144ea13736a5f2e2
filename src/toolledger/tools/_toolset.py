"""``ToolSet``: the tools one agent may call, by name, and the ``tools=`` lists of each API."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..codec import DEFAULT_MAX_RESULT_BYTES
from ..errors import ConfigurationError
from ._tool import Tool

__all__ = ["ToolSet"]


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
