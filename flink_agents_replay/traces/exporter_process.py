"""The exporter process: makes a subtask's spans and exports them, on an interpreter of its own.

``python -m flink_agents_replay.traces.exporter_process`` is started by the subtask's
:class:`~flink_agents_replay.traces.process_sink.ProcessSpanSink`, and reads frames from its standard input:

* ``I``: the settings (:class:`~.export.TracingConfig` as JSON), the agent's name and what each resource is;
* ``R``: a run's facts (:func:`~.handoff.encode_run`) and how many spans they make, about;
* ``F``: a flush request with its number: the process answers on its standard output, once what came before is
  exported or dropped (or at once while the collector is down), with ``F <number> <exported> <dropped> <down>``.

At the end of its input (the subtask closed, or its process died) it exports what it holds, within the flush
timeout, and exits. Making and exporting happen in a :class:`~.export.SpanSink` (batched, bounded, counted).
"""

from __future__ import annotations

import os
import struct
import sys
from typing import BinaryIO

import msgpack

from flink_agents_replay.traces.export import SpanSink, TracingConfig
from flink_agents_replay.traces.handoff import decode_run
from flink_agents_replay.traces.spans import spans_of_run

__all__ = ["FRAME_HEADER", "NICENESS", "frame", "main", "serve"]

#: A frame: its payload's length (4 bytes, big-endian), its kind (1 byte), then the payload.
FRAME_HEADER = struct.Struct(">IB")


def frame(kind: bytes, payload: bytes) -> bytes:
    """One frame of the process's input."""
    return FRAME_HEADER.pack(len(payload), kind[0]) + payload


def _frames(source: BinaryIO):
    while True:
        header = source.read(FRAME_HEADER.size)
        if len(header) < FRAME_HEADER.size:
            return
        size, kind = FRAME_HEADER.unpack(header)
        payload = source.read(size)
        if len(payload) < size:
            return
        yield bytes([kind]), payload


def serve(source: BinaryIO, answers, *, exporter=None) -> None:
    """Read frames from ``source`` until it ends, answering flushes on ``answers`` (a text stream)."""
    frames = _frames(source)
    first = next(frames, None)
    if first is None or first[0] != b"I":
        return
    init = msgpack.unpackb(first[1])
    try:
        sink = SpanSink(TracingConfig.model_validate_json(init["settings"]), agent=init["agent"], exporter=exporter)
    except Exception as exc:  # noqa: BLE001 - told to the subtask (which logs it), then this process ends
        answers.write(f"X {type(exc).__name__}: {' '.join(str(exc).split())[:500]}\n")
        answers.flush()
        raise
    kinds = init["kinds"]
    try:
        for kind, payload in frames:
            if kind == b"R":
                estimate, packed = msgpack.unpackb(payload)
                sink.submit(lambda packed=packed: spans_of_run(decode_run(packed), kinds), estimate)
            elif kind == b"F":
                number, timeout_s = msgpack.unpackb(payload)
                sink.flush(timeout_s)
                answers.write(f"F {number} {sink.exported} {sink.dropped} {int(sink.collector_down)}\n")
                answers.flush()
    finally:
        sink.close()
        answers.write(f"E 0 {sink.exported} {sink.dropped} {int(sink.collector_down)}\n")
        answers.flush()


#: How much the process yields the CPU to the TaskManager's (``os.nice``): spans wait, runs do not. A process that
#: falls behind for long fills its queue and drops spans, counted (``spans_dropped``).
NICENESS = 10


def main() -> int:
    try:
        os.nice(NICENESS)
    except OSError:  # not allowed here: it runs at the TaskManager's priority
        pass
    serve(sys.stdin.buffer, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
