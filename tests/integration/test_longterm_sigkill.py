"""No duplicate memories after a TaskManager is SIGKILLed while actions that already wrote memory are under way.

A standalone cluster with one TaskManager runs ``tests/jobs/longterm_memory_job.py`` (``flink run -py``): per
ticket, a memory search, a memory add, a slow tool call (0.3 s), an answer with what the search found. The
TaskManager is SIGKILLed after a checkpoint completed, while tool calls are under way: their actions' adds
reached Chroma, and their journal records may not have reached Kafka. A new TaskManager takes over, Flink
restores the checkpoint, and the actions run again.

Checked from outside the worker: each ticket is in the key's memory once (same count and texts as a
failure-free run; no second version); every embedding request ran once (an add made again is sent with the
same ``Idempotency-Key``); the committed answers (``read_committed``) are the failure-free ones, each once.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path

import pytest

from flink_agents_replay.integrations.vector_store import Where
from flink_agents_replay.local.processes import pid_alive
from flink_agents_replay.longterm import ChromaVectorStore
from flink_agents_replay.testing.committed import CommittedReader, poll_until
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import job_script, make_inputs, produce_inputs

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOB = Path(__file__).resolve().parents[1] / "jobs" / "longterm_memory_job.py"
KEYS, PER_KEY = 4, 10


def expected_answers(inputs: list[dict], text) -> Counter:
    seen: dict[str, list[str]] = {}
    answers = Counter()
    for record in inputs:
        past = seen.setdefault(record["key"], [])
        answers[(record["key"], json.dumps({"n": record["n"], "past": sorted(past)}, sort_keys=True))] += 1
        past.append(text(record["key"], record["n"]))
    return answers


def counted(counter: InvocationCounter, prefix: str) -> int:
    return sum(n for name, n in counter.counts().items() if name.startswith(prefix))


def under_way(counter: InvocationCounter) -> int:
    return counted(counter, "call:") - counted(counter, "done:")


def test_a_sigkill_while_memory_writing_actions_are_under_way_duplicates_no_memory(
        kafka_bootstrap, new_topic, flink_cluster, chroma_server, model_server, tmp_path):
    inputs = make_inputs(keys=KEYS, per_key=PER_KEY)
    with job_script(JOB) as job:
        expected, text = expected_answers(inputs, job.ticket_text), job.ticket_text
    model, chroma_url = model_server(), chroma_server.status().url
    name = f"memory-kill-{uuid.uuid4().hex[:6]}"
    counter = InvocationCounter(tmp_path / "calls.db")
    input_topic, output_topic = produce_inputs(kafka_bootstrap, inputs), new_topic(prefix="memory-out")
    cluster = flink_cluster(taskmanagers=1)
    cluster.start()
    job_id = cluster.submit_python_job(
        JOB, "--bootstrap-servers", kafka_bootstrap, "--input-topic", input_topic, "--output-topic", output_topic,
        "--journal-topic", f"journal-{uuid.uuid4().hex[:8]}", "--counter-path", str(counter.path),
        "--signing-key", "longterm-sigkill-signing-key", "--chroma-url", chroma_url,
        "--model-url", model.base_url, "--agent-name", name)

    def checkpoints() -> int:
        return cluster.rest_get(f"/jobs/{job_id}/checkpoints")["counts"]["completed"]

    poll_until(lambda: checkpoints() >= 1 and counted(counter, "call:") >= len(inputs) // 4
               and under_way(counter) > 0, 120, lambda: cluster.job_diagnostics(job_id), interval_s=0.02)
    [(victim, victim_pid)] = cluster.taskmanager_processes().items()
    assert cluster.kill_taskmanager(resource_id=victim) == victim_pid and not pid_alive(victim_pid)
    # The fault hit: actions were under way past their add (it precedes the tool call), work was left.
    caught, begun = under_way(counter), counted(counter, "call:")
    with ChromaVectorStore(chroma_url) as store:
        remembered_at_kill = len(store.get(f"{name}/memory", Where()))
    assert caught > 0 and begun < len(inputs), (caught, begun)
    assert remembered_at_kill >= begun, (remembered_at_kill, begun)

    cluster.start_taskmanager()
    with CommittedReader(kafka_bootstrap, output_topic, decode=lambda value: tuple(json.loads(value))) as reader:
        poll_until(lambda: {(k, o) for k, _, o in reader.poll()} >= set(expected), 180,
                   lambda: cluster.job_diagnostics(job_id))
        done = checkpoints()  # one more checkpoint commits anything still pending, duplicates included
        poll_until(lambda: checkpoints() > done, 60, lambda: cluster.job_diagnostics(job_id))
        rows = reader.read_to_committed_end()
    cluster.cancel_job(job_id)

    assert Counter((key, output) for key, _, output in rows) == expected
    with ChromaVectorStore(chroma_url) as store:
        docs = store.get(f"{name}/memory", Where())
    assert Counter(d.text for d in docs) == Counter(text(r["key"], r["n"]) for r in inputs)  # each once
    stats = model.stats()
    assert stats.embeddings == 2 * len(inputs) and stats.repeated == 0, stats
    print(f"\nlong-term memory SIGKILL: {caught} actions under way past their add at the kill "
          f"({begun}/{len(inputs)} begun, {remembered_at_kill} memories stored); after the restore "
          f"{len(docs)} memories for {len(inputs)} tickets; embedding requests {stats.embeddings}, answered by "
          f"idempotency key {stats.idempotent_replays}")
