"""Keyed state entries as versioned plain data.

The operator keeps per key: the short-term memory, the run in flight (its seq, input and event time) and
the inputs waiting for the key's turn, each input with the W3C ``traceparent`` it arrived with, if any. Each entry
is ``b"FARS" | version (1 byte) | msgpack``, with the user's values (memory values, inputs) as pickled bytes inside
(see :mod:`.plain`). Entries without the prefix were written by version 1 (0.1.0) and are read by :mod:`.legacy`.

Flink keeps these bytes in ``PICKLED_BYTE_ARRAY`` state: Flink's own serializer wraps plain ``bytes``, so the
state's type information is the same in every version.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from flink_agents_replay.storage.formats.legacy import load_v1
from flink_agents_replay.storage.formats.plain import dump_user, load_user, pack, unpack

__all__ = ["STATE_VERSION", "InFlightInput", "WaitingInput", "decode_entry", "decode_in_flight", "decode_memory",
           "decode_waiting", "encode_entry", "encode_in_flight", "encode_memory", "encode_waiting"]

#: Version 3 (0.7) added the entries of waiting runs and of decisions (``storage/records/parked.py``); the
#: entries of version 2 read unchanged. Version 4 (0.7) keeps an input's W3C ``traceparent`` (the header of its Kafka
#: record, if it had one) with it wherever it waits or is in flight: entries of versions 2 and 3 read without one.
STATE_VERSION = 4
_READABLE = (2, 3, 4)
_PREFIX = struct.Struct(">4sB")
_MAGIC = b"FARS"


@dataclass(frozen=True)
class WaitingInput:
    """An input waiting in keyed state for its key's turn, with its event time (and, in a replay, the seq
    production gave it), and the W3C ``traceparent`` it arrived with, if any (its run's trace links to it)."""

    value: Any
    event_time: int | None
    captured_seq: int | None = None
    traceparent: str | None = None


@dataclass(frozen=True)
class InFlightInput:
    """The input whose run is under way for a key: its seq, the input, its event time, and its run's epoch
    (the checkpoint its effects belong to: the last checkpoint before the run started, + 1; ``None`` in
    entries written before 0.4, whose runs were in flight at the checkpoint restored)."""

    seq: int
    value: Any
    event_time: int | None
    epoch: int | None = None
    traceparent: str | None = None  # the W3C traceparent the input arrived with (state version 4 on)


def encode_entry(plain: dict[str, Any]) -> bytes:
    """State bytes of a plain entry, with this version's prefix."""
    return _PREFIX.pack(_MAGIC, STATE_VERSION) + pack(plain)


def decode_entry(raw: bytes, what: str) -> dict[str, Any]:
    """The plain entry :func:`encode_entry` wrote (of a kind version 1 never wrote)."""
    plain = _decode(raw, what)
    if plain is None:
        raise ValueError(f"{what} in keyed state has no format prefix")
    return plain


_encode = encode_entry


def _decode(raw: bytes, what: str) -> dict[str, Any] | None:
    """The plain entry, or ``None`` for a version-1 entry (no prefix)."""
    if raw[:4] != _MAGIC:
        return None
    _, version = _PREFIX.unpack_from(raw)
    if version not in _READABLE:
        raise ValueError(f"{what} in keyed state has format version {version}; this version reads up to "
                         f"{STATE_VERSION}")
    return unpack(raw[_PREFIX.size:], what=what)


def encode_waiting(waiting: WaitingInput) -> bytes:
    """State bytes of a waiting input."""
    return _encode({"value": dump_user(waiting.value, what="an input"), "event_time": waiting.event_time,
                    "captured_seq": waiting.captured_seq, **_traceparent(waiting.traceparent)})


def decode_waiting(raw: bytes) -> WaitingInput:
    """The waiting input :func:`encode_waiting` wrote (or version 1 wrote)."""
    plain = _decode(raw, "a waiting input")
    if plain is None:
        entry = load_v1(raw)
        return entry if isinstance(entry, WaitingInput) else WaitingInput(entry, None)  # 0.1.0 before event times
    return WaitingInput(load_user(plain["value"]), plain["event_time"], plain["captured_seq"],
                        plain.get("traceparent"))


def encode_in_flight(in_flight: InFlightInput) -> bytes:
    """State bytes of the run in flight."""
    return _encode({"seq": in_flight.seq, "value": dump_user(in_flight.value, what="an input"),
                    "event_time": in_flight.event_time, "epoch": in_flight.epoch,
                    **_traceparent(in_flight.traceparent)})


def decode_in_flight(raw: bytes) -> InFlightInput:
    """The run in flight :func:`encode_in_flight` wrote (or version 1 wrote as a tuple)."""
    plain = _decode(raw, "the run in flight")
    if plain is None:
        seq, value, *event_time = load_v1(raw)  # (seq, value) before event times
        return InFlightInput(seq, value, event_time[0] if event_time else None)
    # "epoch": optional (added in 0.4 within version 2; older readers ignore it); "traceparent": version 4 on.
    return InFlightInput(plain["seq"], load_user(plain["value"]), plain["event_time"], plain.get("epoch"),
                         plain.get("traceparent"))


def _traceparent(traceparent: str | None) -> dict[str, str]:
    """The entry's ``traceparent`` field: only where the input had one (most have none: no bytes spent)."""
    return {"traceparent": traceparent} if traceparent is not None else {}


def encode_memory(memory: dict, *, what: str = "memory") -> bytes:
    """State bytes of a key's memory (one user value: the whole dictionary)."""
    return _encode({"memory": dump_user(memory, what=what)})


def decode_memory(raw: bytes) -> dict:
    """The memory :func:`encode_memory` wrote (or version 1 wrote as a pickled dictionary)."""
    plain = _decode(raw, "memory")
    return load_v1(raw) if plain is None else load_user(plain["memory"])
