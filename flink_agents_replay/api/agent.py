"""The agent API: what a user writes.

An agent is a class whose *actions* react to *events*::

    class Triage(Agent):
        @action(InputEvent)
        def classify(event, ctx):
            label = ctx.call("llm", prompt=f"classify: {event.input}")   # journaled call
            ctx.memory.set("last_label", label)
            ctx.send_event(Classified(label=label))

        @action(Classified)
        def answer(event, ctx):
            ctx.send_event(OutputEvent(output={"label": event.label}))

    agent = Triage(resources={"llm": ChatModel(...)})

Each input becomes an :class:`InputEvent`; every action registered for an event's type runs (in the
order the class defines them), and the events they send trigger further actions until none is
pending. :class:`OutputEvent` s leave the operator. Models and tools are *resources* registered on the
agent and called through ``ctx.call``: that one boundary is where journaling, reuse after failures and
metrics live. A call made any other way (a raw HTTP request inside an action) is invisible to the
runtime and runs again after a failure.

Events and memory values must be picklable with cloudpickle: they are journaled and kept in Flink state.

Agent and sub-agent names may not contain whitespace, ``:`` or ``/``: the journal uses the last two as
separators (:attr:`Agent.name`).

**Action fingerprints.** Every journaled action completion carries the fingerprint of the action's code
(:attr:`ActionSpec.fingerprint`); a restore or a replay that finds a completion written with another
fingerprint applies ``fingerprint_policy``. A fingerprint is the action's own: adding, removing or
changing another action of the agent leaves it unchanged (a deploy that adds a notification action must not
make an unchanged action that charges a card run again under ``fingerprint_policy="re-execute"``). It covers
the action's name, its triggering event types and its code. The same code gives the same fingerprint in every
Python process of the same Python version: nothing that differs between processes counts (hash seed, memory
addresses, set and dict iteration order), and neither do line numbers, the file, or the action's function
name. What counts as the action's code:

- the function's bytecode, names, variable names (local, free, cell), argument counts, exception table
  and constants, and every nested code object (lambdas, comprehensions, inner functions) the same way;
- its default values and the contents of its closure cells;
- constants, defaults and closure contents that are plain data: ``None``, ``bool``, ``int``, ``float``,
  ``complex``, ``str``, ``bytes``, ``...``, and tuples, lists, dicts, sets and frozensets of them,
  encoded canonically (set elements and dict items sorted by their encodings, containers recursively);
- functions among them (a helper the action closes over): their code, defaults and closure, recursively
  (a cycle stops at the repeated value; beyond 24 levels of nesting only a marker counts);
- any other object (a client, an enum member, a dict subclass) counts only by its type's qualified
  name, never by its state or ``repr``; a class counts by its qualified name, a builtin function by its
  name, a bound method by its function and the type of the object it is bound to.

Not covered: what the action reaches through global names — a module-level helper function, constant or
class it calls by name can change without changing the fingerprint — and the code of resources. The
bytecode is the running Python's: another Python minor version gives other fingerprints.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import re
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from flink_agents_replay.api.memory import Memory
from flink_agents_replay.api.resources import Resource, Tool
from flink_agents_replay.core.errors import (
    AgentDefinitionError,
    UnknownResourceError,
    UnknownSubAgentError,
    WaitNotSupportedError,
)
from flink_agents_replay.core.events import Event, EventTypes, InputEvent, OutputEvent, with_event_id
from flink_agents_replay.core.moved import module_in_0_5_1
from flink_agents_replay.storage.records.waits import RAISE

#: The names a model can call a tool by (OpenAI function names).
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")

__all__ = ["ActionSpec", "Agent", "Event", "InputEvent", "OutputEvent", "RunnerContext", "action", "with_event_id"]

log = logging.getLogger(__name__)

_ACTION_ATTRIBUTE = "__flink_agents_replay_action__"
#: Characters an agent name may not contain, and what the journal uses them for.
_NAME_SEPARATORS = {":": "between the parts of a record key", "/": "between the agents of a sub-agent path"}


def action(*event_types: type[Event]) -> Callable[[Callable], staticmethod]:
    """Mark ``fn(event, ctx)`` as an action triggered by events of ``event_types`` (or subclasses)."""
    if not event_types:
        raise AgentDefinitionError("@action needs at least one event type, e.g. @action(InputEvent)")
    for event_type in event_types:
        if not (isinstance(event_type, type) and issubclass(event_type, Event)):
            raise AgentDefinitionError(f"@action takes Event subclasses, got {event_type!r}")

    def mark(fn: Callable) -> staticmethod:
        function = fn.__func__ if isinstance(fn, staticmethod) else fn
        setattr(function, _ACTION_ATTRIBUTE, tuple(event_types))
        return staticmethod(function)

    return mark


@dataclass(frozen=True)
class ActionSpec:
    """One action of an agent: its name, function, triggering event types and code fingerprint.

    ``fingerprint`` identifies the action's code, name and triggering event types, the same in every process
    running the same code (see *Action fingerprints* in :mod:`flink_agents_replay.api.agent`); the other
    actions of the agent do not count. ``whole_agent_fingerprint`` is the fingerprint 0.5.1 and earlier gave
    it, which also covered every other action's name and triggers: completions they journaled still match.
    """

    name: str
    function: Callable
    event_types: tuple[type[Event], ...]
    fingerprint: str
    whole_agent_fingerprint: str = ""

    def handles(self, event: Event) -> bool:
        """Whether ``event`` triggers this action."""
        return isinstance(event, self.event_types)

    def wrote(self, fingerprint: str) -> bool:
        """Whether a record journaled with ``fingerprint`` was written by this action's code."""
        return fingerprint == self.fingerprint or fingerprint == self.whole_agent_fingerprint


class Agent:
    """Base class of agents: subclass it and decorate actions with :func:`action`.

    Args:
        name: the agent's name (default: the class name). It derives the operator's uid and the
            journal topic, so changing it after a savepoint was taken breaks restoring from it. It may not
            contain whitespace, ``:`` or ``/`` (see :attr:`name`).
        resources: models and tools by name; a plain callable is registered as a :class:`Tool`.
        sub_agents: agents this one calls with ``ctx.call_agent`` (registered under their names).
    """

    def __init__(self, *, name: str | None = None, resources: Mapping[str, Resource | Callable] | None = None,
                 sub_agents: Iterable[Agent] = ()):
        self.name = name or type(self).__name__
        self._resources: dict[str, Resource] = {}
        for resource_name, resource in (resources or {}).items():
            self.add_resource(resource_name, resource)
        self._sub_agents: dict[str, Agent] = {}
        for sub_agent in sub_agents:
            self.add_sub_agent(sub_agent)
        self.actions: tuple[ActionSpec, ...] = _collect_actions(type(self))
        if not self.actions:
            raise AgentDefinitionError(f"agent {self.name} defines no action: decorate one with @action(InputEvent)")
        if not any(issubclass(InputEvent, spec.event_types) for spec in self.actions):
            raise AgentDefinitionError(f"agent {self.name} has no action for InputEvent, so inputs would do nothing")
        for shared, classes in self.event_types().shared_names().items():
            log.warning("agent %s handles several event classes named %r (%s): their journaled events are told apart "
                        "by module only, so renaming one of the modules breaks restores; give each a distinct "
                        "__event_name__", self.name, shared, ", ".join(classes))

    @property
    def name(self) -> str:
        """The agent's name; for a sub-agent also its name in ``ctx.call_agent`` and in its actions' names.

        Checked whenever it is set: it must be non-empty, without whitespace and without ``:`` or ``/``
        (else :class:`AgentDefinitionError`). The journal joins a record key's parts with ``:``, so a
        sub-agent named with one writes records whose keys no restore can read back; it journals a
        sub-agent's actions as ``<sub-agent>/<action>`` (``/`` joins a nested path), so a ``/`` in a name
        makes different paths journal under the same action name. An agent's name also derives its
        journal topic, where Kafka allows neither.
        """
        return self._name

    @name.setter
    def name(self, name: str) -> None:
        if not isinstance(name, str) or not name or any(c.isspace() for c in name):
            raise AgentDefinitionError(f"agent name must be non-empty without spaces, got {name!r}")
        separator = next((c for c in name if c in _NAME_SEPARATORS), None)
        if separator is not None:
            raise AgentDefinitionError(
                f"agent name {name!r} contains {separator!r}, which the journal uses as a separator "
                f"({_NAME_SEPARATORS[separator]}): choose a name without ':' and '/', e.g. "
                f"{name.replace(':', '-').replace('/', '-')!r}")
        self._name = name

    def add_resource(self, name: str, resource: Resource | Callable) -> Agent:
        """Register ``resource`` (a :class:`Resource`, or a callable as a tool) under ``name``."""
        if not isinstance(name, str) or not name:
            raise AgentDefinitionError(f"resource name must be a non-empty string, got {name!r}")
        if name.startswith("@"):  # the journal's own calls: a wait (@wait) and its decision (@decision)
            raise AgentDefinitionError(f"resource name {name!r}: names starting with '@' are reserved for waits")
        if not isinstance(resource, Resource):
            if not callable(resource):
                raise AgentDefinitionError(f"resource {name!r} must be a Resource or a callable, got {resource!r}")
            resource = Tool(resource)
        self._resources[name] = resource
        return self

    def resource(self, name: str) -> Resource:
        """The resource registered under ``name``."""
        try:
            return self._resources[name]
        except KeyError:
            known = ", ".join(sorted(self._resources)) or "none"
            raise UnknownResourceError(
                f"agent {self.name} has no resource {name!r} (registered: {known}); add it with "
                f"resources={{{name!r}: ...}} or agent.add_resource({name!r}, ...)"
            ) from None

    def add_sub_agent(self, agent: Agent) -> Agent:
        """Register ``agent`` as a sub-agent: actions call it with ``ctx.call_agent(agent.name, input)``."""
        if not isinstance(agent, Agent):
            raise AgentDefinitionError(f"a sub-agent must be an Agent instance, got {type(agent).__name__}")
        if "." in agent.name:
            raise AgentDefinitionError(f"a sub-agent's name names its memory scope and cannot contain '.': "
                                       f"{agent.name!r}")
        waiting = [name for name, resource in agent.resources.items() if getattr(resource, "needs_approval", False)]
        if waiting:
            raise AgentDefinitionError(f"sub-agent {agent.name}: its tools {waiting} need approval, and only a "
                                       "top-level agent's actions can wait: give the tools to the calling agent")
        self._sub_agents[agent.name] = agent
        return self

    def sub_agent(self, agent_or_name: Agent | str) -> Agent:
        """The registered sub-agent ``agent_or_name`` (an agent registered on this one, or its name)."""
        name = agent_or_name.name if isinstance(agent_or_name, Agent) else agent_or_name
        found = self._sub_agents.get(name)
        if found is None:
            known = ", ".join(sorted(self._sub_agents)) or "none"
            raise UnknownSubAgentError(
                f"agent {self.name} has no sub-agent {name!r} (registered: {known}); register it with "
                f"{type(self).__name__}(sub_agents=[...]) or agent.add_sub_agent(...)"
            )
        return found

    @property
    def sub_agents(self) -> Mapping[str, Agent]:
        """Registered sub-agents by name."""
        return types.MappingProxyType(self._sub_agents)

    @property
    def resources(self) -> Mapping[str, Resource]:
        """All registered resources by name."""
        return types.MappingProxyType(self._resources)

    def actions_for(self, event: Event) -> list[ActionSpec]:
        """The actions ``event`` triggers, in definition order."""
        return [spec for spec in self.actions if spec.handles(event)]

    def event_types(self) -> EventTypes:
        """Resolves the names of events persisted by this agent (its and its sub-agents' action triggers first)."""
        declared: dict[type[Event], None] = {}
        pending, seen = [self], set()
        while pending:
            agent = pending.pop()
            if id(agent) not in seen:
                seen.add(id(agent))
                declared.update(dict.fromkeys(kind for spec in agent.actions for kind in spec.event_types))
                pending.extend(agent.sub_agents.values())
        return EventTypes(declared)


class RunnerContext:
    """What an action receives as ``ctx``: memory, sending events, and journaled calls.

    Created by the runtime for each action execution; not constructed by users.
    """

    def __init__(self, *, key: Any, seq: int, memory: Memory, send: Callable[[Event], None],
                 call: Callable[..., Any], call_agents: Callable[..., list[list[Any]]] | None = None,
                 event_time: int | None = None, resources: Mapping[str, Resource] | None = None,
                 wait_for: Callable[..., Any] | None = None):
        self._resources = resources or {}
        self._wait_for = wait_for
        self._key = key
        self._event_time = event_time
        self._seq = seq
        self._memory = memory
        self._send = send
        self._call = call
        self._call_agents = call_agents

    @property
    def key(self) -> Any:
        """The key of the input being processed."""
        return self._key

    @property
    def seq(self) -> int:
        """The per-key sequence number of the input (1 for a key's first input)."""
        return self._seq

    @property
    def event_time(self) -> int | None:
        """The input's event time (epoch milliseconds, Flink's record timestamp), or ``None`` if it has none.

        A replay gives every input the event time production saw."""
        return self._event_time

    @property
    def memory(self) -> Memory:
        """The key's short-term memory (dotted paths).

        ``get`` returns the stored object: change it in place (``ctx.memory.get("log").append(x)``) or replace
        it with ``set``, both count and both are reproduced when the action is reused after a failure. After
        the action, entries it changed or set are private copies (no other entry or event shares them).
        """
        return self._memory

    def send_event(self, event: Event) -> None:
        """Send ``event``: it triggers the actions registered for its type, or leaves as output.

        The event is taken as it is when the action ends (later changes to objects it shares with memory do
        not reach it), and an action handling it gets its own copy when several actions handle it.
        """
        if not isinstance(event, Event):
            raise TypeError(f"send_event takes an Event, got {type(event).__name__}: {event!r}")
        self._send(event)

    def call(self, resource_name: str, *args: Any, **kwargs: Any) -> Any:
        """Call a registered resource; journaled, and reused instead of repeated after a failure."""
        return self._call(resource_name, *args, **kwargs)

    def wait_for(self, name: str, payload: Any = None, *, timeout_s: float | None = None,
                 on_timeout: Any = RAISE) -> Any:
        """Wait for an outside decision (a person's approval, a signal); return it as a
        :class:`~flink_agents_replay.storage.records.waits.Decision`.

        The run stops here and waits, holding no thread and no run slot; ``payload`` (JSON data) leaves with
        the pending wait for whoever decides. When the decision arrives, the action runs again from its start:
        every call it made before the wait is reused from the journal, not made again, and this time
        ``wait_for`` returns the decision. Code before the wait therefore runs twice (keep it to ``ctx.call``
        s and plain computation). The wait's id is derived like a call id (the same after a failover, in every
        process); the decision is journaled, so a later failure reuses it.

        ``timeout_s`` bounds the wait (its deadline is fixed when the wait first opens); when it passes with no
        decision, ``wait_for`` returns ``on_timeout`` if given, else raises
        :class:`~flink_agents_replay.core.errors.WaitTimedOutError`. Only a top-level agent's actions can wait
        (:class:`~flink_agents_replay.core.errors.WaitNotSupportedError` in a sub-agent).
        """
        if self._wait_for is None:
            raise WaitNotSupportedError("wait_for needs the runtime that runs actions")
        return self._wait_for(name, payload, timeout_s=timeout_s, on_timeout=on_timeout)

    def tool_schemas(self, *names: str) -> list[dict[str, Any]]:
        """The tools registered under ``names`` as a chat model is shown them (OpenAI's ``tools`` format, plain
        data), each named by its *resource name* (the model calls it by that name, whatever the tool's own
        ``name``): pass them as ``ctx.call("llm", messages=..., tools=...)``."""
        schemas = []
        for name in names:
            resource = self._resources.get(name)
            if not isinstance(resource, Tool):
                raise UnknownResourceError(f"{name!r} is not a tool of this agent (tools: "
                                           f"{sorted(n for n, r in self._resources.items() if isinstance(r, Tool))})")
            if not _FUNCTION_NAME.fullmatch(name):
                raise AgentDefinitionError(f"a model calls tools by name, and {name!r} is not one it can use "
                                           "(letters, digits, _ and -, at most 64): register the tool under "
                                           "such a name")
            schema = resource.openai_schema()
            schemas.append({**schema, "function": {**schema["function"], "name": name}})
        return schemas

    def tool_arguments(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """A model's JSON ``arguments`` for tool ``name`` as its function's types (``ValueError`` if they do
        not fit): what :func:`~flink_agents_replay.api.tool_loop.run_tool_loop` calls the tool with."""
        resource = self._resources.get(name)
        return resource.model_arguments(arguments) if isinstance(resource, Tool) else dict(arguments)

    def call_agent(self, agent: Agent | str, input: Any, *, timeout: float | None = None) -> list[Any]:  # noqa: A002
        """Run a registered sub-agent on ``input`` and return its outputs (the ``output`` of each OutputEvent).

        The call finishes when the child has no event pending, like a top-level run. The child has its own
        memory scope under this key (memory path ``_sub_agents.<name>``), every child action and call is
        journaled under this run, and after a failure completed child work is reused: a finished child call
        returns its recorded outputs without running the child, an unfinished one runs only the child actions
        that did not complete. An exception in the child is raised here, with its type (also after a
        failover). ``timeout`` (seconds) bounds the child's run; beyond it, ``SubAgentTimeoutError``.
        """
        return self.call_agents([(agent, input)], timeout=timeout)[0]

    def call_agents(self, calls: Iterable[tuple[Agent | str, Any]], *, timeout: float | None = None
                    ) -> list[list[Any]]:
        """Run several sub-agent calls ``[(agent, input), ...]`` concurrently; their outputs, in call order.

        The children run on the operator's child-call pool (``max_concurrent_child_calls``), never on the
        pool that runs inputs, and the calling action runs any child no pool thread has taken yet, so a
        full pool slows a fan-out down but cannot deadlock it. If children raise, the first failing call's
        exception (in call order) is raised once all of them have finished.
        """
        if self._call_agents is None:
            raise RuntimeError("sub-agent calls need the runtime that runs actions")
        return self._call_agents(list(calls), timeout)


def _collect_actions(agent_type: type) -> tuple[ActionSpec, ...]:
    found: dict[str, Callable] = {}
    for klass in reversed(agent_type.__mro__):
        for attribute, value in vars(klass).items():
            function = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
            if callable(function) and hasattr(function, _ACTION_ATTRIBUTE):
                if attribute.startswith("_"):
                    # The journal names its own records (accepted inputs, attempt starts) with a leading
                    # underscore: an action of that name would be taken for one and never reused.
                    raise AgentDefinitionError(f"action {agent_type.__qualname__}.{attribute}: action names may not "
                                               "start with '_' (reserved for the journal's own records)")
                found.pop(attribute, None)  # an override keeps its own place at the end
                found[attribute] = function
    wiring = {name: f"{name}:{','.join(t.__qualname__ for t in getattr(fn, _ACTION_ATTRIBUTE))}"
              for name, fn in found.items()}
    whole_agent = "|".join(wiring.values())  # how 0.5.1 and earlier fingerprinted every action
    return tuple(ActionSpec(name, fn, getattr(fn, _ACTION_ATTRIBUTE), _fingerprint(fn, wiring[name]),
                            _fingerprint(fn, whole_agent)) for name, fn in found.items())


def _fingerprint(function: Callable, wiring: str) -> str:
    """The action's fingerprint: a hash of its wiring (name and triggering event types) and of its code.

    What counts as the action's code (see the module docstring): the function's bytecode, names, variable
    names, argument counts, exception table and constants, its nested code objects, its default values and
    the contents of its closure cells, canonically encoded by :class:`_CodeEncoder`. The result depends on
    nothing that varies between processes running the same code (hash seed, memory addresses, set order).
    """
    digest = hashlib.sha256(wiring.encode())
    digest.update(_CodeEncoder().encode(inspect.unwrap(function)))
    return digest.hexdigest()[:16]


#: How deep the fingerprint follows values inside values and functions inside closures and defaults. A
#: bound keeps the cost of a fingerprint small; anything deeper contributes only a marker.
_FINGERPRINT_MAX_DEPTH = 24


def _sized(data: bytes) -> bytes:
    return b"%d:%s" % (len(data), data)


def _qualified_name(value: Any) -> bytes:
    # A package object by its 0.5.1 module (core/moved.py): moving the code changes no action's fingerprint.
    module = module_in_0_5_1(getattr(value, "__module__", None))
    return f"{module}.{getattr(value, '__qualname__', None)}".encode()


#: Encodings of plain scalar values, by exact type (subclasses count as "any other object").
_SCALAR_ENCODINGS: dict[type, Callable[[Any], bytes]] = {
    bool: lambda value: b"T" if value else b"F",
    int: lambda value: b"i" + _sized(format(value, "x").encode()),  # hex: no limit on int-to-str digits
    float: lambda value: b"f" + _sized(value.hex().encode()),
    complex: lambda value: b"j" + _sized(value.real.hex().encode()) + _sized(value.imag.hex().encode()),
    str: lambda value: b"s" + _sized(value.encode("utf-8", "surrogatepass")),
    bytes: lambda value: b"b" + _sized(value),
}


class _CodeEncoder:
    """A canonical, unambiguous byte encoding of code and of the values an action's code reaches.

    Every value gets a type tag and length-prefixed parts; sets, frozensets and dicts are sorted by the
    encodings of their elements (keys), so their iteration order, which depends on the hash seed, does not
    count. ``repr`` is never used: many reprs hold memory addresses.
    """

    def __init__(self) -> None:
        # ids of the containers and functions being encoded (the current path only), to stop at cycles. An
        # id is only compared here, never encoded.
        self._active: set[int] = set()
        self._depth = 0

    def encode(self, value: Any) -> bytes:
        """The encoding of ``value``."""
        kind = type(value)
        if value is None:
            return b"N"
        if value is Ellipsis:
            return b"."
        scalar = _SCALAR_ENCODINGS.get(kind)
        if scalar is not None:
            return scalar(value)
        if isinstance(value, type):
            return b"c" + _sized(_qualified_name(value))
        if isinstance(value, types.BuiltinFunctionType):
            return b"B" + _sized(_qualified_name(value))
        if kind not in (tuple, list, set, frozenset, dict, types.CodeType, types.FunctionType, types.MethodType):
            # Any other object: its type, never its state or repr (which may hold an address).
            return b"o" + _sized(_qualified_name(kind))
        if id(value) in self._active:
            return b"^"  # a cycle back to a value being encoded
        if self._depth >= _FINGERPRINT_MAX_DEPTH:
            return b"~"
        self._active.add(id(value))
        self._depth += 1
        try:
            return self._encode_composite(value)
        finally:
            self._depth -= 1
            self._active.discard(id(value))

    def _encode_composite(self, value: Any) -> bytes:
        kind = type(value)
        if kind is types.CodeType:
            return self._code(value)
        if kind is types.FunctionType:
            return self._function(value)
        if kind is types.MethodType:
            return b"M" + self.encode(value.__func__) + _sized(_qualified_name(type(value.__self__)))
        if kind is dict:
            items = sorted(self.encode(k) + self.encode(v) for k, v in value.items())
        else:
            items = [self.encode(item) for item in value]
            if kind in (set, frozenset):
                items.sort()
        tag = {tuple: b"(", list: b"[", set: b"{", frozenset: b"<", dict: b"d"}[kind]
        return tag + b"%d:" % len(items) + b"".join(items)

    def _code(self, code: types.CodeType) -> bytes:
        # Not co_filename, co_firstlineno, co_linetable, co_name/co_qualname: moving or renaming the code
        # (the action's name is part of the wiring) must not change it. Bytecode holds no line numbers.
        parts = [code.co_code, getattr(code, "co_exceptiontable", b""),
                 b"%d,%d,%d" % (code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount)]
        names = (code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars, code.co_consts)
        return b"C" + b"".join(_sized(part) for part in parts) + b"".join(self.encode(n) for n in names)

    def _function(self, function: types.FunctionType) -> bytes:
        cells = []
        for cell in function.__closure__ or ():
            try:
                cells.append(self.encode(cell.cell_contents))
            except ValueError:  # a cell not yet assigned
                cells.append(b"E")
        return (b"F" + self.encode(function.__code__) + self.encode(function.__defaults__)
                + self.encode(function.__kwdefaults__) + b"%d:" % len(cells) + b"".join(cells))
