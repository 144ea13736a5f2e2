"""Tool declarations: ``@tool``, ``Tool``, ``ToolSet`` and the ``ToolContext`` a tool may ask for.

The input schema comes from the function's signature (through pydantic), the description from its
docstring; a parameter annotated ``ToolContext`` is injected at call time and never shown to the
model.
"""

from __future__ import annotations

from ._context import ToolContext
from ._json_schema import SchemaTool
from ._json_schema import check_json_input as check_json_input
from ._signature import InputError as InputError
from ._tool import DEFAULT_TIMEOUT, Tool, tool
from ._toolset import ToolSet

__all__ = [
    "DEFAULT_TIMEOUT",
    "SchemaTool",
    "Tool",
    "ToolContext",
    "ToolSet",
    "tool",
]
