"""Runs waiting for approvals through a SIGKILLed TaskManager, then a savepoint and a rescale (issue 35).

A standalone cluster with one TaskManager runs ``tests/jobs/waits_job.py``: per input a lookup, a wait for
approval, then a payment (external, 0.3 s) or a denial. The test plays the approvers: it reads the committed
wait events and answers each opened wait on the signals topic (even inputs approved, odd ones denied). Once a
checkpoint has completed, it sends a batch of decisions and SIGKILLs the TaskManager at once: runs are parked,
decisions are in flight, payments may be under way. A new TaskManager takes over and Flink restores.

Then, with runs parked again, the job is stopped with a savepoint; the waits opened last are answered while it is
down, and the job is submitted again from the savepoint at parallelism 2: those decisions are applied there.

Checked from outside the worker (the tools count themselves in a SQLite file): every approved payment made
under one call id (an idempotent payment service applies it once), no denied one made; every lookup before a
wait made once, or twice only for a run cut before its wait was parked in a checkpoint; every wait resumed
once (committed ``resumed`` events); the committed outputs (``read_committed``) are the failure-free run's.
"""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter
from pathlib import Path

import pytest

from flink_agents_replay.local.processes import pid_alive
from flink_agents_replay.testing.committed import CommittedReader, poll_until
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import job_script, make_inputs, produce_inputs, produce_json

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOB = Path(__file__).resolve().parents[1] / "jobs" / "waits_job.py"
KEYS, PER_KEY = 4, 5


class Approvers:
    """Reads the committed wait events; answers each opened wait once."""

    def __init__(self, bootstrap: str, waits_topic: str, signals_topic: str, job) -> None:
        self.bootstrap, self.signals_topic, self.job = bootstrap, signals_topic, job
        self.reader = CommittedReader(bootstrap, waits_topic, decode=json.loads)
        self.answered: set[str] = set()
        self.events: list[dict] = []

    def unanswered(self) -> list[dict]:
        self.events = list(self.reader.poll())
        return [e for e in self.events if e["kind"] == "opened" and e["wait_id"] not in self.answered]

    def answer(self, opened: list[dict]) -> None:
        produce_json(self.bootstrap, self.signals_topic,
                     [{"key": e["key"], "wait_id": e["wait_id"], "signal_id": f"s-{e['wait_id']}",
                       **self.job.decision_for(e["payload"])} for e in opened])
        self.answered.update(e["wait_id"] for e in opened)

    def kinds(self) -> Counter:
        return Counter(e["kind"] for e in self.events)


def job_arguments(bootstrap: str, *, input_topic: str, signals_topic: str, output_topic: str, waits_topic: str,
                  counter: InvocationCounter, name: str) -> list[str]:
    """``waits_job.py``'s arguments, with a fresh journal topic, agent name and transactional id prefix."""
    return ["--bootstrap-servers", bootstrap, "--input-topic", input_topic, "--signals-topic", signals_topic,
            "--output-topic", output_topic, "--waits-topic", waits_topic, "--journal-topic",
            f"journal-{uuid.uuid4().hex[:8]}", "--counter-path", str(counter.path), "--signing-key",
            "waits-sigkill-signing-key-0123", "--agent-name", f"{name}-{uuid.uuid4().hex[:6]}",
            "--transactional-id-prefix", f"{name}-{uuid.uuid4().hex[:8]}"]


def expected_outputs(inputs: list[dict]) -> Counter:
    expected: Counter = Counter()
    decided: dict[str, list] = {}
    for record in inputs:  # in order per key
        key, n = record["key"], record["n"]
        approved = n % 2 == 0
        decided.setdefault(key, []).append([n, approved])
        reference = f"{key}/{n}"
        output = ["paid", f"paid {reference}", decided[key]] if approved else ["denied", reference, "odd", decided[key]]
        expected[(key, n + 1, json.dumps(output, sort_keys=True))] += 1
    return expected


def test_a_taskmanager_killed_while_runs_wait_and_decisions_are_in_flight_pays_each_approval_once(
        kafka_bootstrap, new_topic, flink_cluster, tmp_path):
    inputs = make_inputs(keys=KEYS, per_key=PER_KEY)
    expected = expected_outputs(inputs)
    counter = InvocationCounter(tmp_path / "calls.db")
    input_topic, signals_topic = produce_inputs(kafka_bootstrap, inputs), produce_inputs(kafka_bootstrap, [])
    output_topic, waits_topic = new_topic(prefix="waits-out"), new_topic(prefix="waits-events")
    cluster = flink_cluster(taskmanagers=1)
    cluster.start()
    arguments = job_arguments(kafka_bootstrap, input_topic=input_topic, signals_topic=signals_topic,
                              output_topic=output_topic, waits_topic=waits_topic, counter=counter, name="waits-kill")
    job_id = cluster.submit_python_job(JOB, *arguments)

    def checkpoints() -> int:
        return cluster.rest_get(f"/jobs/{job_id}/checkpoints")["counts"]["completed"]

    with job_script(JOB) as job:
        approvers = Approvers(kafka_bootstrap, waits_topic, signals_topic, job)

        def answer_until_ready_to_kill() -> bool:
            opened = approvers.unanswered()
            ready = checkpoints() >= 1 and len(approvers.answered) >= KEYS and opened
            approvers.answer(opened)  # the batch the kill catches in flight, once ready
            return bool(ready)

        poll_until(answer_until_ready_to_kill, 180, lambda: cluster.job_diagnostics(job_id), interval_s=0.1)
        [(victim, victim_pid)] = cluster.taskmanager_processes().items()
        assert cluster.kill_taskmanager(resource_id=victim) == victim_pid and not pid_alive(victim_pid)
        at_kill = approvers.kinds()
        # The fault hit: decisions were sent that no committed event shows applied, and runs were parked.
        assert len(approvers.answered) > at_kill["resumed"] and at_kill["opened"] > at_kill["closed"], at_kill
        paid_at_kill = sum(n for name, n in counter.counts().items() if name.startswith("pay:"))

        cluster.start_taskmanager()
        with CommittedReader(kafka_bootstrap, output_topic, decode=lambda value: tuple(json.loads(value))) as reader:
            # Until half the outputs are committed; then a savepoint with the waits opened last unanswered.
            def half_done_with_runs_parked() -> bool:
                unanswered = approvers.unanswered()
                if len(set(reader.poll())) >= len(expected) // 2 and unanswered:
                    return True
                approvers.answer(unanswered)
                return False

            poll_until(half_done_with_runs_parked, 240, lambda: cluster.job_diagnostics(job_id), interval_s=0.2)
            savepoint = cluster.stop_with_savepoint(job_id, tmp_path / "savepoints")
            down = approvers.unanswered()
            approvers.answer(down)  # sent while the job is down
            cluster.start_taskmanager()  # room for parallelism 2
            submitted = cluster.flink_command("run", "-d", "-s", savepoint, "-py", str(JOB), *arguments,
                                              "--parallelism", "2", check=True)
            job_id = re.search(r"JobID\s+([0-9a-f]{32})", submitted.stdout + submitted.stderr).group(1)

            def answer_until_done() -> bool:
                approvers.answer(approvers.unanswered())
                return set(reader.poll()) >= set(expected)

            poll_until(answer_until_done, 240, lambda: cluster.job_diagnostics(job_id), interval_s=0.2)
            done = checkpoints()  # one more checkpoint commits anything still pending, duplicates included
            poll_until(lambda: checkpoints() > done, 60, lambda: cluster.job_diagnostics(job_id))
            rows = reader.read_to_committed_end()
            approvers.unanswered()
        approvers.reader.close()
    cluster.cancel_job(job_id)

    assert Counter(rows) == expected
    counts = counter.counts()
    approved = {f"{r['key']}/{r['n']}" for r in inputs if r["n"] % 2 == 0}
    paid = {name.split(":", 1)[1]: n for name, n in counts.items() if name.startswith("pay:")}
    assert set(paid) == approved, paid  # every approval paid, no denial
    pay_ids = Counter(name.split(":", 1)[1].split("|", 1)[0] for name in counts if name.startswith("pay-id:"))
    assert set(pay_ids.values()) == {1}, pay_ids  # one call id per payment: an idempotent service pays once
    lookups = {name: n for name, n in counts.items() if name.startswith("lookup:")}
    assert len(lookups) == len(inputs) and max(lookups.values()) <= 2, lookups
    kinds = approvers.kinds()
    resumed = Counter(e["wait_id"] for e in approvers.events if e["kind"] == "resumed")
    assert len(resumed) == len(inputs) and set(resumed.values()) == {1}, resumed  # every run resumed once
    assert kinds["closed"] == len(inputs), kinds
    assert down and all(resumed[e["wait_id"]] == 1 for e in down), down  # decided while down, applied once
    print(f"\nwaits SIGKILL: killed with {len(approvers.answered) - at_kill['resumed']} decisions in flight and "
          f"{at_kill['opened'] - at_kill['closed']} runs parked, {paid_at_kill} payments made; after the restore "
          f"payments {sum(paid.values())} for {len(approved)} approvals (made again under the same call id: "
          f"{sum(paid.values()) - len(approved)}), lookups made again {sum(lookups.values()) - len(inputs)}; "
          f"{len(down)} waits decided while the job was down, applied after the restore at parallelism 2")
