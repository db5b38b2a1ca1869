"""Events as plain data: ``{"type": <event name>, "module": <the user's module>, "id": <event id>, "fields": <the
user's fields, pickled>}``.

The name is :func:`flink_agents_replay.core.events.event_name` of the class, resolved back through an
:class:`~flink_agents_replay.core.events.EventTypes`; the module is only a hint that tells apart user classes
of the same name (``None`` for classes of this package, ``InputEvent`` and ``OutputEvent`` among them); the fields are
user values (attributes and slot values alike). An event is rebuilt without calling its constructor (as
pickle does), so dataclasses, frozen or slotted ones included, and classes whose ``__init__`` takes other
arguments than their fields come back as they were sent. (A class's own ``__getstate__``/``__setstate__``
is not consulted: an event is its fields.)
"""

from __future__ import annotations

import copyreg
from typing import Any

from flink_agents_replay.core.events import _EVENT_ID_ATTRIBUTE, Event, EventTypes, event_name
from flink_agents_replay.storage.formats.plain import dump_user, load_user

__all__ = ["event_from_plain", "event_to_plain"]

_PACKAGE = __name__.split(".")[0]


def event_to_plain(event: Event) -> dict[str, Any]:
    """The plain form of a sent event."""
    fields = _fields_of(event)
    kind = type(event)
    # A hint, never needed for this package's own classes (InputEvent, OutputEvent, the testing API's events):
    # persisted data names no module of this package.
    module = None if kind.__module__.split(".")[0] == _PACKAGE else kind.__module__
    return {"type": event_name(kind), "module": module, "id": event.id,
            "fields": dump_user(fields, what=f"a sent {type(event).__name__}")}


def event_from_plain(plain: dict[str, Any], types: EventTypes) -> Event:
    """The event :func:`event_to_plain` wrote, as an instance of the class its name resolves to."""
    kind = types.resolve(plain["type"], plain.get("module"))
    event = kind.__new__(kind)
    for name, value in load_user(plain["fields"]).items():
        object.__setattr__(event, name, value)  # frozen dataclasses and __slots__ included
    if plain["id"] is not None:
        object.__setattr__(event, _EVENT_ID_ATTRIBUTE, plain["id"])
    return event


def _fields_of(event: Event) -> dict[str, Any]:
    """The event's fields: its attributes and the values of its slots (``@dataclass(slots=True)``)."""
    fields = {name: value for name, value in getattr(event, "__dict__", {}).items() if name != _EVENT_ID_ATTRIBUTE}
    for name in copyreg._slotnames(type(event)):  # the slot names of the class and its bases, as pickle finds them
        if name not in ("__dict__", "__weakref__") and hasattr(event, name):
            fields[name] = getattr(event, name)
    return fields
