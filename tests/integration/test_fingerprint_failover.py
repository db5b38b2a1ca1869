"""Action fingerprints across real processes: a killed TaskManager, a job submitted again from its checkpoint.

``tests/jobs/fingerprint_failover_job.py`` runs an agent whose first action holds a set literal, with
``fingerprint_policy="fail"`` and no restarts, on a local standalone cluster. The TaskManager running it is
SIGKILLed mid-stream, so the job fails; a new TaskManager is started and the job is submitted again from its
latest retained checkpoint (``flink run -s``), by a new client process with another ``PYTHONHASHSEED``. That
client computes the agent's fingerprints anew (TaskManagers only unpickle them), and the restore compares
them with those journaled by the first submission for every record it reuses. The second submission is also
a deploy that adds an action (``audit``) and runs ``fingerprint_policy="re-execute"``: fingerprints that depend
on the hash seed, or on the agent's other actions (as through 0.5.1), would run completed actions again, the
external ``sender`` among them; with canonical, per-action ones it reuses the journaled actions, runs only
the new one, and commits exactly the failure-free outputs (then the test cancels it).
"""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter
from pathlib import Path

import pytest

from flink_agents_replay.local.processes import pid_alive
from flink_agents_replay.testing.committed import CommittedReader
from flink_agents_replay.testing.committed import poll_until as wait_until
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import (
    canonical_output,
    failure_free_outputs,
    job_script,
    make_inputs,
    produce_inputs,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOB = Path(__file__).resolve().parents[1] / "jobs" / "fingerprint_failover_job.py"
SIGNING_KEY = "fingerprint-failover-signing-key"
#: PYTHONHASHSEED of the first submission (and TaskManager) and of the second; the test checks that the two
#: iterate the action's set constant in different orders.
SEEDS = ("1", "2")
_REPLAYED = re.compile(r"recovered journal fully replayed; so far actions executed (\d+), reused (\d+)")
_RUN_KEY = re.compile(r"(key-\d+)\|(\d+)\|")


def _row(value: bytes) -> tuple:
    return tuple(json.loads(value))


def repeated_actions_per_key(calls: dict[str, int]) -> dict[str, set[tuple[int, str]]]:
    """For each key, the (seq, tool) of the calls that ran more than once (one call per action)."""
    repeated: dict[str, set[tuple[int, str]]] = {}
    for name, count in calls.items():
        if count > 1:
            _, tool, argument = name.split(":", 2)
            key, seq = _RUN_KEY.search(argument).groups()
            repeated.setdefault(key, set()).add((int(seq), tool))
    return repeated


def test_a_job_resubmitted_from_its_checkpoint_by_another_process_passes_the_fail_policy(
        kafka_bootstrap, new_topic, flink_cluster, tmp_path, operator_log, monkeypatch):
    inputs = make_inputs(keys=4, per_key=16)
    total_calls = 2 * len(inputs)
    with job_script(JOB) as job:
        reference_agent = job.routing_agent(InvocationCounter(tmp_path / "reference.db"))
        expected = Counter(canonical_output(output) for output in failure_free_outputs(reference_agent, inputs))
    input_topic = produce_inputs(kafka_bootstrap, inputs)
    output_topic = new_topic(prefix="flink-out")
    counter = InvocationCounter(tmp_path / "calls.db")
    reports = [tmp_path / "client-1.json", tmp_path / "client-2.json"]
    shared = ["--bootstrap-servers", kafka_bootstrap, "--input-topic", input_topic, "--output-topic", output_topic,
              "--journal-topic", f"journal-{uuid.uuid4().hex[:8]}", "--counter-path", str(counter.path),
              "--transactional-id-prefix", f"fingerprint-failover-{uuid.uuid4().hex[:8]}",
              "--signing-key", SIGNING_KEY]

    # The first TaskManager and the first client process run with one hash seed.
    monkeypatch.setenv("PYTHONHASHSEED", SEEDS[0])
    cluster = flink_cluster(taskmanagers=1)
    cluster.start()
    # Checkpoints 2 s apart, so the kill below can come well after the latest one.
    first = cluster.submit_python_job(JOB, *shared, "--report", str(reports[0]), "--call-delay-s", "0.4",
                                      "--checkpoint-interval-ms", "2000")

    def checkpoints(job_id: str) -> dict:
        return cluster.rest_get(f"/jobs/{job_id}/checkpoints")

    # Kill once a checkpoint completed, a quarter of the calls ran, and since that checkpoint's completion every
    # key started two more calls: each finished an action after the checkpoint, so the restore must reuse it
    # (a kill just after a barrier, with no action finished since, would leave nothing to reuse).
    wait_until(lambda: checkpoints(first)["counts"]["completed"] >= 1 and counter.count("calls") >= total_calls // 4,
               120, lambda: f"calls {counter.count('calls')}; {cluster.job_diagnostics(first)}")
    tries = []
    for _ in range(20):  # until no checkpoint completed while the 8 calls started (2 s apart, they take ~0.8 s)
        latest, calls_after_it = checkpoints(first)["latest"]["completed"]["id"], counter.count("calls")
        wait_until(lambda wanted=calls_after_it + 8: counter.count("calls") >= wanted, 60,
                   lambda: cluster.job_diagnostics(first))
        tries.append((latest, calls_after_it, checkpoints(first)["latest"]["completed"]["id"]))
        if tries[-1][2] == latest:
            break
    [(victim, victim_pid)] = cluster.taskmanager_processes().items()
    calls_at_kill = counter.count("calls")
    assert cluster.kill_taskmanager(resource_id=victim) == victim_pid and not pid_alive(victim_pid)
    assert calls_at_kill < total_calls, "the job finished its work before the kill: slow its calls down"
    wait_until(lambda: cluster.job_status(first) == "FAILED", 120, lambda: cluster.job_diagnostics(first))
    checkpoint = checkpoints(first)["latest"]["completed"]["external_path"]
    # The fault hit where intended only if the restore uses that checkpoint.
    assert checkpoints(first)["latest"]["completed"]["id"] == latest, (
        f"a checkpoint completed just before the kill; (latest, calls, latest after 8 more calls): {tries}")

    # A new TaskManager process and a new client process, with another hash seed.
    monkeypatch.setenv("PYTHONHASHSEED", SEEDS[1])
    replacement = cluster.start_taskmanager()
    submitted = cluster.flink_command("run", "-d", "-s", checkpoint, "-py", str(JOB), *shared,
                                      "--report", str(reports[1]), "--call-delay-s", "0.05", "--audit",
                                      "--fingerprint-policy", "re-execute", check=True)
    second = re.search(r"JobID\s+([0-9a-f]{32})", submitted.stdout + submitted.stderr).group(1)
    reader = CommittedReader(kafka_bootstrap, output_topic, decode=_row)
    try:
        # Until every expected output is committed, or the job fails (as it does on a fingerprint mismatch).
        ended = ("FAILED", "CANCELED", "FINISHED")
        wait_until(lambda: cluster.job_status(second) in ended or set(reader.poll()) >= set(expected), 180,
                   lambda: f"{len(set(reader.rows) & set(expected))} of {len(expected)} outputs committed; "
                           f"{cluster.job_diagnostics(second)}")
        second_status = cluster.job_status(second)
        if second_status == "RUNNING":
            # One more completed checkpoint commits anything still pending, duplicates included; then read on.
            last = checkpoints(second)["counts"]["completed"]
            wait_until(lambda: checkpoints(second)["counts"]["completed"] > last, 60,
                       lambda: cluster.job_diagnostics(second))
            rows = reader.read_to_committed_end()
    finally:
        reader.close()

    # The two client processes really iterated the set constant in different orders.
    client = [json.loads(report.read_text()) for report in reports]
    assert [c["hash_seed"] for c in client] == list(SEEDS)
    assert client[0]["set_order"] != client[1]["set_order"], client

    assert second_status == "RUNNING", (
        f"fingerprints {client[0]['fingerprints']} then {client[1]['fingerprints']}; "
        f"{cluster.job_diagnostics(second)}")
    cluster.cancel_job(second)
    assert client[1]["fingerprints"].pop("audit") and client[0]["fingerprints"] == client[1]["fingerprints"]
    assert Counter(rows) == expected
    # So did the two TaskManager processes (the new one made the calls left after the restore).
    taskmanager_orders = {int(pid): order for pid, order in (
        name.split(":", 2)[1:] for name in counter.counts() if name.startswith("set-order:"))}
    assert taskmanager_orders.keys() == {victim_pid, replacement.pid}, taskmanager_orders
    assert taskmanager_orders[victim_pid] != taskmanager_orders[replacement.pid], taskmanager_orders

    # The restore compared fingerprints: it read journaled records and reused completed actions.
    log = operator_log()
    restored = [line for line in log if " restored: " in line]
    replayed = [tuple(map(int, match.groups())) for line in log if (match := _REPLAYED.search(line))]
    assert len(restored) == 1 and "read 0 journal records" not in restored[0], restored
    assert replayed and replayed[-1][1] > 0, f"no action reused after the restore: {replayed}"
    calls = {name: n for name, n in counter.counts().items() if name.startswith("call:")}
    audits = {name: n for name, n in counter.counts().items() if name.startswith("audit:")}
    assert audits and max(audits.values()) == 1, f"the added action ran {audits}"
    assert len(calls) == total_calls
    repeated = repeated_actions_per_key(calls)
    assert all(len(actions) == 1 for actions in repeated.values()), f"completed actions ran again: {repeated}"
    assert max(calls.values()) <= 2
    print(f"\nfingerprint failover: killed {victim} (pid {victim_pid}) after {calls_at_kill}/{total_calls} calls; "
          f"restored {checkpoint}: {restored[0].split(' restored: ')[1]}; actions executed/reused after the "
          f"restore {replayed[-1]}; calls made again: {sum(n - 1 for n in calls.values())}")
