"""The habit tests' two runs one level down: the run engine with the in-memory journal, a crash in-process.

:func:`reference_then_crashing_run` takes the same ``make_agent(counter, fault, name)`` as
:func:`tests.harness.reference_runs.reference_then_faulty_run` and asserts the same things in milliseconds.
It stands in for a Flink job that fails before its first checkpoint and is restarted (the habit tests'
``checkpoint_interval_ms=600_000``): an exception leaving an action ends the attempt; everything the attempt
held (memory, outputs not yet committed) is dropped; the next attempt is a new copy of the agent (a
cloudpickle round trip, as Flink's restarted task deserializes its operator; the module's classes by
reference, so an event class stays one class), replays every input from the
start and recovers each key's history from what the journal holds. Only the attempt that finishes emits
outputs, as an exactly-once sink commits only what a checkpoint covers.

What stays at Flink level (one case per habit there): the journal in Kafka, the operator's restore and the
committed sink.
"""

from __future__ import annotations

import copy
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import cloudpickle

from flink_agents_replay import Agent
from flink_agents_replay.core.keygroups import key_group
from flink_agents_replay.engine import RunInput, execute_run
from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore
from flink_agents_replay.storage.journal.recovery import read_recovery_index
from flink_agents_replay.storage.journal.writer import Durability, JournalWriter
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import key_digest
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import AgentOutput, canonical_output, reference_outputs
from tests.harness.reference_runs import SIGNING_KEY, FaultyRun

#: Key groups, as the Flink jobs' default max parallelism.
MAX_PARALLELISM = 128


def reference_then_crashing_run(tmp_path: Path, make_agent: Callable[[InvocationCounter, bool, str], Agent],
                                inputs: list[dict], *, name_prefix: str, restart_attempts: int,
                                durability: Durability = Durability.PER_RUN,
                                keep_job_error: bool = False) -> FaultyRun:
    """``make_agent(..., False, name)`` failure-free, then ``make_agent(..., True, name)`` through crashes and
    restarts (at most ``restart_attempts``); the result as :func:`reference_then_faulty_run`'s.

    The last attempt's exception propagates once the restarts are used up, unless ``keep_job_error``.
    """
    name = f"{name_prefix}-{uuid.uuid4().hex[:6]}"
    reference_counter = InvocationCounter(tmp_path / "ref.sqlite")
    expected = reference_outputs(make_agent(reference_counter, False, name), copy.deepcopy(inputs))
    counter = InvocationCounter(tmp_path / "job.sqlite")
    agent_bytes = cloudpickle.dumps(make_agent(counter, True, name))
    store = MemoryJournalStore(MAX_PARALLELISM, topic=f"{name}.journal")
    codec = RecordCodec(SIGNING_KEY.encode(), name)
    for attempt in range(restart_attempts + 1):
        index = _recover(store, codec) if attempt else None
        try:
            # Fresh inputs per attempt, as a job re-reads them from Kafka: an action that changes its input in place
            # must not change what a later attempt (or the reference) sees.
            outputs = _attempt(cloudpickle.loads(agent_bytes), copy.deepcopy(inputs),
                               JournalWriter(store, codec, durability), index)
        except Exception as exc:  # noqa: BLE001 - an attempt that failed: the next one restarts, as Flink's would
            if attempt == restart_attempts:
                if keep_job_error:
                    return FaultyRun(expected, reference_counter, [], counter, exc)
                raise
            continue
        return FaultyRun(expected, reference_counter, [canonical_output(o) for o in outputs], counter)
    raise AssertionError("unreachable")


def _recover(store: MemoryJournalStore, codec: RecordCodec):
    groups = range(MAX_PARALLELISM)
    return read_recovery_index(store, codec, dict.fromkeys(groups, 0), store.end_offsets(list(groups)))


def _attempt(agent: Agent, inputs: list[dict], writer: JournalWriter, index) -> list[AgentOutput]:
    """One attempt over every input, each key's in order, with the key's recovered history if any."""
    memory: dict[str, dict] = {}
    seqs: Counter = Counter()
    outputs: list[AgentOutput] = []
    histories = {}
    try:
        for record in inputs:
            key = record["key"]
            seqs[key] += 1
            if index is not None and key not in histories:
                histories[key] = index.history(key_digest(key))
            group = key_group(key, "STRING", MAX_PARALLELISM)
            result = execute_run(agent, RunInput(key, group, seqs[key], record), memory.get(key, {}),
                                 history=histories.get(key), journal=writer.run_journal(group))
            memory[key] = result.memory
            outputs += [AgentOutput(key, seqs[key], o.id, o.output) for o in result.outputs]
    finally:
        writer.close()
    return outputs
