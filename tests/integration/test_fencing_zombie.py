"""A TaskManager paused until Flink declares it lost, then resumed: its late journal records are fenced.

Issue #13, part 2. A network partition or a stalled process leaves an earlier attempt alive after Flink
restored its subtasks elsewhere: the zombie finishes the calls it had under way and delivers their journal
records *after* the new attempt read its partitions and wrote its attempt markers (journal/fencing.py).

Set-up: a local standalone cluster with two TaskManagers whose heartbeat timeout is a few seconds, the job of
``tests/jobs/fencing_job.py`` (parallelism 1, six slow journaled calls per input, a checkpoint every 10 s
with a min-pause of 10 s, exactly-once Kafka outputs), 60 inputs over 6 keys.

1. Once a checkpoint completed and calls are under way, the TaskManager running the job gets SIGSTOP.
2. Flink declares it lost and restores the job on the other TaskManager (attempt 2, its markers written).
3. SIGCONT: the zombie's calls return (marked ``[zombie]`` by the tools) and their records reach the journal
   after attempt 2's markers. A journal inspection, written independently of the package's reader, finds
   them: the fault hit.
4. Before attempt 2 completes a checkpoint, its TaskManager is SIGKILLed; a third TaskManager is started and
   attempt 3 restores the checkpoint of step 1, whose range holds the zombie's records: its log says how
   many it ignored.

Also (issue 36): a call the zombie *begins* after its resumption is counted (``zombie-call``, the job's tools); it
makes no new ``external`` call (``sender``), whatever the timing.

Checked: the committed outputs (``read_committed``) equal the failure-free reference, each exactly once
(memory included: outputs carry the key's history), so no ``[zombie]`` result was reused; every logical call
ran, none more than once per fault that caught it; the zombie really returned calls after resuming.
"""

from __future__ import annotations

import json
import os
import re
import signal
import uuid
from collections import Counter
from pathlib import Path

import pytest

from flink_agents_replay.core.errors import JournalError
from flink_agents_replay.local.flink_cluster import LocalFlinkCluster
from flink_agents_replay.local.processes import pid_alive
from flink_agents_replay.storage.journal.kafka_store import KafkaJournalStore
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import parse_journal_key
from flink_agents_replay.testing.committed import CommittedReader, poll_until
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import (
    canonical_output,
    failure_free_outputs,
    job_script,
    make_inputs,
    produce_inputs,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOB = Path(__file__).resolve().parents[1] / "jobs" / "fencing_job.py"
SIGNING_KEY = "fencing-zombie-signing-key-0123"
PRODUCER = "flink-agents-replay/fenced"  # the operator's uid for the job's agent name
KEYS, PER_KEY = 6, 10
MAX_PARALLELISM = 128
#: Flink declares a silent TaskManager lost after this (the template's 30 s would make the test slow).
HEARTBEAT_TIMEOUT_MS = 6000
_IGNORED = re.compile(r"subtask \d+: (\d+) records of an earlier attempt ignored")


@pytest.fixture
def cluster(tmp_path_factory):
    made = LocalFlinkCluster(tmp_path_factory.mktemp("flink-cluster"), taskmanagers=2,
                             heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS)
    yield made
    for pid in made.taskmanager_processes().values():
        os.kill(pid, signal.SIGCONT)  # a paused process would not see the SIGTERM of stop()
    pids = made._live_recorded_pids()
    made.stop()
    assert not [pid for pid in pids if pid_alive(pid)], "processes of the cluster survived stop()"


def late_records(bootstrap: str, topic: str) -> dict[int, int]:
    """Per partition, the records an older attempt wrote after a newer attempt's marker, read independently:
    a marker (attempt record with ``fences``) at offset m gives the fence m + 1, every other record carries
    its writer's fence in header ``att``."""
    store = KafkaJournalStore({"bootstrap.servers": bootstrap}, topic, MAX_PARALLELISM, create_topic=False)
    codec = RecordCodec(SIGNING_KEY.encode(), PRODUCER)
    fence: dict[int, int] = {}
    late: Counter = Counter()
    try:
        partitions = range(MAX_PARALLELISM)
        start, end = store.start_offsets(partitions), store.end_offsets(partitions)
        try:
            stored_records = list(store.read(start, end))
        except JournalError as error:
            if "Offset out of range" not in str(error):
                raise
            return {}  # the running job pruned below the start read a moment ago: the caller polls again
        for stored in stored_records:
            if parse_journal_key(stored.key)[3] == "_attempt":
                marker = codec.decode(stored.key, stored.value, topic=topic, partition=stored.partition)
                if marker.payload.get("fences"):
                    fence[stored.partition] = stored.offset + 1
            elif RecordCodec.peek_header(stored.value).get("att", 0) < fence.get(stored.partition, 0):
                late[stored.partition] += 1
    finally:
        store.close()
    return dict(late)


def calls_of(counter: InvocationCounter, prefix: str) -> dict[str, int]:
    return {name.split(":", 1)[1]: n for name, n in counter.counts().items() if name.startswith(prefix + ":")}


def test_a_zombie_taskmanager_resumed_after_its_restore_elsewhere_is_fenced(
        kafka_bootstrap, new_topic, cluster, tmp_path, operator_log):
    inputs = make_inputs(keys=KEYS, per_key=PER_KEY)
    with job_script(JOB) as job:
        reference_counter = InvocationCounter(tmp_path / "reference.db")
        expected = Counter(canonical_output(o) for o in failure_free_outputs(job.fencing_agent(reference_counter),
                                                                             inputs))
        paused_flag, resumed_flag = job.paused_flag, job.resumed_flag
    reference_calls = set(calls_of(reference_counter, "call"))
    input_topic = produce_inputs(kafka_bootstrap, inputs)
    output_topic, journal_topic = new_topic(prefix="flink-out"), f"journal-{uuid.uuid4().hex[:8]}"
    counter = InvocationCounter(tmp_path / "calls.db")
    cluster.start()
    job_id = cluster.submit_python_job(
        JOB, "--bootstrap-servers", kafka_bootstrap, "--input-topic", input_topic, "--output-topic", output_topic,
        "--journal-topic", journal_topic, "--counter-path", str(counter.path), "--signing-key", SIGNING_KEY)

    def completed_checkpoints() -> int:
        return cluster.rest_get(f"/jobs/{job_id}/checkpoints")["counts"]["completed"]

    def under_way() -> int:
        begun, done = calls_of(counter, "call"), calls_of(counter, "done")
        return sum(n - done.get(name, 0) for name, n in begun.items())

    # 1. Pause the TaskManager running the job once a checkpoint completed, with calls under way.
    poll_until(lambda: completed_checkpoints() >= 1 and len(calls_of(counter, "call")) >= 60 and under_way() > 0,
               120, lambda: f"{len(calls_of(counter, 'call'))} calls; {cluster.job_diagnostics(job_id)}")
    [victim] = cluster.job_taskmanagers(job_id)
    victim_pid = cluster.taskmanager_processes()[victim]
    paused_flag(counter.path, victim_pid).touch()
    os.kill(victim_pid, signal.SIGSTOP)
    checkpoints_at_pause, calls_at_pause = completed_checkpoints(), len(calls_of(counter, "call"))
    try:
        # 2. Flink declares it lost and restores the job on the other TaskManager: attempt 2 wrote its markers.
        poll_until(lambda: any(" restored: " in line for line in operator_log()), 120,
                   lambda: f"no restore after the pause; {cluster.job_diagnostics(job_id)}")
        assert pid_alive(victim_pid), "the paused TaskManager must live on"
        [restored_on] = poll_until(lambda: [tm for tm in cluster.job_taskmanagers(job_id) if tm != victim], 60,
                                   lambda: cluster.job_diagnostics(job_id))
    finally:
        resumed_flag(counter.path, victim_pid).touch()  # while it is still paused: what it begins now is new
        os.kill(victim_pid, signal.SIGCONT)  # 3. the zombie resumes

    # The zombie's calls return after its resumption and their records land after attempt 2's markers.
    late_at_kill = poll_until(lambda: late_records(kafka_bootstrap, journal_topic), 60,
                              lambda: f"no late record; zombie returns {calls_of(counter, 'zombie-return')}")
    assert completed_checkpoints() == checkpoints_at_pause, (
        "attempt 2 completed a checkpoint before the kill: the later restore would not read the zombie's records")

    # 4. Kill attempt 2's TaskManager; a third one runs attempt 3, which restores the checkpoint of step 1. The
    # zombie has delivered; it goes first, so that attempt 3 cannot run in its process (whose calls the tools
    # mark as a zombie's).
    cluster.kill_taskmanager(resource_id=victim)
    cluster.kill_taskmanager(resource_id=restored_on)
    cluster.start_taskmanager()
    reader = CommittedReader(kafka_bootstrap, output_topic, decode=lambda value: tuple(json.loads(value)))
    try:
        poll_until(lambda: len(reader.poll()) >= len(expected) or cluster.job_status(job_id) in ("FAILED", "CANCELED"),
                   240, lambda: f"{len(reader.rows)} of {len(expected)} outputs; {cluster.job_diagnostics(job_id)}")
        assert cluster.job_status(job_id) == "RUNNING", cluster.job_diagnostics(job_id)
        last = completed_checkpoints()
        poll_until(lambda: completed_checkpoints() > last, 60, lambda: cluster.job_diagnostics(job_id))
        rows = reader.read_to_committed_end()
    finally:
        reader.close()
    cluster.cancel_job(job_id)

    log = operator_log()
    ignored = [int(match.group(1)) for line in log if (match := _IGNORED.search(line))]
    restores = [line for line in log if " restored: " in line]
    zombie_returns = calls_of(counter, "zombie-return")
    zombie_calls = calls_of(counter, "zombie-call")
    zombie_call_ms = sorted(calls_of(counter, "zombie-call-ms"), key=lambda name: int(name.rsplit(":", 1)[1]))
    summary = (f"paused {victim} (pid {victim_pid}) at {calls_at_pause} calls; restored on {restored_on}; zombie "
               f"returned {len(zombie_returns)} calls; {sum(late_at_kill.values())} late records at the kill; "
               f"ignored per restore {ignored}; restores {len(restores)}; new calls of the zombie {zombie_calls}, "
               f"begun (tool:ms after the resumption) {zombie_call_ms}")
    print("\n" + summary)

    # The fault hit: the zombie returned calls after resuming, and delivered records after attempt 2's marker.
    assert zombie_returns and sum(late_at_kill.values()) > 0, summary
    # The later restore read them and ignored them (all of them are in its range: the zombie wrote after step 1;
    # more may have landed before the kill). Later checkpoints pruned them.
    assert len(restores) == 2 and len(ignored) == 1 and ignored[0] >= sum(late_at_kill.values()), summary
    # Issue 36: the zombie made no new external call after it resumed (the fence topic refuses it; its task-stop
    # signal stops its runs at their next call, action or run, usually before any call at all).
    assert not [name for name in zombie_calls if name.startswith("sender:")], summary
    # Outputs: each exactly once, equal to the failure-free run (no [zombie] result reused; memory in history).
    assert not [row for row in rows if "[zombie]" in row[2]], summary
    assert Counter(rows) == expected, summary
    # Calls: every logical call ran; none more than once per fault that caught it (pause, kill). The zombie also
    # went on with what its marked results fed (arguments holding "[zombie]"): calls fencing cannot stop.
    begun = {name: n for name, n in calls_of(counter, "call").items() if "[zombie]" not in name}
    assert set(begun) == reference_calls
    assert max(begun.values()) <= 3, {name: n for name, n in begun.items() if n > 3}
