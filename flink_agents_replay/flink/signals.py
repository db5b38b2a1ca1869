"""Decisions for waiting runs, as they reach the operator: parsed, keyed next to the inputs.

A decision is sent as a mapping (JSON from a topic, a dict from a test)::

    {"wait_id": "<the wait's id>", "approved": true, "reason": "fine", "by": "ana", "value": {...},
     "signal_id": "<unique per decision sent; duplicates share it>", "sent_at_ms": 1700000000000}

``wait_id`` is required; ``approved`` is ``true``, ``false`` or absent (a decision that only carries a
``value``). :func:`parse_signal` turns one into a :class:`Signal`; one it cannot read becomes a
:class:`MalformedSignal`, which the operator reports as an event instead of failing the job.

Inputs and decisions reach the agent's operator on one keyed stream (:func:`inputs_with_signals`): each
input is wrapped in :class:`KeyedInput` with its key, each decision in a :class:`Signal`, the two streams are
united and keyed again by that key. One operator with one input keeps the checkpoint bridge, the input hold
and the completion wake-ups as they are (a replay's captured runs join its inputs the same way). The wrappers
never reach keyed state: the operator unwraps them at once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flink_agents_replay.storage.records.waits import Decision

__all__ = ["SIGNAL_VERSION", "KeyedInput", "MalformedSignal", "Signal", "inputs_with_signals", "parse_signal"]

#: The version a sent decision may carry as ``"v"``; a later one is refused (reported, not applied).
SIGNAL_VERSION = 1


@dataclass(frozen=True)
class KeyedInput:
    """An input with its key, on the stream it shares with decisions."""

    key: Any
    value: Any


@dataclass(frozen=True)
class Signal:
    """A decision for the wait ``wait_id`` of the run of ``key``."""

    key: Any
    wait_id: str
    decision: Decision
    signal_id: str | None = None


@dataclass(frozen=True)
class MalformedSignal:
    """A decision that could not be read: what came, and why it was refused."""

    key: Any
    raw: str
    reason: str


def parse_signal(key: Any, raw: Any) -> Signal | MalformedSignal:
    """The :class:`Signal` in ``raw`` (a mapping, or its JSON as str or bytes), or why there is none."""
    try:
        record = json.loads(raw) if isinstance(raw, (str, bytes, bytearray)) else raw
        if not isinstance(record, Mapping):
            raise ValueError(f"a decision is a JSON object, not {type(record).__name__}")
        return _signal(key, record)
    except RecursionError:
        return MalformedSignal(key, _shown(raw), "the decision nests too deeply")
    except (ValueError, TypeError) as exc:
        return MalformedSignal(key, _shown(raw), str(exc))


def _signal(key: Any, record: Mapping[str, Any]) -> Signal:
    version = record.get("v", SIGNAL_VERSION)
    if not isinstance(version, int) or version > SIGNAL_VERSION:
        raise ValueError(f"decision format version {version!r}; this version reads up to {SIGNAL_VERSION}")
    wait_id, approved = record.get("wait_id"), record.get("approved")
    if not isinstance(wait_id, str) or not wait_id:
        raise ValueError("a decision needs a wait_id (the id of the wait it decides)")
    if approved is not None and not isinstance(approved, bool):
        raise ValueError(f"approved is true, false or absent, not {approved!r}")
    for name in ("reason", "by", "signal_id"):
        if record.get(name) is not None and not isinstance(record[name], str):
            raise ValueError(f"{name} is a string, not {record[name]!r}")
    for name in ("wait_id", "reason", "by", "signal_id"):
        _check_unicode(name, record.get(name))
    sent_at = record.get("sent_at_ms")
    if sent_at is not None and (isinstance(sent_at, bool) or not isinstance(sent_at, int)):
        raise ValueError(f"sent_at_ms is a number of milliseconds, not {sent_at!r}")
    json.dumps(record.get("value"), allow_nan=False)  # the value goes to the journal as JSON
    decision = Decision(approved=approved, value=record.get("value"), reason=record.get("reason"),
                        by=record.get("by"), decided_at_ms=sent_at)
    return Signal(key, wait_id, decision, record.get("signal_id"))


def _check_unicode(name: str, text: str | None) -> None:
    """Refuse a lone surrogate (valid in JSON's ``\\ud800`` escapes, not in Java's or msgpack's strings: kept in
    state, it would fail the task)."""
    if text is None:
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{name} is not valid Unicode (a lone surrogate): {text.encode('utf-8', 'backslashreplace')!r}"
                         ) from None


def _shown(raw: Any) -> str:
    """At most 2,000 characters of what came, for the report."""
    if isinstance(raw, (bytes, bytearray)):
        text = raw.decode("utf-8", "replace")
    elif isinstance(raw, str):
        text = raw.encode("utf-8", "backslashreplace").decode("utf-8")  # no lone surrogate reaches an event
    else:  # a mapping as the packaged job passes it: shown as JSON where it can be
        try:
            text = json.dumps(raw, default=repr)  # ASCII: lone surrogates escaped
        except (TypeError, ValueError, RecursionError):
            text = f"a {type(raw).__name__} that cannot be shown"
    return text[:2000]


def inputs_with_signals(keyed_stream, signals, key_type_info, *, uid: str):
    """One stream keyed like ``keyed_stream``: its inputs as :class:`KeyedInput`, the decisions of the keyed
    stream ``signals`` as :class:`Signal` (or :class:`MalformedSignal`). ``uid`` prefixes the uids of the two
    tagging steps (stateless, but a savepoint matches operators by uid)."""
    from pyflink.common import Types
    from pyflink.datastream import KeyedProcessFunction

    class _Tag(KeyedProcessFunction):
        def __init__(self, signal: bool):
            self.signal = signal

        def process_element(self, value, ctx):
            key = ctx.get_current_key()
            yield parse_signal(key, value) if self.signal else KeyedInput(key, value)

    tagged_inputs = keyed_stream.process(_Tag(False), output_type=Types.PICKLED_BYTE_ARRAY()).uid(f"{uid}/inputs")
    tagged_signals = signals.process(_Tag(True), output_type=Types.PICKLED_BYTE_ARRAY()).uid(f"{uid}/signals")
    return tagged_inputs.union(tagged_signals).key_by(lambda tagged: tagged.key, key_type=key_type_info)
