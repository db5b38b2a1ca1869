"""The diff of two captures read from Kafka: production's, and a replay's (:mod:`.diff` compares)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from flink_agents_replay.core.errors import SignatureError
from flink_agents_replay.replay.diff import DiffReport, compare
from flink_agents_replay.replay.usage import PriceTable
from flink_agents_replay.storage.capture.reader import CaptureDecoder, read_capture
from flink_agents_replay.storage.capture.records import CapturedInput, CapturedParked, CapturedRun

__all__ = ["diff_captures"]


def diff_captures(kafka: Mapping[str, Any], production_capture: str, replay_capture: str, *, signing_key: bytes,
                  uid: str, verification_keys: tuple[bytes, ...] = (), timeout_s: float = 30.0,
                  prices: PriceTable | None = None,
                  skip_invalid: Callable[[SignatureError], None] | None = None) -> DiffReport:
    """Compare every run the replay captured with production's run of the same (key, seq): outputs, waits and
    decisions (finished and parked runs: a run whose last record is a parked one was still waiting).

    Reads the replay's capture whole and production's from its earliest kept record (its retention bounds
    it); both are verified with ``signing_key`` (or one of ``verification_keys``) as records of operator ``uid``,
    each for its own topic. ``prices`` prices the runs' model calls (see :func:`~.diff.compare`). A record that
    does not verify raises :class:`SignatureError`, or, with ``skip_invalid``, is handed to it and skipped (the
    replay job sent such an input to its dead letters: its run is not compared).
    """
    decoder = CaptureDecoder(signing_key, uid, verification_keys=verification_keys)
    replayed = list(read_capture(kafka, replay_capture, None, decoder, timeout_s=timeout_s,
                                 skip_invalid=skip_invalid))
    production = (record for record in read_capture(kafka, production_capture, None, decoder, timeout_s=timeout_s,
                                                    skip_invalid=skip_invalid)
                  if isinstance(record, (CapturedRun, CapturedParked)))
    return compare(production, [r for r in replayed if isinstance(r, (CapturedRun, CapturedParked))],
                   [r for r in replayed if isinstance(r, CapturedInput)], prices=prices)
