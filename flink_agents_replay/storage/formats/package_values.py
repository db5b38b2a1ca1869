"""This package's classes inside a user's values, kept under a persisted name, never under a module path.

Users keep what the package hands them: a ``ChatResult`` in memory, a ``ToolLoopResult`` sent as an output, an
``InputEvent`` in a list, a caught ``ChatModelError``, an event class of a ``flink run -py`` script (pickled by
value, its base ``Event`` by reference). Pickled as they are, these would be named by the module that defines
the class (``flink_agents_replay.storage.records.chat.ChatResult``), and a later version that moved it could not read
the user's savepoints and journals. So the user-value pickler
(:func:`flink_agents_replay.storage.formats.plain.dump_user`) writes every *class* of the package it meets as a pickle
persistent id, plain data::

    ["flink-agents-replay", "class", <name in PERSISTED_CLASSES>]
    ["flink-agents-replay", "exception", <name in PACKAGE_EXCEPTIONS>]

and everything else as pickle does: an instance is its class (by that id) and its state, so ``__getstate__``,
enum members, exceptions' arguments, shared references and cycles work as for any class. Reading resolves the
name through the table, whatever module defines the class then: names are forever (rename a class, keep its
name; its target moves with the code).

The demo's agent, the testing API and the local services (``examples``, ``testing``, ``local``) are user code
shipped with the package: their classes pickle by reference, as a user's own do.

Limits: a class of the package not in the table (an internal one) and a function of the package are refused with
:class:`~flink_agents_replay.core.errors.NotPicklableError` (keep plain data, or a name, instead). Data holding these
ids does not read in 0.5.0 and earlier (a downgrade fails on it).
"""

from __future__ import annotations

import importlib
import types
from typing import Any

import flink_agents_replay.core.errors as errors
from flink_agents_replay.core.errors import NotPicklableError, SignatureError

__all__ = ["ASK", "ORDINARY", "PACKAGE", "PACKAGE_EXCEPTIONS", "PACKAGE_EXCEPTION_NAMES", "PERSISTED_CLASSES", "TAG",
           "holds_package_code", "object_kind", "package_class_from_id", "package_class_id"]

#: What marks a persistent id of this package (and tells ``load_user`` that the bytes may hold one).
TAG = "flink-agents-replay"
_PACKAGE = __name__.split(".")[0]

#: The persisted name of each class of the package that a user value may hold, and where it lives now.
PERSISTED_CLASSES: dict[str, str] = {
    "Agent": "flink_agents_replay.api.agent:Agent",
    "AgentConfig": "flink_agents_replay.flink.config:AgentConfig",
    "AgentOutput": "flink_agents_replay.flink.operator:AgentOutput",
    "Argument": "flink_agents_replay.api.tool_schema:Argument",
    "ChatModel": "flink_agents_replay.api.chat_model:ChatModel",
    "ChatResult": "flink_agents_replay.storage.records.chat:ChatResult",
    "Decision": "flink_agents_replay.storage.records.waits:Decision",
    "Event": "flink_agents_replay.core.events:Event",
    "FallbackChatModel": "flink_agents_replay.api.fallback_model:FallbackChatModel",
    "InDoubtCall": "flink_agents_replay.api.resources:InDoubtCall",
    "InDoubtPolicy": "flink_agents_replay.api.resources:InDoubtPolicy",
    "InputEvent": "flink_agents_replay.core.events:InputEvent",
    "McpServer": "flink_agents_replay.integrations.mcp_client:McpServer",
    "McpTool": "flink_agents_replay.api.mcp_tools:McpTool",
    "OutputEvent": "flink_agents_replay.core.events:OutputEvent",
    "Reconciler": "flink_agents_replay.api.resources:Reconciler",
    "Resource": "flink_agents_replay.api.resources:Resource",
    "RunnerContext": "flink_agents_replay.api.agent:RunnerContext",
    "SideEffects": "flink_agents_replay.api.resources:SideEffects",
    "Tool": "flink_agents_replay.api.resources:Tool",
    "ToolCall": "flink_agents_replay.storage.records.chat:ToolCall",
    "ToolLoopResult": "flink_agents_replay.api.tool_loop:ToolLoopResult",
    "TracingConfig": "flink_agents_replay.traces.export:TracingConfig",
    "Usage": "flink_agents_replay.storage.records.chat:Usage",
}
_NAME_OF = {target: name for name, target in PERSISTED_CLASSES.items()}

#: The persisted name of each of this package's exception types. Names are forever: rename a class, keep its name.
PACKAGE_EXCEPTIONS: dict[str, type[BaseException]] = {
    name: getattr(errors, name) for name in (
        "AgentDefinitionError", "CallBlocked", "CallInDoubtError", "CallTimeoutError", "ChatModelError",
        "ConfigError", "FingerprintMismatchError", "JournalClosedError", "JournalError", "JournalGapError",
        "JournalRecordTooLargeError", "MemoryNotFoundError", "NoSubAgentOutputError", "NotPicklableError",
        "ReplayConfigError",
        "ReplayIsolationError", "RunSlotTimeoutError", "SignatureError", "SubAgentCycleError", "SubAgentTimeoutError",
        "TopicMismatchError", "ToolLoopLimitError", "UnknownResourceError", "UnknownSubAgentError",
        "ToolCallDeniedError", "WaitNotSupportedError", "WaitTimedOutError",
        "ReconcileError", "McpToolError", "McpProtocolError", "McpConnectionError", "AttemptFencedError",
        "McpCallInDoubtError",
        "ReplayError",  # the base class, FlinkAgentsReplayError: its name before 0.2.0, which records keep
    )
}
#: The persisted name of each of this package's exception types, by type.
PACKAGE_EXCEPTION_NAMES = {kind: name for name, kind in PACKAGE_EXCEPTIONS.items()}

#: Modules of the package that hold *user* code as a user would write it.
_USER_CODE = tuple(f"{_PACKAGE}.{name}." for name in ("examples", "testing", "local"))
_kinds: dict[type, int] = {}
_MEMO_LIMIT = 4096


#: What :func:`object_kind` says of a type's instances.
ORDINARY, PACKAGE, ASK = 0, 1, 2


def object_kind(kind: type) -> int:
    """Of objects of type ``kind``: ``PACKAGE`` (instances of a package class), ``ASK`` (classes and functions:
    :func:`holds_package_code` tells), else ``ORDINARY``. Memoized: asked of every non-builtin object a value
    holds, so the common case is one dict lookup."""
    known = _kinds.get(kind)
    if known is None:  # first sight of the type
        if len(_kinds) >= _MEMO_LIMIT:  # types made at run time (pydantic create_model...) come and go
            _kinds.clear()
        if issubclass(kind, type) or kind is types.FunctionType:
            known = ASK
        else:
            known = PACKAGE if _package_module(getattr(kind, "__module__", None)) else ORDINARY
        _kinds[kind] = known
    return known


def holds_package_code(obj: Any) -> bool:
    """Whether ``obj`` is an instance or a class of the package's product code, or one of its functions."""
    known = object_kind(type(obj))
    if known is not ASK:
        return known is PACKAGE
    if isinstance(obj, type):
        return object_kind(obj) is PACKAGE
    return _package_module(obj.__module__)


def package_class_id(obj: Any) -> list[str] | None:
    """The persistent id of a class of the package (``None`` for any other object); refuses an internal class
    and the package's functions."""
    if object_kind(type(obj)) is not ASK or not holds_package_code(obj):
        return None
    if not isinstance(obj, type):
        raise NotPicklableError(f"holds {obj.__qualname__}, a function of flink-agents-replay, which is not kept in "
                                "user values: keep its name instead")
    if issubclass(obj, BaseException):
        return [TAG, "exception", _exception_name(obj)]
    name = _NAME_OF.get(f"{obj.__module__}:{obj.__qualname__}")
    if name is None:
        raise NotPicklableError(f"holds an object of {obj.__qualname__}, an internal class of flink-agents-replay "
                                "that is not kept in user values: keep plain data instead")
    return [TAG, "class", name]


def package_class_from_id(pid: Any) -> type:
    """The class :func:`package_class_id` named."""
    if not (isinstance(pid, list) and len(pid) == 3 and pid[0] == TAG):
        raise SignatureError(f"a value names an object this version cannot read: {pid!r:.200}")
    _, form, name = pid
    if form == "exception":
        kind = PACKAGE_EXCEPTIONS.get(name)
    else:
        target = PERSISTED_CLASSES.get(name) if form == "class" else None
        kind = _import(target) if target else None
    if kind is None:
        raise SignatureError(f"a value holds a {name} ({form}) of flink-agents-replay, which this version does not "
                             "know: it was written by a newer version")
    return kind


def _import(target: str) -> Any:
    module, qualname = target.split(":")
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def _exception_name(kind: type) -> str:
    name = PACKAGE_EXCEPTION_NAMES.get(kind)
    if name is None:
        raise NotPicklableError(f"holds a {kind.__qualname__}, an exception of flink-agents-replay without a "
                                "persisted name: keep str(exc) instead")
    return name


def _package_module(module: str | None) -> bool:
    module = module or ""
    return module.split(".")[0] == _PACKAGE and not (module + ".").startswith(_USER_CODE)
