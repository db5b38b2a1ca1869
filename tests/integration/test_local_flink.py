"""A local standalone Flink session cluster (pyflink's bin/ scripts) running the agent job with ``flink run -py``.

1. Lifecycle: start, status, REST API, a TaskManager added, stop, and no process left.
2. A TaskManager killed with SIGKILL mid-stream: Flink restores the job on the other TaskManager from the
   latest checkpoint; the committed outputs equal a failure-free reference computed by construction, every
   logical call ran, and only calls of the actions the kill interrupted ran a second time (docs/design.md §1).
   Then a second thread-mode job runs on the TaskManager that ran the first (docs/design.md §12: pemja problem,
   which the cluster's FLINK_LIB_DIR and parent-first ``pemja.`` fix).
"""

from __future__ import annotations

import json
import re
import socket
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from flink_agents_replay.local.errors import LocalServiceError
from flink_agents_replay.local.flink_cluster import SLOTS_PER_TASKMANAGER, LocalFlinkCluster
from flink_agents_replay.local.processes import pid_alive
from flink_agents_replay.testing.agents import chain_agent, logical_call_counts
from flink_agents_replay.testing.committed import CommittedReader
from flink_agents_replay.testing.committed import poll_until as wait_until
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import canonical_output, failure_free_outputs, make_inputs, produce_inputs

pytestmark = pytest.mark.integration

JOB = Path(__file__).resolve().parents[1] / "jobs" / "agent_failover_job.py"
SIGNING_KEY = "test-signing-key-0123456789"
#: The chain agent's tools in call order; consecutive pairs are its three actions' calls.
CHAIN_TOOLS = ("classifier", "lookup", "writer", "checker", "sender", "archiver")
CALLS_PER_ACTION = 2
CALLS_PER_INPUT = len(CHAIN_TOOLS)


# -- helpers -------------------------------------------------------------------------------------------
def reference(inputs: list[dict], path: Path) -> tuple[Counter, dict[str, int]]:
    """The failure-free outputs and logical calls, by construction: each key's inputs run in topic order."""
    counter = InvocationCounter(path)
    outputs = failure_free_outputs(chain_agent(counter), inputs)
    return Counter(canonical_output(output) for output in outputs), logical_call_counts(counter)


def check_repeats_confined_to_interrupted_actions(calls: dict[str, int]) -> list[str]:
    """Check docs/design.md §1 and the group commit rule after one SIGKILL; return the logical calls that ran twice.

    A call whose record was acknowledged never runs again. With the default ``per_run`` durability a run
    waits for no acknowledgement except before an external call (``sender``), whose acknowledged *started*
    record also covers every earlier record of its partition. So what a kill can make run again, per key, is
    the tail of the one run in progress: consecutive calls from the first one whose record was still
    travelling, never a call before a ``sender`` that had started (a ``sender`` in doubt, started and never
    reported back, is made again by the default policy), and each exactly twice.
    """
    interrupted: dict[str, dict[int, set[int]]] = {}
    for name, count in calls.items():
        if count > 1:
            assert count == 2, f"{name} ran {count} times after a single failure"
            key, seq, position = _call_position(name)
            interrupted.setdefault(key, {}).setdefault(seq, set()).add(position)
    spread = {key: sorted(runs) for key, runs in interrupted.items() if len(runs) > 1}
    assert spread == {}, f"calls of more than one run of a key ran again (key: [seq...]): {spread}"
    sender = CHAIN_TOOLS.index("sender")
    for key, runs in interrupted.items():
        [(seq, positions)] = runs.items()
        assert positions == set(range(min(positions), max(positions) + 1)), (
            f"{key} seq {seq}: repeated calls {sorted(positions)} are not one tail of the run")
        assert max(positions) < sender or min(positions) >= sender, (
            f"{key} seq {seq}: calls before a started sender ran again {sorted(positions)}")
    return sorted(name for name, count in calls.items() if count > 1)


def _call_position(name: str) -> tuple[str, int, int]:
    """(key, seq, position in the run) of a chain agent's logical call ``call:<tool>:<argument>``."""
    _, tool, argument = name.split(":", 2)
    match = re.search(r"(key-\d+)\|(\d+)\|", argument)  # every argument nests "<key>|<seq>|<input>"
    assert match, f"unexpected call name {name}"
    return match.group(1), int(match.group(2)), CHAIN_TOOLS.index(tool)


def _row(value: bytes) -> tuple:
    return tuple(json.loads(value))


def job_args(bootstrap: str, input_topic: str, output_topic: str, counter_path: Path, *extra: str,
             journal_topic: str | None = None) -> list[str]:
    journal_topic = journal_topic or f"journal-{uuid.uuid4().hex[:8]}"
    return ["--bootstrap-servers", bootstrap, "--input-topic", input_topic, "--output-topic", output_topic,
            "--journal-topic", journal_topic, "--counter-path", str(counter_path),
            "--signing-key", SIGNING_KEY, "--parallelism", "2", "--checkpoint-interval-ms", "500", *extra]


def run_bounded_job(cluster: LocalFlinkCluster, bootstrap: str, input_topic: str, output_topic: str,
                    counter_path: Path, on: set[str]) -> tuple[list[tuple], dict[str, int], tuple[float, float]]:
    """Submit the job on a bounded input without restarts; return its committed outputs, calls and timings."""
    counter = InvocationCounter(counter_path)
    begun = time.monotonic()
    job_id = cluster.submit_python_job(JOB, *job_args(bootstrap, input_topic, output_topic, counter_path,
                                                       "--bounded", "--restart-attempts", "0"))
    submitted_s = time.monotonic() - begun
    wait_until(lambda: cluster.job_status(job_id) in ("FINISHED", "FAILED", "CANCELED"), 120,
               lambda: cluster.job_diagnostics(job_id))
    assert cluster.job_status(job_id) == "FINISHED", cluster.job_diagnostics(job_id)
    assert set(cluster.job_taskmanagers(job_id)) == on
    reader = CommittedReader(bootstrap, output_topic, decode=_row)
    try:
        rows = reader.read_to_committed_end()
    finally:
        reader.close()
    return rows, logical_call_counts(counter), (round(submitted_s, 1), round(time.monotonic() - begun, 1))


#: The operator's counters of work taken from the journal instead of done (docs/design.md §1).
REUSE_COUNTERS = ("actions_reused", "calls_reused", "calls_reused_out_of_order", "child_calls_reused")


def run_until_committed(cluster: LocalFlinkCluster, args: list[str], expected: Counter, calls: int,
                        read: CommittedReader) -> tuple[str, list[tuple], dict[str, float]]:
    """Submit the unbounded job, wait until ``expected`` is committed and its ``calls`` counted in the operator's
    metrics; return its id, the committed rows and its reuse counters, and cancel it."""
    job_id = cluster.submit_python_job(JOB, *args)
    wait_until(lambda: Counter(read.poll()) == expected, 120, lambda: cluster.job_diagnostics(job_id))

    def final_metrics() -> dict[str, dict[str, float]] | None:  # the REST API answers from a 1 s old fetch
        metrics = cluster.operator_metrics(job_id, "flink_agents_replay", ("calls_executed", *REUSE_COUNTERS))
        counts = {name: metrics.get(name, {}).get("sum", 0) for name in metrics}
        reused = any(counts.get(name) for name in REUSE_COUNTERS)  # a failure already: report it now
        return metrics if counts.get("calls_executed", 0) >= calls or reused else None

    metrics = wait_until(final_metrics, 60, lambda: f"{calls} calls counted; {cluster.job_diagnostics(job_id)}")
    cluster.cancel_job(job_id)
    return job_id, read.read_to_committed_end(), {name: metrics.get(name, {}).get("sum") for name in REUSE_COUNTERS}


# -- tests ---------------------------------------------------------------------------------------------
def test_start_names_a_taken_port_and_a_missing_java(tmp_path, monkeypatch):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = listener.getsockname()[1]
        cluster = LocalFlinkCluster(tmp_path / "taken", rest_port=taken)
        with pytest.raises(LocalServiceError, match=rf"REST port {taken} on 127.0.0.1 is already in use.*--rest-port"):
            cluster.start()
        assert not cluster.status().running and not (tmp_path / "taken" / "cluster.json").exists()

    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no java here
    with pytest.raises(LocalServiceError, match="'java' is not on PATH: install a Java 17 runtime"):
        LocalFlinkCluster(tmp_path / "nojava").start()


def test_lifecycle_start_status_rest_add_taskmanager_stop_leaves_no_process(flink_cluster):
    cluster = flink_cluster(taskmanagers=1)
    assert not cluster.status().running

    begun = time.monotonic()
    status = cluster.start()
    started_s = time.monotonic() - begun
    assert status.running and status.registered_taskmanagers == 1 and status.slots_total == SLOTS_PER_TASKMANAGER
    assert list(status.taskmanager_pids) == ["tm-1"]
    assert pid_alive(status.jobmanager_pid) and pid_alive(status.taskmanager_pids["tm-1"])
    assert status.rest_url == cluster.rest_url and "running" in status.describe()
    assert cluster.rest_get("/overview")["flink-version"].startswith("2.")
    config = {entry["key"]: entry["value"] for entry in cluster.rest_get("/jobmanager/config")}
    assert config["python.execution-mode"] == "thread"
    assert config["classloader.parent-first-patterns.additional"] == "pemja."
    assert config["state.savepoints.dir"] == cluster.savepoints_dir.as_uri()
    assert config["execution.checkpointing.dir"] == cluster.checkpoints_dir.as_uri()
    assert any(link.name.startswith("flink-python-") for link in cluster.lib_dir.iterdir())
    assert cluster.start().jobmanager_pid == status.jobmanager_pid, "a second start() must reuse the cluster"
    listed = cluster.flink_command("list", check=True)
    assert "No running jobs" in listed.stdout, listed.stdout

    begun = time.monotonic()
    added = cluster.start_taskmanager()
    added_s = time.monotonic() - begun
    assert added.resource_id == "tm-2" and pid_alive(added.pid)
    status = cluster.status()
    assert status.registered_taskmanagers == 2 and status.slots_total == 2 * SLOTS_PER_TASKMANAGER
    assert set(status.taskmanager_pids) == {"tm-1", "tm-2"}

    pids = [status.jobmanager_pid, *status.taskmanager_pids.values()]
    rest_port = int(status.rest_url.rsplit(":", 1)[1])
    begun = time.monotonic()
    assert cluster.stop() is True
    stopped_s = time.monotonic() - begun
    assert [pid for pid in pids if pid_alive(pid)] == []
    assert not cluster.status().running
    assert not list(cluster.pid_dir.glob("*.pid"))
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", rest_port), timeout=5).close()
    assert cluster.stop() is False
    print(f"\nlocal Flink: start {started_s:.1f} s, TaskManager added in {added_s:.1f} s, stop {stopped_s:.1f} s")


def test_a_shared_cluster_leaks_nothing_between_jobs_of_one_agent_keys_and_journal(
        kafka_bootstrap, new_topic, flink_cluster, tmp_path, operator_log):
    """Two jobs back to back on one TaskManager (one JVM, one embedded Python: thread mode), with the same agent
    name, keys, inputs and journal topic, different job ids. The first is cancelled with runs in flight, so
    the journal holds its records of the very keys and seqs the second runs: the second reuses none of them
    (its reuse counters are 0) and outputs what a fresh run does. What a session-scoped test cluster needs."""
    inputs = make_inputs(keys=4, per_key=5)
    expected, expected_calls = reference(inputs, tmp_path / "reference.db")
    input_topic, journal_topic = produce_inputs(kafka_bootstrap, inputs), f"journal-{uuid.uuid4().hex[:8]}"
    cluster = flink_cluster(taskmanagers=1)
    cluster.start()
    [(taskmanager, pid)] = cluster.taskmanager_processes().items()

    first = InvocationCounter(tmp_path / "calls-1.db")
    first_id = cluster.submit_python_job(JOB, *job_args(
        kafka_bootstrap, input_topic, new_topic(1, "flink-out"), first.path, "--call-delay-s", "0.3",
        journal_topic=journal_topic))
    wait_until(lambda: cluster.rest_get(f"/jobs/{first_id}/checkpoints")["counts"]["completed"] >= 1
               and first.count("calls") >= len(inputs) * CALLS_PER_INPUT // 4, 120,
               lambda: cluster.job_diagnostics(first_id), interval_s=0.05)
    cluster.cancel_job(first_id)
    assert first.count("calls") < len(inputs) * CALLS_PER_INPUT, "the first job finished: cancel it sooner"

    second = InvocationCounter(tmp_path / "calls-2.db")
    args = job_args(kafka_bootstrap, input_topic, new_topic(1, "flink-out"), second.path,
                    journal_topic=journal_topic)
    log = operator_log()
    with CommittedReader(kafka_bootstrap, args[args.index("--output-topic") + 1], decode=_row) as read:
        second_id, rows, reused = run_until_committed(cluster, args, expected, sum(expected_calls.values()), read)
    assert second_id != first_id
    assert reused == dict.fromkeys(REUSE_COUNTERS, 0.0), f"the second job reused work: {reused}"
    # The fault hit: the second job found the first one's records in the journal, and left them.
    starts = [line for line in operator_log()[len(log):] if f"job {second_id}" in line]
    left = [int(found.group(1)) for line in starts
            if (found := re.search(r"fresh start of job .*; (\d+) records of earlier jobs are not reused", line))]
    assert len(left) == 2 and sum(left) > 0, starts
    assert Counter(rows) == expected
    assert logical_call_counts(second) == expected_calls
    assert cluster.taskmanager_processes() == {taskmanager: pid}, "both jobs ran in the one TaskManager"


@pytest.mark.slow
def test_taskmanager_killed_mid_stream_repeats_no_call_and_changes_no_output(
        kafka_bootstrap, new_topic, flink_cluster, tmp_path, operator_log):
    """Two TaskManagers; the one running the job is SIGKILLed; Flink restores the job on the other.

    Then a second thread-mode job runs on that surviving TaskManager, which already ran one: without the
    cluster's pemja fix it would loop in RESTARTING (docs/design.md §12).
    """
    keys, per_key, call_delay_s = 8, 10, 0.1
    total_calls = keys * per_key * CALLS_PER_INPUT
    inputs = make_inputs(keys, per_key)
    expected, expected_calls = reference(inputs, tmp_path / "reference.db")
    input_topic = produce_inputs(kafka_bootstrap, inputs)
    output_topic = new_topic(prefix="flink-out")
    counter = InvocationCounter(tmp_path / "calls.db")

    cluster = flink_cluster(taskmanagers=2)
    begun = time.monotonic()
    cluster.start()
    started_s = time.monotonic() - begun
    begun = time.monotonic()
    job_id = cluster.submit_python_job(JOB, *job_args(kafka_bootstrap, input_topic, output_topic, counter.path,
                                                       "--call-delay-s", str(call_delay_s),
                                                       "--restart-attempts", "5"))
    submitted_s = time.monotonic() - begun

    def checkpoints() -> dict:
        return cluster.rest_get(f"/jobs/{job_id}/checkpoints")

    # Kill once calls are under way and a checkpoint holds some of the job's progress.
    wait_until(lambda: checkpoints()["counts"]["completed"] >= 1 and counter.count("calls") >= total_calls // 10,
               120, lambda: f"calls {counter.count('calls')}; {cluster.job_diagnostics(job_id)}")
    running_on = cluster.job_taskmanagers(job_id)
    victim = max(running_on, key=running_on.get)
    calls_at_kill = counter.count("calls")
    checkpoints_at_kill = checkpoints()["counts"]["completed"]
    killed_pid = cluster.kill_taskmanager(resource_id=victim)
    killed_at = time.monotonic()
    assert not pid_alive(killed_pid)
    assert calls_at_kill < total_calls, "the job finished its work before the kill: slow its calls down"

    # Flink notices the lost TaskManager, restores the latest checkpoint on the other one and runs again.
    restored = wait_until(lambda: checkpoints()["latest"]["restored"], 120,
                          lambda: f"no restore reported; {cluster.job_diagnostics(job_id)}")
    restored_s = time.monotonic() - killed_at

    [survivor] = cluster.taskmanager_processes()

    def running_again() -> bool:  # every subtask RUNNING, on the survivor (the REST API answers from a cache)
        return cluster.job_status(job_id) == "RUNNING" and all(
            t["status"] == "RUNNING" and t["taskmanager"] == survivor for t in cluster.job_subtasks(job_id))

    wait_until(running_again, 120, lambda: cluster.job_diagnostics(job_id))
    running_s = time.monotonic() - killed_at

    reader = CommittedReader(kafka_bootstrap, output_topic, decode=_row)
    try:
        wait_until(lambda: set(reader.poll()) >= set(expected), 180,
                   lambda: f"{len(set(reader.rows) & set(expected))} of {len(expected)} outputs committed, "
                           f"{counter.count('calls')} calls; {cluster.job_diagnostics(job_id)}")
        complete_s = time.monotonic() - killed_at
        # One more completed checkpoint commits anything still pending, duplicates included; then read on.
        last = checkpoints()["counts"]["completed"]
        wait_until(lambda: checkpoints()["counts"]["completed"] > last, 60, lambda: cluster.job_diagnostics(job_id))
        rows = reader.read_to_committed_end()
    finally:
        reader.close()
    cluster.cancel_job(job_id)

    assert Counter(rows) == expected
    calls = logical_call_counts(counter)
    assert calls.keys() == expected_calls.keys()
    repeated = check_repeats_confined_to_interrupted_actions(calls)
    log = operator_log()
    restores = [line for line in log if " restored: " in line]
    assert restores, "the operator did not restore its journal position from the checkpoint"
    in_doubt = sum(1 for line in log if "to 'sender' in doubt: made again" in line)
    repeated_sends = sum(1 for name in repeated if name.startswith("call:sender:"))
    assert repeated_sends <= in_doubt, "a repeated external call was not reported as in doubt"
    in_flight = sum(int(line.split("; ")[-1].split()[0]) for line in restores)
    print(f"\nlocal Flink failover: start {started_s:.1f} s, submit {submitted_s:.1f} s; killed {victim} "
          f"(pid {killed_pid}, running {running_on}) after {calls_at_kill}/{total_calls} calls and "
          f"{checkpoints_at_kill} checkpoints; restore of checkpoint {restored['id']} reported after "
          f"{restored_s:.1f} s, all tasks running after {running_s:.1f} s, all outputs committed after "
          f"{complete_s:.1f} s; runs in flight at the restored checkpoint: {in_flight}; calls interrupted by the "
          f"kill and made again: {len(repeated)} ({repeated_sends} external, {in_doubt} reported in doubt)")

    # A second thread-mode job on the surviving TaskManager (no restarts: a pemja failure fails it at once).
    wait_until(lambda: cluster.job_status(job_id) == "CANCELED", 60, lambda: cluster.job_diagnostics(job_id))
    small = make_inputs(keys=3, per_key=2)
    small_expected, small_calls = reference(small, tmp_path / "reference-small.db")
    rows, calls, took = run_bounded_job(cluster, kafka_bootstrap, produce_inputs(kafka_bootstrap, small),
                                        new_topic(1, "flink-out"), tmp_path / "calls-second.db", on={survivor})
    assert Counter(rows) == small_expected
    assert calls == small_calls
    assert survivor in cluster.taskmanager_processes(), "the TaskManager died after running two jobs"
    print(f"second job on {survivor}: submitted in {took[0]} s, finished and read in {took[1]} s")
