"""A tool loop cut by a SIGKILL between a tool call and the next model turn resumes there, repeating nothing.

A standalone cluster with one TaskManager runs ``tests/jobs/tool_loop_job.py`` (``flink run -py``): per ticket a
tool loop against the local model service, slowed to 0.3 s per model turn: turn 1 calls ``find_order``, the tool
runs at once, turn 2 answers. The TaskManager is SIGKILLed after a checkpoint completed, at a moment when some
tickets' tool had run and their turn 2 had not answered (counted outside the worker, in a SQLite file). A new
TaskManager takes over, Flink restores the checkpoint, and the runs go on from the journal.

Checked from outside the worker: for every ticket caught between its tool call and its next turn, turn 1 was
asked once and the tool ran once (both reused from the journal); no request reached the model service twice as
an execution (a turn 2 that was under way is sent again with the same ``Idempotency-Key`` and answered from the
service's store); every tool ran once; the committed answers (``read_committed``) are a failure-free run's, each
once. The agent keeps each loop's ``ToolLoopResult`` in memory and the key's next ticket reads it: a package
object in the user's state, restored by its public name in the new TaskManager.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path

import pytest

from flink_agents_replay.local.processes import pid_alive
from flink_agents_replay.testing.committed import CommittedReader, poll_until
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import job_script, make_inputs, produce_inputs, reference_outputs

pytestmark = pytest.mark.integration

JOB = Path(__file__).resolve().parents[1] / "jobs" / "tool_loop_job.py"
KEYS, PER_KEY = 4, 12


def between(counter: InvocationCounter, job) -> set[str]:
    """Tickets whose tool ran and whose turn 2 has not answered."""
    counts = counter.counts()
    return {f"{key}|{n}" for key, n in _tickets() if counts.get(f"tool:{job.order_of(key, n)}", 0)
            and not counts.get(f"answered:2:{key}|{n}", 0)}


def _a_later_ticket(tickets: set[str]) -> bool:
    """Whether a ticket other than its key's first is among ``tickets`` (its key's memory holds a loop result)."""
    return any(int(ticket.rsplit("|", 1)[1]) > 0 for ticket in tickets)  # tickets count from 0


def _tickets() -> list[tuple[str, int]]:
    return [(record["key"], record["n"]) for record in make_inputs(keys=KEYS, per_key=PER_KEY)]


def test_a_tool_loop_killed_between_a_tool_call_and_the_next_turn_repeats_no_model_or_tool_call(
        kafka_bootstrap, new_topic, flink_cluster, model_server, tmp_path):
    inputs = make_inputs(keys=KEYS, per_key=PER_KEY)
    reference_model = model_server()
    with job_script(JOB) as job:
        expected = reference_outputs(job.support_agent(model_url=reference_model.base_url, name="reference-loop",
                                                       counter=InvocationCounter(tmp_path / "reference.db")), inputs)
    model = model_server(delay_ms=300)
    name = f"loop-kill-{uuid.uuid4().hex[:6]}"
    counter = InvocationCounter(tmp_path / "calls.db")
    input_topic, output_topic = produce_inputs(kafka_bootstrap, inputs), new_topic(prefix="loop-out")
    cluster = flink_cluster(taskmanagers=1)
    cluster.start()
    job_id = cluster.submit_python_job(
        JOB, "--bootstrap-servers", kafka_bootstrap, "--input-topic", input_topic, "--output-topic", output_topic,
        "--journal-topic", f"journal-{uuid.uuid4().hex[:8]}", "--counter-path", str(counter.path),
        "--signing-key", "tool-loop-sigkill-signing-key", "--model-url", model.base_url, "--agent-name", name)

    def checkpoints() -> int:
        return cluster.rest_get(f"/jobs/{job_id}/checkpoints")["counts"]["completed"]

    def ready() -> bool:
        caught = between(counter, job)
        return checkpoints() >= 1 and len(caught) >= 2 and _a_later_ticket(caught)

    poll_until(ready, 180,
               lambda: cluster.job_diagnostics(job_id), interval_s=0.02)
    [(victim, victim_pid)] = cluster.taskmanager_processes().items()
    assert cluster.kill_taskmanager(resource_id=victim) == victim_pid and not pid_alive(victim_pid)
    caught = between(counter, job)  # the fault hit: tools had run, their next turn had not answered
    answered_at_kill = sum(n for name, n in counter.counts().items() if name.startswith("answered:2:"))
    assert len(caught) >= 2 and answered_at_kill < len(inputs) and _a_later_ticket(caught), (caught, answered_at_kill)

    cluster.start_taskmanager()
    with CommittedReader(kafka_bootstrap, output_topic, decode=lambda value: tuple(json.loads(value))) as reader:
        poll_until(lambda: set(reader.poll()) >= set(expected), 240,
                   lambda: cluster.job_diagnostics(job_id))
        done = checkpoints()  # one more checkpoint commits anything still pending, duplicates included
        poll_until(lambda: checkpoints() > done, 60, lambda: cluster.job_diagnostics(job_id))
        rows = reader.read_to_committed_end()
    cluster.flink_command("cancel", job_id, check=True)

    assert Counter(rows) == expected
    # Each key's later tickets read the loop result its previous ticket kept in memory (restored by name in the
    # new TaskManager for the tickets caught at the kill).
    previous = [json.loads(output)["previous"] for _, _, output in rows]
    assert sum(p is not None and p["type"] == "ToolLoopResult" for p in previous) == len(inputs) - KEYS
    counts = counter.counts()
    assert all(counts[f"turn:1:{ticket}"] == 1 for ticket in caught), {t: counts[f"turn:1:{t}"] for t in caught}
    tools = {name: n for name, n in counts.items() if name.startswith("tool:")}
    assert len(tools) == len(inputs) and set(tools.values()) == {1}, tools  # every tool ran once
    stats = model.stats()
    assert stats.repeated == 0 and stats.chat == 2 * len(inputs) and stats.tool_call_replies == len(inputs), stats
    print(f"\ntool loop SIGKILL: {len(caught)} loops between a tool call and the next turn at the kill; after the "
          f"restore every tool ran once ({len(tools)}), model executions {stats.chat} for {len(inputs)} loops, "
          f"repeated {stats.repeated}, turns answered by idempotency key {stats.idempotent_replays}")
