"""A tool loop cut by a SIGKILL between a tool call and the next model turn resumes there, repeating nothing.

A standalone cluster with one TaskManager runs ``tests/jobs/tool_loop_job.py`` (``flink run -py``): per ticket a
tool loop against the local model service, slowed to 0.3 s per model turn: turn 1 calls ``find_order``, the tool
runs at once, turn 2 answers. The TaskManager is SIGKILLed after a checkpoint completed, at a moment when some
tickets' tool had run and their turn 2 had been asked and had not answered (counted outside the worker, in a
SQLite file), and its trace exporter process with it. A new TaskManager takes over, Flink restores the
checkpoint, and the runs go on from the journal.

Checked from outside the worker: for every ticket caught between its tool call and its next turn, turn 1 was
asked once and the tool ran once (both reused from the journal: a run goes on past an external call only once
its outcome is acknowledged); no request reached the model service twice as an execution (a turn 2 that was
under way is sent again with the same ``Idempotency-Key`` and answered from the service's store); the committed
answers (``read_committed``) are a failure-free run's, each once. A tool cut short *during* its call (run, its
outcome not yet acknowledged) is in doubt and made again under its policy (``rerun``): the test allows that only
for a tool that had run before the kill, and only with the same call id, which an idempotent service applies
once. The agent keeps each loop's ``ToolLoopResult`` in memory and the key's next ticket reads it: a package
object in the user's state, restored by its public name in the new TaskManager.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections import Counter
from pathlib import Path

import pytest

from flink_agents_replay.local.phoenix_server import read_spans
from flink_agents_replay.local.processes import pid_alive
from flink_agents_replay.testing.committed import CommittedReader, poll_until
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import job_script, make_inputs, produce_inputs, reference_outputs
from tests.harness.processes import children_running

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOB = Path(__file__).resolve().parents[1] / "jobs" / "tool_loop_job.py"
KEYS, PER_KEY = 4, 12
SIGNING_KEY = "tool-loop-sigkill-signing-key"


def between(counter: InvocationCounter, job) -> set[str]:
    """Tickets whose tool ran and whose turn 2 was asked and has not answered."""
    counts = counter.counts()
    return {f"{key}|{n}" for key, n in _tickets() if counts.get(f"tool:{job.order_of(key, n)}", 0)
            and counts.get(f"turn:2:{key}|{n}", 0) and not counts.get(f"answered:2:{key}|{n}", 0)}


def _a_later_ticket(tickets: set[str]) -> bool:
    """Whether a ticket other than its key's first is among ``tickets`` (its key's memory holds a loop result)."""
    return any(int(ticket.rsplit("|", 1)[1]) > 0 for ticket in tickets)  # tickets count from 0


def _tool_counts(counter: InvocationCounter) -> dict[str, int]:
    """How many times each order's tool ran."""
    return {name.split(":", 1)[1]: n for name, n in counter.counts().items() if name.startswith("tool:")}


def _ticket(ticket: str) -> tuple[str, int]:
    key, n = ticket.rsplit("|", 1)
    return key, int(n)


def _tickets() -> list[tuple[str, int]]:
    return [(record["key"], record["n"]) for record in make_inputs(keys=KEYS, per_key=PER_KEY)]


def test_a_tool_loop_killed_between_a_tool_call_and_the_next_turn_repeats_no_model_or_tool_call(
        kafka_bootstrap, new_topic, flink_cluster, model_server, phoenix, tmp_path):
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
        "--signing-key", SIGNING_KEY, "--model-url", model.base_url, "--agent-name", name,
        "--otlp-endpoint", phoenix.otlp_endpoint)

    def checkpoints() -> int:
        return cluster.rest_get(f"/jobs/{job_id}/checkpoints")["counts"]["completed"]

    def ready() -> bool:
        caught = between(counter, job)
        return checkpoints() >= 1 and len(caught) >= 2 and _a_later_ticket(caught)

    # The TaskManager's exporter process dies with it, and the spans it held since the last checkpoint with it: what
    # was executed must come back from the journal (a TaskManager's container killed whole). Found before the moment
    # to kill comes (the operator starts it when it opens); stopped first, so that it neither sees the TaskManager
    # die nor is seen to die by it.
    [(victim, victim_pid)] = cluster.taskmanager_processes().items()
    exporters = poll_until(lambda: children_running(victim_pid, b"flink_agents_replay.traces.exporter_process"), 120,
                           "the TaskManager's trace exporter process")
    assert len(exporters) == 1, exporters
    poll_until(ready, 180,
               lambda: cluster.job_diagnostics(job_id), interval_s=0.02)
    for exporter in exporters:
        os.kill(exporter, signal.SIGSTOP)
    assert cluster.kill_taskmanager(resource_id=victim) == victim_pid and not pid_alive(victim_pid)
    for exporter in exporters:
        os.kill(exporter, signal.SIGKILL)
    poll_until(lambda: not any(pid_alive(exporter) for exporter in exporters), 10, "the exporter's death")
    caught = between(counter, job)  # the fault hit: tools had run, their next turn had not answered
    tools_at_kill = _tool_counts(counter)
    answered_at_kill = sum(n for name, n in counter.counts().items() if name.startswith("answered:2:"))
    assert len(caught) >= 2 and answered_at_kill < len(inputs) and _a_later_ticket(caught), (caught, answered_at_kill)

    cluster.start_taskmanager()
    with CommittedReader(kafka_bootstrap, output_topic, decode=lambda value: tuple(json.loads(value))) as reader:
        poll_until(lambda: set(reader.poll()) >= set(expected), 240,
                   lambda: cluster.job_diagnostics(job_id))
        done = checkpoints()  # one more checkpoint commits anything still pending, duplicates included
        poll_until(lambda: checkpoints() > done, 60, lambda: cluster.job_diagnostics(job_id))
        rows = reader.read_to_committed_end()
    cluster.cancel_job(job_id)

    assert Counter(rows) == expected
    # Each key's later tickets read the loop result its previous ticket kept in memory (restored by name in the
    # new TaskManager for the tickets caught at the kill).
    previous = [json.loads(output)["previous"] for _, _, output in rows]
    assert sum(p is not None and p["type"] == "ToolLoopResult" for p in previous) == len(inputs) - KEYS
    counts = counter.counts()
    assert all(counts[f"turn:1:{ticket}"] == 1 for ticket in caught), {t: counts[f"turn:1:{t}"] for t in caught}
    tools = _tool_counts(counter)
    assert set(tools) == {job.order_of(key, n) for key, n in _tickets()}, tools  # every tool ran
    made_again = {order for order, n in tools.items() if n > 1}
    assert all(tools[order] == 2 and tools_at_kill.get(order) == 1 for order in made_again), (made_again, tools)
    call_ids = Counter(name.split(":", 1)[1].split("|", 1)[0] for name in counts if name.startswith("tool-id:"))
    assert set(call_ids.values()) == {1}, call_ids  # one call id per order: an idempotent service applies it once
    assert not made_again & {job.order_of(*_ticket(ticket)) for ticket in caught}, (caught, made_again)
    stats = model.stats()
    assert stats.repeated == 0 and stats.chat == 2 * len(inputs) and stats.tool_call_replies == len(inputs), stats
    traced = check_traces(phoenix, name, inputs, caught, stats, job)
    print(f"\ntool loop SIGKILL: {len(caught)} loops between a tool call and the next turn at the kill, "
          f"their tools reused; {len(made_again)} tools cut short in their call made again with their call id; "
          f"model executions {stats.chat} for {len(inputs)} loops, repeated {stats.repeated}, turns answered by "
          f"idempotency key {stats.idempotent_replays}; traces in Phoenix: {traced}")


def check_traces(phoenix, project: str, inputs: list[dict], caught: set[str], stats, job) -> str:
    """The job's spans as Phoenix holds them (docs/design.md §17): one trace per run, every model execution the
    service counted once as an executed span with the service's token counts, the calls the kill caught reused
    and marked so, no signing key, API key or prompt text."""
    def executed(spans, operation):
        return [span for span in spans if span["attributes"].get("gen_ai.operation.name") == operation]

    def complete():
        found = read_spans(phoenix.url, project)
        return found if len(executed(found, "chat")) >= stats.chat else None

    spans = poll_until(complete, 120, lambda: f"Phoenix holds {len(read_spans(phoenix.url, project))} spans",
                       interval_s=0.5)
    runs = [span for span in spans if span["parent_id"] is None]
    trace_of = {(span["attributes"]["flink_agents.key"], span["attributes"]["flink_agents.seq"]): span["trace_id"]
                for span in runs}
    assert len(runs) == len(trace_of) == len(inputs), (len(runs), len(trace_of))  # each run one root, one trace
    assert len(set(trace_of.values())) == len(inputs)
    assert {span["trace_id"] for span in spans} == set(trace_of.values())  # nothing outside the runs' traces
    chats = executed(spans, "chat")
    assert len(chats) == stats.chat == 2 * len(inputs)  # each execution once (Phoenix keeps one span per id)
    assert sum(span["attributes"]["gen_ai.usage.input_tokens"] for span in chats) == stats.prompt_tokens
    assert sum(span["attributes"]["gen_ai.usage.output_tokens"] for span in chats) == stats.completion_tokens
    assert len(executed(spans, "execute_tool")) == len(inputs)  # one outcome per tool call (none for one in doubt)
    for ticket in caught:  # turn 1 and the tool were reused after the kill, in the run's own trace
        key, n = _ticket(ticket)
        reused = [span for span in spans if span["trace_id"] == trace_of[(key, n + 1)]
                  and span["attributes"].get("flink_agents.call.reused")]
        assert {span["name"] for span in reused} == {"reused chat stub-model", "reused execute_tool find_order"}, (
            ticket, [span["name"] for span in reused])
        assert not any("gen_ai.usage.input_tokens" in span["attributes"] for span in reused)
    exported = json.dumps(spans)
    assert SIGNING_KEY not in exported and "unused" not in exported  # the signing key, the model's API key
    assert not any(job.ticket_text(record["key"], record["n"]) in exported for record in inputs)  # prompts off
    return f"{len(spans)} spans in {len(inputs)} traces, {len(chats)} model executions"
