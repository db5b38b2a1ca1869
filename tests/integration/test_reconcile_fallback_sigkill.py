"""A SIGKILL while refunds are in doubt at a service without idempotency keys, and while the primary model is down.

A standalone cluster with one TaskManager runs ``tests/jobs/reconcile_fallback_job.py``: per ticket a
:class:`~flink_agents_replay.FallbackChatModel` call (the primary local model service answers 503 for the first
seconds, so the fallback answers those), then a refund whose payment is counted at once and whose answer takes
a second. The TaskManager is SIGKILLed after a checkpoint, at a moment when some refunds have paid and not
answered: in doubt. A new TaskManager takes over and Flink restores the checkpoint.

Checked from outside the worker (counts in a SQLite file, and the model services' own counters): every order was
paid exactly once, though the payment service keeps no idempotency keys (the refunds in doubt at the kill were
found paid by the reconciler, not paid again); every model call was executed once across both services, the
fallback's answers reused after the restore (the primary never asked again for them); the committed outputs
(``read_committed``) are a failure-free run's, each once.
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

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOB = Path(__file__).resolve().parents[1] / "jobs" / "reconcile_fallback_job.py"
KEYS, PER_KEY = 3, 8


def in_doubt(counter: InvocationCounter) -> set[str]:
    """Orders whose refund paid and has not answered."""
    counts = counter.counts()
    return {name.split(":", 1)[1] for name in counts
            if name.startswith("refund:") and not counts.get(f"returned:{name.split(':', 1)[1]}")}


def test_refunds_in_doubt_are_reconciled_not_paid_twice_and_fallback_answers_are_reused(
        kafka_bootstrap, new_topic, flink_cluster, model_server, tmp_path):
    inputs = make_inputs(keys=KEYS, per_key=PER_KEY)
    with job_script(JOB) as job:
        expected = reference_outputs(job.triage_agent(
            primary_url=model_server().base_url, fallback_url=model_server().base_url, name="reference-refunds",
            counter=InvocationCounter(tmp_path / "reference.db")), inputs)
        orders = {job.order_of(record["key"], record["n"]) for record in inputs}
    primary, fallback = model_server(), model_server()
    primary.schedule_outage(after_chat=0, seconds=6)  # from its first request on
    counter = InvocationCounter(tmp_path / "refunds.db")
    input_topic, output_topic = produce_inputs(kafka_bootstrap, inputs), new_topic(prefix="refund-out")
    cluster = flink_cluster(taskmanagers=1)
    cluster.start()
    job_id = cluster.submit_python_job(
        JOB, "--bootstrap-servers", kafka_bootstrap, "--input-topic", input_topic, "--output-topic", output_topic,
        "--journal-topic", f"journal-{uuid.uuid4().hex[:8]}", "--counter-path", str(counter.path),
        "--signing-key", "reconcile-fallback-signing-key", "--primary-url", primary.base_url,
        "--fallback-url", fallback.base_url, "--agent-name", f"refunds-{uuid.uuid4().hex[:6]}",
        "--refund-delay-ms", "1000")

    def checkpoints() -> int:
        return cluster.rest_get(f"/jobs/{job_id}/checkpoints")["counts"]["completed"]

    poll_until(lambda: checkpoints() >= 1 and len(in_doubt(counter)) >= 2 and fallback.stats().chat >= 1, 180,
               lambda: cluster.job_diagnostics(job_id), interval_s=0.02)
    [(victim, victim_pid)] = cluster.taskmanager_processes().items()
    assert cluster.kill_taskmanager(resource_id=victim) == victim_pid and not pid_alive(victim_pid)
    doubtful = in_doubt(counter)  # the fault hit: refunds paid, their answers not back
    assert len(doubtful) >= 2 and len(doubtful) < len(orders), doubtful

    cluster.start_taskmanager()
    with CommittedReader(kafka_bootstrap, output_topic, decode=lambda value: tuple(json.loads(value))) as reader:
        poll_until(lambda: set(reader.poll()) >= set(expected), 240, lambda: cluster.job_diagnostics(job_id))
        done = checkpoints()  # one more checkpoint commits anything still pending, duplicates included
        poll_until(lambda: checkpoints() > done, 60, lambda: cluster.job_diagnostics(job_id))
        rows = reader.read_to_committed_end()
    cluster.cancel_job(job_id)

    assert Counter(rows) == expected
    counts = counter.counts()
    paid = {order: counts.get(f"refund:{order}", 0) for order in orders}
    assert set(paid.values()) == {1}, {order: n for order, n in paid.items() if n != 1}  # each paid exactly once
    # The refunds in doubt at the kill were found paid by the reconciler (none was paid again).
    assert all(counts.get(f"reconciled:done:{order}") == 1 for order in doubtful), (doubtful, counts)
    reconciled_not_done = {name for name in counts if name.startswith("reconciled:not-done:")}
    a, b = primary.stats(), fallback.stats()
    assert a.unavailable >= 1 and b.chat >= 1, (a, b)  # the primary was down and the fallback answered
    # Every model call executed once over both services: answers reused after the restore asked no model again.
    assert a.chat + b.chat == len(inputs) and a.repeated == b.repeated == 0, (a, b)
    print(f"\nreconcile and fallback SIGKILL: {len(doubtful)} refunds in doubt at the kill, each found paid by the "
          f"reconciler; {len(reconciled_not_done)} found not paid and made; {len(orders)} orders paid once each; "
          f"model answers: primary {a.chat} (503s: {a.unavailable}), fallback {b.chat}, for {len(inputs)} calls")
