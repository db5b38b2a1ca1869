"""Capture as an observer of the agent operator: accepted inputs, applied runs and manifest entries.

The operator calls its observers at fixed points (see :mod:`flink_agents_replay.flink.observer`, whose
interface this class implements structurally, without importing the Flink layer). :class:`CaptureObserver`
turns them into capture records through a :class:`~.writer.CaptureWriter`:

* input accepted -> a :class:`~.records.CapturedInput` (key, seq, event time, the input and its digest, the W3C
  ``traceparent`` it arrived with);
* run applied -> a :class:`~.records.CapturedRun` (outputs, every call with its result, blocked calls, error, the
  run's trace id: derived from the job lineage the operator holds, :attr:`CaptureObserver.lineage`, so a replay's
  capture names the replay's traces);
* run parked at a wait -> a :class:`~.records.CapturedParked` (the wait, the waiting action and event, the calls
  so far, blocked calls), each time it parks;
* checkpoint -> flush, then the manifest entry of the checkpoint (a replay's capture has no manifest);
* close -> release the clients.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from flink_agents_replay.engine.digest import digest_value
from flink_agents_replay.storage.capture.records import CapturedInput, CapturedOutput, CapturedParked, CapturedRun
from flink_agents_replay.storage.capture.writer import CaptureWriter
from flink_agents_replay.storage.records.journal import key_digest
from flink_agents_replay.traces.ids import trace_id

if TYPE_CHECKING:
    from flink_agents_replay.engine import RunResult

__all__ = ["CaptureObserver"]


class CaptureObserver:
    """Writes what the operator accepted and ran to the capture, through ``writer``; ``agent`` names the runs' traces
    (with :attr:`lineage`, which the operator sets: its job's at the start, the restored one after a restore)."""

    def __init__(self, *, writer: CaptureWriter, agent: str):
        self.writer = writer
        self.agent = agent
        self.lineage = ""

    def input_accepted(self, *, key: Any, group: int, seq: int, value: Any, event_time: int | None,
                       traceparent: str | None = None) -> None:
        self.writer.write_input(group, CapturedInput(key, seq, event_time, value, digest_value(value),
                                                     traceparent=traceparent))

    def run_applied(self, *, key: Any, group: int, result: RunResult) -> None:
        trace = f"{trace_id(self.lineage, self.agent, key_digest(key), result.seq):032x}"
        self.writer.write_run(group, CapturedRun(
            key, result.seq, result.input_digest, [CapturedOutput(o.id, o.output) for o in result.outputs],
            result.calls, result.blocked, result.error, trace_id=trace))

    def run_parked(self, *, key: Any, group: int, result: RunResult) -> None:
        waiting = result.waiting
        self.writer.write_parked(group, CapturedParked(
            key, result.seq, result.input_digest, waiting.action, waiting.event_id, waiting.wait, list(result.calls),
            list(result.blocked)))

    def checkpoint(self, *, checkpoint_id: int, checkpoint_time_ms: int, subtask: int,
                   partitions: Iterable[int]) -> None:
        self.writer.checkpoint(checkpoint_id, subtask, partitions, checkpoint_time_ms=checkpoint_time_ms)

    def close(self) -> None:
        self.writer.close()
