"""A key's later inputs run while its runs wait (``later_inputs_while_waiting="run"``), through a SIGKILLed
TaskManager (issue 35).

``tests/jobs/waits_job.py --later-inputs run`` on a standalone cluster: even inputs wait for approval, odd ones do
not; every run notes the inputs of its key it saw done in memory as it started (``seen``, counted outside the
worker per reference and value), and writes ``done.<n>``.

1. Nothing is answered until every odd input's output is committed: the later inputs ran while three runs per
   key waited.
2. Once a checkpoint holds the parked runs, the waits of inputs 4 (approved) and 2 (denied) are answered and
   inputs 6 and 7 sent; when a resumed run's payment is seen, the TaskManager is SIGKILLed (before the next
   checkpoint: resumed runs, later inputs and decisions are replayed after the restore, in whatever interleaving
   the sources give).
3. A new TaskManager; the remaining waits are answered; then a probe input per key reports the memory.

Checked: every input answered once (``read_committed``), with the expected outcome; each run saw the same memory
in every attempt (one ``seen`` value per reference: a resume replayed in another order would show a second) and
it is the committed one; a resumed run saw the memory as it started (no later input's write), and every odd
input before it; every approval paid under one call id, no denial; the probe sees every input's write (a
resumed run's writes went over the later runs' ones without losing them).
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from flink_agents_replay.local.processes import pid_alive
from flink_agents_replay.testing.committed import CommittedReader, poll_until
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import job_script, produce_inputs, produce_json
from tests.integration.test_waits_sigkill import JOB, job_arguments

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KEYS = [f"key-{k}" for k in range(3)]


def outcome(n: int, key: str) -> str:
    if n % 2:
        return "free"
    return f"paid {key}/{n}" if n % 4 == 0 else "denied"


def decision(e: dict) -> dict:
    approved = e["payload"]["n"] % 4 == 0
    return {"key": e["key"], "wait_id": e["wait_id"], "signal_id": f"s-{e['wait_id']}", "approved": approved,
            "reason": None if approved else "no", "by": "test"}


def test_later_inputs_run_while_runs_wait_and_a_killed_taskmanager_reproduces_what_each_run_saw(
        kafka_bootstrap, new_topic, flink_cluster, tmp_path):
    counter = InvocationCounter(tmp_path / "calls.db")
    input_topic = produce_inputs(kafka_bootstrap, [{"key": k, "n": n} for n in range(6) for k in KEYS])
    signals_topic = produce_inputs(kafka_bootstrap, [])
    output_topic, waits_topic = new_topic(prefix="later-out"), new_topic(prefix="later-events")
    cluster = flink_cluster(taskmanagers=1)
    cluster.start()
    arguments = [*job_arguments(kafka_bootstrap, input_topic=input_topic, signals_topic=signals_topic,
                                output_topic=output_topic, waits_topic=waits_topic, counter=counter, name="later"),
                 "--later-inputs", "run", "--checkpoint-interval-ms", "4000"]
    job_id = cluster.submit_python_job(JOB, *arguments)

    def checkpoints() -> int:
        return cluster.rest_get(f"/jobs/{job_id}/checkpoints")["counts"]["completed"]

    events = CommittedReader(kafka_bootstrap, waits_topic, decode=json.loads)
    seen_events: list[dict] = []
    with job_script(JOB), CommittedReader(kafka_bootstrap, output_topic,
                                          decode=lambda value: tuple(json.loads(value))) as reader:
        outputs: dict[tuple, list] = {}

        def read() -> None:  # every committed row so far, each time
            outputs.clear()
            for key, seq, output in reader.poll(0.2):
                outputs.setdefault((key, seq), []).append(json.loads(output))
            seen_events[:] = events.poll(0.2)

        def opened(n: int) -> list[dict]:
            return [e for e in seen_events if e["kind"] == "opened" and e["payload"]["n"] == n]

        # 1. The odd inputs' outputs while nothing is answered: the later inputs ran past the waiting runs.
        def odd_done_and_evens_parked() -> bool:
            read()
            return all((k, n + 1) in outputs for k in KEYS for n in (1, 3, 5)) and all(
                len(opened(n)) == len(KEYS) for n in (0, 2, 4))

        poll_until(odd_done_and_evens_parked, 120, lambda: f"outputs {sorted(outputs)}, events "
                   f"{Counter((e['kind'], e.get('payload') and e['payload'].get('n')) for e in seen_events)}; "
                   f"{cluster.job_diagnostics(job_id)}", interval_s=0.2)
        assert not any(n % 2 == 0 for _, seq in outputs for n in [seq - 1]), outputs  # none answered yet
        parked_at = checkpoints()
        poll_until(lambda: checkpoints() > parked_at, 60, lambda: cluster.job_diagnostics(job_id))

        # 2. Answers and later inputs, then the kill once a resumed run paid.
        answered = opened(4) + opened(2)
        produce_json(kafka_bootstrap, signals_topic, [decision(e) for e in answered])
        produce_json(kafka_bootstrap, input_topic, [{"key": k, "n": n} for n in (6, 7) for k in KEYS])
        before_kill = checkpoints()
        poll_until(lambda: any(name.startswith("pay:") for name in counter.counts()), 60,
                   lambda: cluster.job_diagnostics(job_id), interval_s=0.02)
        [(victim, victim_pid)] = cluster.taskmanager_processes().items()
        assert cluster.kill_taskmanager(resource_id=victim) == victim_pid and not pid_alive(victim_pid)
        read()
        resumed_committed = sum(e["kind"] == "resumed" for e in seen_events)
        # The fault hit: a resumed run paid, and decisions were applied that no checkpoint committed.
        assert resumed_committed < len(answered), (resumed_committed, len(answered), before_kill)

        # 3. A new TaskManager; the rest answered; then the probe.
        cluster.start_taskmanager()
        answered_ids = {e["wait_id"] for e in answered}

        def answer_until_done() -> bool:
            read()
            rest = [e for e in opened(0) + opened(6) if e["wait_id"] not in answered_ids]
            if rest:
                produce_json(kafka_bootstrap, signals_topic, [decision(e) for e in rest])
                answered_ids.update(e["wait_id"] for e in rest)
            return all((k, n + 1) in outputs for k in KEYS for n in range(8))

        poll_until(answer_until_done, 240, lambda: cluster.job_diagnostics(job_id), interval_s=0.2)
        produce_json(kafka_bootstrap, input_topic, [{"key": k, "n": 9} for k in KEYS])
        poll_until(lambda: read() or all((k, 9) in outputs for k in KEYS), 120,
                   lambda: cluster.job_diagnostics(job_id), interval_s=0.2)
        done = checkpoints()
        poll_until(lambda: checkpoints() > done, 60, lambda: cluster.job_diagnostics(job_id))
        read()
    events.close()
    cluster.cancel_job(job_id)

    counts = counter.counts()
    assert sorted(outputs) == sorted((k, n + 1) for k in KEYS for n in [*range(8), 8]), sorted(outputs)
    for (key, seq), answers in outputs.items():
        n = seq - 1 if seq <= 8 else 9
        assert len(answers) == 1, (key, seq, answers)  # answered exactly once
        result, reference, seen = answers[0]
        assert result == outcome(n, key) and reference == f"{key}/{n}", answers
        noted = [name for name in counts if name.startswith(f"seen:{key}/{n}|")]
        assert noted == [f"seen:{key}/{n}|{json.dumps(seen)}"], noted  # the same memory in every attempt
        assert all(m < n for m in seen) and {m for m in range(1, n, 2)} <= set(seen), (key, n, seen)
    for key in KEYS:
        assert outputs[(key, 9)][0][2] == list(range(8)), outputs[(key, 9)]  # no write lost
        assert 5 not in outputs[(key, 5)][0][2] and 4 not in outputs[(key, 5)][0][2]
    paid = {name.split(":", 1)[1]: n for name, n in counts.items() if name.startswith("pay:")}
    assert set(paid) == {f"{k}/{n}" for k in KEYS for n in (0, 4)}, paid  # approvals paid, no denial
    pay_ids = Counter(name.split(":", 1)[1].split("|", 1)[0] for name in counts if name.startswith("pay-id:"))
    assert set(pay_ids.values()) == {1}, pay_ids
    resumed = Counter(e["wait_id"] for e in seen_events if e["kind"] == "resumed")
    assert len(resumed) == 4 * len(KEYS) and set(resumed.values()) == {1}, resumed
    print(f"\nlater inputs while waiting: killed with {len(answered) - resumed_committed} decisions applied after "
          f"the last checkpoint; payments {sum(paid.values())} for {len(paid)} approvals; distinct memories seen "
          f"per run: 1")
