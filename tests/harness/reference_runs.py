"""One failure-free reference run and one run with injected faults of the same agent, for the habit tests.

Each habit test builds its agent twice with ``make_agent(counter, fault, name)``: once without the fault for the
reference outputs (the engine alone, no Flink), once with it for a real job on a MiniCluster with a real broker,
whose real invocations its own counter file records. The test then compares and counts.
"""

from __future__ import annotations

import copy
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flink_agents_replay import Agent
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import produce_inputs, reference_outputs, run_agent_job

SIGNING_KEY = "adversary-signing-key-0123456789"


@dataclass
class FaultyRun:
    """What the two runs gave: the reference's outputs and counter, the faulty job's outputs and counter."""

    expected: Counter
    reference_counter: InvocationCounter
    outputs: list[tuple]
    counter: InvocationCounter
    error: Exception | None = None  # the job's failure, when asked to keep it (``keep_job_error``)


def reference_then_faulty_run(kafka_bootstrap: str, tmp_path: Path,
                              make_agent: Callable[[InvocationCounter, bool, str], Agent],
                              inputs: list[dict], *, name_prefix: str, checkpoint_interval_ms: int,
                              restart_attempts: int, keep_job_error: bool = False) -> FaultyRun:
    """Run ``make_agent(..., False, name)`` failure-free, then ``make_agent(..., True, name)`` as a job.

    The job's exception propagates, unless ``keep_job_error``: then it is the result's ``error`` (what the user
    would see) and the outputs are empty.
    """
    name = f"{name_prefix}-{uuid.uuid4().hex[:6]}"
    reference_counter = InvocationCounter(tmp_path / "ref.sqlite")
    # A copy: a handler that changes its event in place must not change what the job reads.
    expected = reference_outputs(make_agent(reference_counter, False, name), copy.deepcopy(inputs))
    counter = InvocationCounter(tmp_path / "job.sqlite")
    topic = produce_inputs(kafka_bootstrap, inputs)
    config = {"kafka": {"bootstrap.servers": kafka_bootstrap}, "signing_key": SIGNING_KEY,
              "journal_topic": f"{name}.journal"}
    try:
        outputs = run_agent_job(kafka_bootstrap, topic, make_agent(counter, True, name), config,
                                checkpoint_interval_ms=checkpoint_interval_ms, restart_attempts=restart_attempts)
    except Exception as exc:  # noqa: BLE001 - kept only when the test asks to look at it
        if not keep_job_error:
            raise
        return FaultyRun(expected, reference_counter, [], counter, exc)
    return FaultyRun(expected, reference_counter, outputs, counter)
