"""Tools a model can call: ``@tool`` and the JSON schema a chat model is shown of each.

A tool is a :class:`~flink_agents_replay.api.resources.Tool` resource with a name, a description and a JSON schema
of its arguments, derived from the function's type hints and docstring (pydantic builds the schema)::

    @tool(side_effects="none")
    def lookup_order(order_id: str, include_items: bool = False) -> dict:
        \"\"\"Look up an order: its status, carrier and items.

        Args:
            order_id: the order's id, like A-1234.
            include_items: also list the items.
        \"\"\"
        ...

    agent = Triage(resources={"llm": ChatModel(...), "lookup_order": lookup_order})

``Tool(fn, schema={...})`` gives a schema by hand instead. An action hands the model the tools by name
(``ctx.tool_schemas("lookup_order")``, plain dicts in OpenAI's ``tools`` format, so the model call's arguments
stay plain data) and calls the one the model chose like any resource, ``ctx.call(call.name, **call.arguments)``;
:func:`flink_agents_replay.api.tool_loop.run_tool_loop` does the whole loop. A tool keeps its declared side effects
and in-doubt policy whoever decided to call it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flink_agents_replay.api.resources import InDoubt, InDoubtPolicy, SideEffects, Tool
from flink_agents_replay.api.tool_schema import (
    Argument,
    arguments_model,
    bound_arguments,
    function_arguments,
    function_schema,
    model_json_schema,
    schema_of,
    summary,
    takes_any_keyword,
    tool_name,
)

__all__ = ["Argument", "ToolSpec", "arguments_model", "bound_arguments", "function_arguments", "function_schema",
           "model_json_schema", "schema_of", "summary", "takes_any_keyword", "tool", "tool_name", "tool_schemas"]

#: What a model call's ``tools=`` takes: tools, or tool schemas in OpenAI's format.
ToolSpec = Tool | Mapping[str, Any]


def tool(function: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None,
         side_effects: SideEffects | str = SideEffects.EXTERNAL, in_doubt: InDoubt = InDoubtPolicy.RERUN,
         timeout_s: float | None = None) -> Any:
    """Make ``function`` a :class:`Tool` whose schema comes from its signature (``@tool`` or ``@tool(...)``).

    Side effects default to ``external``, the safe assumption (see :mod:`flink_agents_replay.api.resources`).
    """
    def make(fn: Callable[..., Any]) -> Tool:
        return Tool(fn, side_effects=side_effects, in_doubt=in_doubt, timeout_s=timeout_s, name=name,
                    description=description)

    return make(function) if function is not None else make


def tool_schemas(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """OpenAI's ``tools`` request field for ``tools`` (a Tool's own schema; a dict as given)."""
    schemas = []
    for item in tools:
        if isinstance(item, Tool):
            schemas.append(item.openai_schema())
        elif isinstance(item, Mapping):
            schemas.append(dict(item))
        else:
            raise TypeError(f"tools= takes Tool objects or OpenAI tool dicts, not {type(item).__name__}")
    return schemas
