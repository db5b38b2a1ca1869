"""Tracing as an observer of the agent operator: the spans of every applied or parked run, out before each
checkpoint completes.

The operator tells its observers of each run it applies and each it parks at a wait (:mod:`.observer`); this one
packs the facts of the run's trace (:class:`~flink_agents_replay.engine.trace.RunTrace`, which the operator asks the
engine to note when tracing is on; :mod:`flink_agents_replay.traces.handoff`) and hands them to the subtask's
exporter process (:class:`~flink_agents_replay.traces.process_sink.ProcessSpanSink`), which makes and exports the
spans on an interpreter of its own. At a checkpoint it waits (at most ``flush_timeout_s``) for them to leave: a run
applied before the checkpoint is not executed again after a failure, so its spans must be out by then; a run
applied after it is executed again, reusing its journaled calls, and its spans are made again from those records
with the same ids. The counters ``spans_exported`` and ``spans_dropped`` follow the sink's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from flink_agents_replay.engine import RunResult
from flink_agents_replay.storage.records.journal import key_digest
from flink_agents_replay.traces.handoff import RunIdentity, encode_run, span_count, text
from flink_agents_replay.traces.process_sink import ProcessSpanSink

__all__ = ["TraceObserver"]

log = logging.getLogger("flink_agents_replay.operator")


class TraceObserver:
    """Hands each applied or parked run's trace to ``sink``."""

    def __init__(self, *, sink: ProcessSpanSink, agent: str, job_id: str, attempt: int, subtask: int, replay: bool,
                 counters: Mapping[str, Any]) -> None:
        self.sink = sink
        self.agent = agent
        self.job_id, self.attempt, self.subtask, self.replay = job_id, attempt, subtask, replay
        self.lineage = job_id  # the operator sets its own (a fresh start's, or the restored one)
        self.content = sink.settings.content()
        self.counters = counters
        self._counted = (0, 0)

    def input_accepted(self, *, key: Any, group: int, seq: int, value: Any, event_time: int | None,
                       traceparent: str | None = None) -> None:
        pass  # a run's spans are made when it is applied or parked (its traceparent travels with the run)

    def run_applied(self, *, key: Any, group: int, result: RunResult) -> None:
        self._submit(key, result, with_run=True)

    def run_parked(self, *, key: Any, group: int, result: RunResult) -> None:
        self._submit(key, result, with_run=False)

    def checkpoint(self, *, checkpoint_id: int, checkpoint_time_ms: int, subtask: int,
                   partitions: Iterable[int]) -> None:
        if not self.sink.flush() and not self.sink.collector_down:
            log.warning("checkpoint %d: the spans of the runs before it were not all exported within %s s; they go "
                        "on being exported (a failure now would lose them)", checkpoint_id,
                        self.sink.settings.flush_timeout_s)
        self._count()

    def close(self) -> None:
        self.sink.close()
        self._count()

    def _submit(self, key: Any, result: RunResult, *, with_run: bool) -> None:
        trace = result.trace
        if trace is None:
            return
        run = RunIdentity(self.agent, text(key), key_digest(key), result.seq, self.lineage, self.job_id,
                          self.attempt, self.subtask, self.replay)
        outputs = [output.output for output in result.outputs] if self.content else None
        # A parked run's own span is made when it ends.
        error = result.error if self.content or result.error is None else result.error.split(":", 1)[0]  # its type
        packed = encode_run(trace, run, content=self.content, outputs=outputs, error=error, with_run=with_run)
        self.sink.submit(packed, span_count(trace, with_run=with_run))

    def _count(self) -> None:
        exported, dropped = self.sink.exported, self.sink.dropped
        before_exported, before_dropped = self._counted
        if exported > before_exported:
            self.counters["spans_exported"].inc(exported - before_exported)
        if dropped > before_dropped:
            self.counters["spans_dropped"].inc(dropped - before_dropped)
            log.warning("%d spans were dropped since the last checkpoint (%d in all): the trace collector did not "
                        "take them%s", dropped - before_dropped, dropped,
                        " (it is down)" if self.sink.collector_down else "")
        self._counted = (exported, dropped)

