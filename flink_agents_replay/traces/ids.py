"""Trace and span ids derived from what a run is, so that every attempt of a run names the same spans.

A run's trace id hashes its identity: the job lineage (the same across restores from checkpoints and savepoints,
another for an unrelated job on the same topic, another for a replay), the agent, the key's digest and the seq.
Every attempt of the run, in whatever process, exports into that one trace.

Spans that stand for one logical thing get ids derived from it, so a span exported again (an attempt that re-derives
it after a failure, or an export retried) is the same span, which a receiver that keeps one span per id (Phoenix
does) stores once: the run, each action, and each *execution* of a call (its call id and when it began, from its
journaled record: a call in doubt made again under the same call id is another execution). Spans of what one
execution of a run did and no other can repeat (a call it reused) get random ids.
"""

from __future__ import annotations

import hashlib
import re
import secrets

__all__ = ["action_span_id", "executed_call_span_id", "parse_traceparent", "random_span_id", "run_span_id", "trace_id",
           "well_formed_traceparent"]

#: A W3C traceparent as the spec writes it (version, trace id, parent id, flags; lower-case hex): 55 characters.
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def _hash(*parts: object, size: int) -> int:
    digest = hashlib.sha256("\x1f".join(str(part) for part in parts).encode("utf-8", "surrogatepass")).digest()
    value = int.from_bytes(digest[:size], "big")
    return value or 1  # zero is the invalid id


def trace_id(lineage: str, agent: str, key_digest: str, seq: int) -> int:
    """The 128-bit trace id of a run."""
    return _hash("trace", lineage, agent, key_digest, seq, size=16)


def run_span_id(trace: int) -> int:
    """The run's own span, the root of its trace."""
    return _hash("run", trace, size=8)


def action_span_id(trace: int, event_id: str, action: str) -> int:
    """The span of one action of the run (the event it handles and its journal name identify it)."""
    return _hash("action", trace, event_id, action, size=8)


def executed_call_span_id(trace: int, call_id: str, began_ms: object, outcome: str) -> int:
    """The span of one execution of a call, from its journaled record (call id, when it began, its outcome)."""
    return _hash("call", trace, call_id, began_ms, outcome, size=8)


def random_span_id() -> int:
    """A span of what only this execution did."""
    return secrets.randbits(64) or 1


def well_formed_traceparent(header: str | None) -> str | None:
    """The header if it is a traceparent, else none: what an upstream sends goes into keyed state and the capture,
    so anything else (of any size) is not kept."""
    return header if isinstance(header, str) and _TRACEPARENT.fullmatch(header) else None


def parse_traceparent(header: str | None) -> tuple[int, int] | None:
    """(trace id, span id) of a W3C ``traceparent`` header; ``None`` for none, a malformed one, version ``ff`` or an
    all-zero id (an upstream's bad header must not fail a run)."""
    if well_formed_traceparent(header) is None or header.startswith("ff-"):
        return None
    trace, span = int(header[3:35], 16), int(header[36:52], 16)
    return (trace, span) if trace and span else None
