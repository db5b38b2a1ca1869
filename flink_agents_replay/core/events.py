"""Events: what actions react to and send, and the stable names events are persisted under.

The journal keeps the events an action sent (a reused action sends them again) as plain data: the event's
*name*, its id and its fields — never its class's module path (see :mod:`flink_agents_replay.storage.formats`).
An event class's name is its ``__event_name__`` if it declares one, else its qualified name (``Classified``,
``Triage.Classified``): moving the class to another module keeps its records readable; renaming the class
needs ``__event_name__ = "<old name>"``. When a record is read back, the name is looked up first among the
agent's own event types (those its actions and its sub-agents' actions take, and their subclasses), then
among every event class the process has defined, where the module the class was in when the record was
written tells apart classes of the same name; two classes of that name and neither in that module are an
error that asks for ``__event_name__``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from flink_agents_replay.core.errors import AgentDefinitionError

__all__ = ["TRACED_INPUT_TAG", "Event", "EventTypes", "InputEvent", "OutputEvent", "event_name", "traceparent_of",
           "traced_input", "untraced", "with_event_id"]

_EVENT_ID_ATTRIBUTE = "_event_id"


class Event:
    """Base class of events. Subclass it, as a plain class or a dataclass.

    ``Event(**fields)`` stores the fields as attributes. The runtime gives every sent event an ``id``
    derived from its place in the run (never random), so a replayed run reproduces every id.
    """

    def __init__(self, **fields: Any):
        self.__dict__.update(fields)

    @property
    def id(self) -> str | None:
        """The runtime-assigned id (``None`` before the event is sent)."""
        return self.__dict__.get(_EVENT_ID_ATTRIBUTE)

    def _fields(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != _EVENT_ID_ATTRIBUTE}

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self._fields() == other._fields()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(type(self))

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self._fields().items())
        return f"{type(self).__name__}({fields})"


class InputEvent(Event):
    """Wraps one input record; ``input`` is the record as it arrived."""

    def __init__(self, input: Any):  # noqa: A002 - the public field name
        super().__init__(input=input)


class OutputEvent(Event):
    """Sent by an action to emit ``output`` from the operator."""

    def __init__(self, output: Any):
        super().__init__(output=output)


#: The first item of a traced input (:func:`traced_input`), with its form's version.
TRACED_INPUT_TAG = "flink-agents-replay/traced-input/1"


def traced_input(value: Any, traceparent: str) -> tuple[str, str, Any]:
    """An input on its way to the agent's operator with the W3C ``traceparent`` its Kafka record carried.

    The packaged Kafka input (``records_from_kafka``) sends a record on in this form only when the record had a
    ``traceparent`` header; key selectors (``key_by`` on its stream) and every function of the user see the record
    itself (:func:`untraced`), and the agent's operator takes the traceparent into the run's state and its trace's
    link. Plain data, a tagged tuple, not a class of the package: what travels between operators is pickled.
    """
    return (TRACED_INPUT_TAG, traceparent, value)


def _is_traced(value: Any) -> bool:
    return type(value) is tuple and len(value) == 3 and type(value[0]) is str and value[0] == TRACED_INPUT_TAG


def untraced(value: Any) -> Any:
    """The record itself, whether or not it came as a :func:`traced_input`."""
    return value[2] if _is_traced(value) else value


def traceparent_of(value: Any) -> str | None:
    """The traceparent ``value`` came with, if it is a :func:`traced_input`."""
    return value[1] if _is_traced(value) else None


def with_event_id(event: Event, event_id: str) -> Event:
    """A shallow copy of ``event`` carrying ``event_id`` (frozen dataclasses included)."""
    stamped = copy.copy(event)
    object.__setattr__(stamped, _EVENT_ID_ATTRIBUTE, event_id)
    return stamped


def event_name(event_type: type[Event]) -> str:
    """The name events of ``event_type`` are persisted under (``__event_name__``, else the qualified name)."""
    declared = event_type.__dict__.get("__event_name__")
    return declared if isinstance(declared, str) and declared else event_type.__qualname__


def _with_subclasses(types: Iterable[type]) -> list[type]:
    found: dict[type, None] = {}
    pending = list(types)
    while pending:
        kind = pending.pop()
        if kind not in found:
            found[kind] = None
            pending.extend(kind.__subclasses__())
    return list(found)


class EventTypes:
    """Resolves persisted event names to classes: the agent's own types first, then every event class.

    Args:
        preferred: the agent's event types (their subclasses count too); names among them win.
    """

    def __init__(self, preferred: Iterable[type[Event]] = ()):
        self._preferred = tuple(preferred)
        self._own: dict[str, list[type[Event]]] = {}
        self._all: dict[str, list[type[Event]]] = {}

    def resolve(self, name: str, module: str | None = None) -> type[Event]:
        """The class of events persisted as ``name`` (by a class of ``module``, a hint for same-named classes)."""
        candidates = self._candidates(name)
        if len(candidates) > 1:
            candidates = [kind for kind in candidates if kind.__module__ == module] or candidates
        if len(candidates) == 1:
            return candidates[0]
        if not candidates:
            raise AgentDefinitionError(f"the journal holds an event of type {name!r}, and no event class of that "
                                       "name is defined here: import it, or give the renamed class "
                                       f"__event_name__ = {name!r}")
        modules = sorted(f"{kind.__module__}.{kind.__qualname__}" for kind in candidates)
        raise AgentDefinitionError(f"the journal holds an event of type {name!r}, and several event classes have "
                                   f"that name ({', '.join(modules)}): give each a distinct __event_name__")


    def shared_names(self) -> dict[str, list[str]]:
        """Names that several of the preferred types (or their subclasses) are persisted under, with those classes.

        Their records are told apart by the module they were written from only while the classes keep their
        modules: after a module is renamed, reading them back fails. Worth a warning when an agent is defined.
        """
        own = _index(_with_subclasses(self._preferred))
        return {name: sorted(f"{kind.__module__}.{kind.__qualname__}" for kind in kinds)
                for name, kinds in own.items() if len(kinds) > 1}

    def _candidates(self, name: str) -> list[type[Event]]:
        """The classes persisted as ``name``: the agent's own if any, else every event class's. The indexes are
        built once and again only when a name is in neither (a class defined since): resolving is on the
        restore path, once per journaled event."""
        for rebuilt in (False, True):
            if rebuilt or not self._all:
                self._own = _index(_with_subclasses([*self._preferred, InputEvent, OutputEvent]))
                self._all = _index(_with_subclasses([Event]))
            found = self._own.get(name) or self._all.get(name)
            if found:
                return found
        return []


def _index(kinds: Iterable[type[Event]]) -> dict[str, list[type[Event]]]:
    by_name: dict[str, list[type[Event]]] = {}
    for kind in kinds:
        by_name.setdefault(event_name(kind), []).append(kind)
    return by_name
