"""Readers of formats written by earlier versions of this package.

**Version 1 (flink-agents-replay 0.1.0).** Journal and capture payloads (envelope version 1) and keyed
state were cloudpickles of the package's own classes: ``CallRecord``, ``CompletionRecord`` (holding
``MemoryUpdate`` s, the ``DELETED`` marker and the sent events), ``AcceptedRecord``,
``ActionFailedRecord``, ``CapturedInput``/``CapturedRun`` (with ``CapturedOutput`` and ``BlockedCall``),
the outcome enum, events (a user's event class pickled by value names ``Event`` as its base), the
package's exceptions (``CallBlocked``, ``ChatModelError``...), and in keyed state the operator's
``_Waiting`` entries and ``(seq, value, event_time)`` tuples. Those pickles name the module each class
lived in then. :func:`load_v1` unpickles them with every such name translated through :data:`V1_NAMES`
to where the class lives now, so they keep loading whatever the modules are called in later versions.
When a class moves, update its target here (the keys never change).

Version 1 data is only ever read; everything is written in the current plain formats.
"""

from __future__ import annotations

import importlib
import io
import pickle
from typing import Any

__all__ = ["V1_NAMES", "load_v1"]

# Where 0.1.0 pickled its classes (keys, forever as written), and where they live now (targets, moved with the code).
_RECORDS = "flink_agents_replay.journal.records"  # 0.1.0's module of the journal records
_CAPTURE = "flink_agents_replay.capture.records"
_ERRORS = "flink_agents_replay.errors"
_RECORDS_NOW = "flink_agents_replay.storage.records.journal"
_CAPTURE_NOW = "flink_agents_replay.storage.capture.records"
_ERRORS_NOW = "flink_agents_replay.core.errors"
_EVENTS_NOW = "flink_agents_replay.core.events"

#: (module, name) as version 1 pickled it -> (module, name) of the class now.
V1_NAMES: dict[tuple[str, str], tuple[str, str]] = {
    **{(_RECORDS, name): (_RECORDS_NOW, name) for name in (
        "AcceptedRecord", "ActionFailedRecord", "CallOutcome", "CallRecord", "CompletionRecord", "RecordKind",
        "RunPosition")},
    **{(_CAPTURE, name): (_CAPTURE_NOW, name) for name in ("BlockedCall", "CapturedInput", "CapturedOutput",
                                                           "CapturedRun")},
    ("flink_agents_replay.memory", "MemoryUpdate"): (_RECORDS_NOW, "MemoryUpdate"),
    ("flink_agents_replay.memory", "_Deleted"): (_RECORDS_NOW, "_Deleted"),
    ("flink_agents_replay.agent", "Event"): (_EVENTS_NOW, "Event"),
    ("flink_agents_replay.agent", "InputEvent"): (_EVENTS_NOW, "InputEvent"),
    ("flink_agents_replay.agent", "OutputEvent"): (_EVENTS_NOW, "OutputEvent"),
    ("flink_agents_replay.resources", "ChatModelError"): (_ERRORS_NOW, "ChatModelError"),
    ("flink_agents_replay.journal.writer", "JournalClosedError"): (_ERRORS_NOW, "JournalClosedError"),
    ("flink_agents_replay.operator", "_Waiting"): ("flink_agents_replay.storage.formats.state", "WaitingInput"),
    **{(_ERRORS, name): (_ERRORS_NOW, name) for name in (
        "AgentDefinitionError", "CallBlocked", "CallInDoubtError", "CallTimeoutError", "ConfigError",
        "FingerprintMismatchError", "JournalError", "JournalGapError", "JournalRecordTooLargeError",
        "NoSubAgentOutputError", "NotPicklableError", "ReplayConfigError", "ReplayError", "ReplayIsolationError",
        "SignatureError", "SubAgentCycleError", "SubAgentTimeoutError", "TopicMismatchError",
        "UnknownResourceError", "UnknownSubAgentError")},
}


class _V1Unpickler(pickle.Unpickler):
    """An unpickler that finds this package's version-1 classes where they live now."""

    def find_class(self, module: str, name: str) -> Any:
        target = V1_NAMES.get((module, name))
        if target is not None:
            return getattr(importlib.import_module(target[0]), target[1])
        try:  # anything else, the user's classes among them (also those of the testing API's agents)
            return super().find_class(module, name)
        except (ImportError, AttributeError) as exc:
            raise pickle.UnpicklingError(f"version 1 data names {module}.{name}, which cannot be imported here "
                                         f"({exc}): keep the module of your events and values importable") from exc


def load_v1(data: bytes) -> Any:
    """Unpickle a version-1 payload or state entry (cloudpickle's format is pickle's)."""
    return _V1Unpickler(io.BytesIO(data)).load()
