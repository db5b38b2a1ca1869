"""What a schema is: how one kind of record becomes plain data and back.

The codec (:mod:`flink_agents_replay.storage.records.codec`) looks a record's kind up in a mapping of schemas: the
journal's (:mod:`flink_agents_replay.storage.records.schemas`) or the capture's
(:mod:`flink_agents_replay.storage.capture.schemas`). Every plain payload carries its schema's version under
``"v"``; a reader refuses versions newer than its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flink_agents_replay.core.events import EventTypes

__all__ = ["RecordSchema"]


@dataclass(frozen=True)
class RecordSchema:
    """One record kind: its header name, current version, and its converters.

    ``from_plain`` receives the plain payload (with ``"v"``) and the event types to resolve events by name;
    ``legacy_type`` is the class a version-1 (pickled) payload of this kind must be an instance of.
    """

    kind: str
    version: int
    to_plain: Callable[[Any], dict[str, Any]]
    from_plain: Callable[[dict[str, Any], EventTypes], Any]
    legacy_type: type | None = None
