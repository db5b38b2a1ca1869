"""Tools from an MCP server: one :class:`McpTool` resource per tool the server lists.

::

    from flink_agents_replay import Agent, ChatModel
    from flink_agents_replay.api.mcp_tools import McpServer, mcp_tools

    orders = McpServer(command="python", args=["-m", "orders_server", "--stdio"])   # or McpServer(url="http://...")
    agent = Triage(resources={"llm": ChatModel(...), **mcp_tools(orders, side_effects={"lookup_order": "none"})})

:func:`mcp_tools` lists the server's tools where it is called (in the job's client process), with their JSON input
schemas, so the tools an agent has are fixed when the job is built. Each is a
:class:`~flink_agents_replay.api.resources.Tool` that ``ctx.call(name, **arguments)`` and
:func:`~flink_agents_replay.api.tool_loop.run_tool_loop` use like any other; its arguments go to the server as the
``tools/call`` request's ``arguments`` (by name only).

**What an action gets.** The tool result's ``structuredContent`` when the server sent one (a dict), else the text
of its content blocks joined with newlines (a ``str``; images, audio and links are left out): plain data the journal
keeps. A result with ``isError: true`` raises :class:`~flink_agents_replay.core.errors.McpToolError` with its text;
a JSON-RPC error (an unknown tool, arguments the server refuses) raises
:class:`~flink_agents_replay.core.errors.McpProtocolError`; a server out of reach after the retries
(:mod:`flink_agents_replay.integrations.mcp_client`: 4 attempts, 0.2 s to 2 s apart) raises
:class:`~flink_agents_replay.core.errors.McpConnectionError`. Each is journaled like any call's exception.

**Idempotency.** Every call sends its call id (:func:`~flink_agents_replay.api.resources.current_call_id`, the same
in every attempt) in the request's ``_meta`` as ``{"idempotency_key": <call id>}``. It helps only servers that
honour it: any other server acts again when a call in doubt is made again.

**Side effects.** The MCP spec says a client must not trust tool annotations from servers it does not trust, so
every MCP tool is ``external`` by default (a *started* record before each call, and the ``in_doubt`` policy after
a crash during it). ``trust_annotations=True`` takes the server's word: ``readOnlyHint: true`` makes a tool
``none``, ``idempotentHint: true`` makes it ``idempotent``, anything else ``external``. ``side_effects=`` sets
tools one by one, over both.

**Replays.** An MCP tool carries ``replay_default = "blocked"``: a replay blocks it unless its policy names it,
whatever its annotations (a "read-only" tool of a production server must not run from a replay by default).

**Sessions.** Each process keeps one session per server
(:func:`~flink_agents_replay.integrations.mcp_client.session_pool`); a stdio server is started by each process that
calls it (every TaskManager Python worker), an HTTP server by whoever runs it. A broken session is opened again on
the next attempt.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from typing import Any

from flink_agents_replay.api.call_site import current_call_id
from flink_agents_replay.api.resources import InDoubt, InDoubtPolicy, SideEffects, Tool
from flink_agents_replay.core.errors import ConfigError
from flink_agents_replay.integrations.mcp_client import McpServer, list_tools, session_pool

__all__ = ["McpCall", "McpServer", "McpTool", "mcp_tools", "resource_names"]

#: The tool names a chat model accepts (OpenAI's function names), hence the resource names MCP tools get.
_MODEL_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class McpCall:
    """What an MCP tool's call runs: ``tools/call`` of ``tool`` on ``server`` through this process's session pool,
    with the call id in ``_meta``. Small and picklable: it travels to the TaskManagers with its tool."""

    def __init__(self, server: McpServer, tool: str, timeout_s: float | None = None, resend: bool = True):
        self.server = server
        self.tool = tool
        self.timeout_s = timeout_s
        self.resend = resend  # a request sent and not answered is sent again at once (rerun); else in doubt

    def __call__(self, *args: Any, **arguments: Any) -> Any:
        if args:
            raise TypeError(f"the MCP tool {self.tool!r} takes its arguments by name, got {len(args)} positional "
                            f"argument(s): ctx.call(name, order_id=...)")
        return session_pool().call_tool(self.server, self.tool, arguments, idempotency_key=current_call_id(),
                                        timeout_s=self.timeout_s, resend=getattr(self, "resend", True))

    def __repr__(self) -> str:
        return f"McpCall({self.tool!r}, {self.server.describe()})"


class McpTool(Tool):
    """One tool of an MCP server, as listed when the job was built (see the module docstring).

    Attributes:
        server: where the tool is. mcp_name: its name on the server (the resource may be named otherwise).
        listing: the tool as the server listed it (``name``, ``title``, ``description``, ``inputSchema``,
            ``outputSchema``, ``annotations``).
        replay_default: ``"blocked"``: what a replay does with the tool's calls unless its policy says otherwise.
    """

    #: A replay blocks MCP tools unless told otherwise, whatever their annotations.
    replay_default = "blocked"

    def __init__(self, server: McpServer, listing: Mapping[str, Any], *, name: str | None = None,
                 side_effects: SideEffects | str = SideEffects.EXTERNAL,
                 in_doubt: InDoubt = InDoubtPolicy.RERUN, timeout_s: float | None = None):
        if timeout_s is not None and not 0 < timeout_s < float("inf"):
            raise ValueError(f"McpTool timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self.server = server
        self.mcp_name = listing["name"]
        self.listing = copy.deepcopy(dict(listing))
        schema = self.listing.get("inputSchema") or {"type": "object", "properties": {}}
        # The call's deadline is the session's to keep (CallTimeoutError), not a thread's: Tool's own timeout_s
        # stays None.
        super().__init__(McpCall(server, self.mcp_name, timeout_s), side_effects=side_effects, in_doubt=in_doubt,
                         name=name or self.mcp_name,
                         description=self.listing.get("description") or self.listing.get("title") or "",
                         schema=schema)
        self.call_timeout_s = timeout_s
        # A request sent and not answered is sent again at once only when the next attempt would do the same (under
        # the same key): a tool without effects, or an external one whose in-doubt policy is rerun. A reconciler,
        # fail or assume_done decides in the engine instead.
        self.function.resend = self.side_effects is not SideEffects.EXTERNAL or self.in_doubt is InDoubtPolicy.RERUN

    def definition(self) -> dict[str, Any]:
        """What the tool is, as plain JSON data, stable across processes: its names, description, input schema,
        annotations and output schema as listed, its side effects and its server's identity (no secrets). Two
        builds of a job with the same definition call the same tool the same way."""
        return json.loads(json.dumps({
            "kind": "mcp",
            "name": self.name,
            "mcp_name": self.mcp_name,
            "title": self.listing.get("title"),
            "description": self.listing.get("description"),
            "input_schema": self.listing.get("inputSchema"),
            "output_schema": self.listing.get("outputSchema"),
            "annotations": self.listing.get("annotations") or {},
            "side_effects": self.side_effects.value,
            "server": self.server.identity(),
        }, sort_keys=True))

    def __repr__(self) -> str:
        return f"McpTool({self.mcp_name!r}, {self.server.describe()}, side_effects={self.side_effects.value})"


def resource_names(tool_names: list[str], *, prefix: str = "", rename: Mapping[str, str] | None = None
                   ) -> dict[str, str]:
    """The resource name of each MCP tool: ``rename``'s, else ``prefix`` + the tool's own name. Every name must
    be one a chat model can call (letters, digits, ``_`` and ``-``, at most 64), since the model is shown the
    resource name: a ``ConfigError`` names those that are not and suggests a ``rename``."""
    rename = dict(rename or {})
    unknown = sorted(set(rename) - set(tool_names))
    if unknown:
        raise ConfigError(f"rename= names tools the server does not have: {unknown} (it has {sorted(tool_names)})")
    names = {tool: rename.get(tool, prefix + tool) for tool in tool_names}
    bad = {tool: name for tool, name in names.items() if not _MODEL_TOOL_NAME.fullmatch(name)}
    if bad:
        suggestion = {tool: re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64] or "tool" for tool, name in bad.items()}
        raise ConfigError(f"MCP tools get resource names a chat model can call (letters, digits, _ and -, at most "
                          f"64), and these are not: {sorted(bad.values())}; give mcp_tools(..., rename={suggestion!r})")
    taken: dict[str, str] = {}
    for tool, name in names.items():
        if name in taken:
            raise ConfigError(f"the MCP tools {taken[name]!r} and {tool!r} would both be named {name!r}: rename one")
        taken[name] = tool
    return names


def _side_effects(listing: Mapping[str, Any], trust_annotations: bool, explicit: str | None) -> SideEffects:
    if explicit is not None:
        return SideEffects(explicit)
    annotations = listing.get("annotations") or {}
    if trust_annotations and annotations.get("readOnlyHint") is True:
        return SideEffects.NONE
    if trust_annotations and annotations.get("idempotentHint") is True:
        return SideEffects.IDEMPOTENT
    return SideEffects.EXTERNAL


def mcp_tools(server: McpServer, *, trust_annotations: bool = False,
              side_effects: Mapping[str, SideEffects | str] | None = None,
              in_doubt: InDoubt = InDoubtPolicy.RERUN, timeout_s: float | None = None,
              prefix: str = "", rename: Mapping[str, str] | None = None) -> dict[str, McpTool]:
    """The server's tools as resources, by resource name: ``Agent(resources={"llm": ..., **mcp_tools(server)})``.

    Lists the tools now (a stdio server is started for the listing and stopped after it).

    Args:
        server: the MCP server.
        trust_annotations: take the server's ``readOnlyHint`` (``none``) and ``idempotentHint`` (``idempotent``)
            as the tools' side effects; by default every tool is ``external``.
        side_effects: side effects by the server's tool name, over the defaults and the annotations. A name the
            server does not list is a ``ConfigError``.
        in_doubt: every tool's in-doubt policy (``rerun`` by default: made again under the same call id, which
            goes to the server in ``_meta``).
        timeout_s: how long a call may take (then :class:`~flink_agents_replay.core.errors.CallTimeoutError`,
            and the call is in doubt); ``None`` waits as long as it takes.
        prefix: put before every tool's name, to make the resource names (``prefix="orders_"``).
        rename: resource names by the server's tool name, for tool names a model cannot call (a ``.``) or that
            clash with other resources.
    """
    if not isinstance(server, McpServer):
        raise TypeError(f"mcp_tools takes an McpServer(command=...) or McpServer(url=...), got {server!r}")
    explicit = dict(side_effects or {})
    for tool, value in explicit.items():
        try:
            SideEffects(value)
        except ValueError:
            raise ConfigError(f"side_effects[{tool!r}] must be none, idempotent or external, got {value!r}") from None
    listings = list_tools(server)
    tool_names = [listing["name"] for listing in listings]
    unknown = sorted(set(explicit) - set(tool_names))
    if unknown:
        raise ConfigError(f"side_effects= names tools {server.describe()} does not list: {unknown} (it lists "
                          f"{sorted(tool_names)})")
    names = resource_names(tool_names, prefix=prefix, rename=rename)
    return {names[listing["name"]]: McpTool(server, listing, name=names[listing["name"]],
                                            side_effects=_side_effects(listing, trust_annotations,
                                                                       explicit.get(listing["name"])),
                                            in_doubt=in_doubt, timeout_s=timeout_s)
            for listing in listings}
