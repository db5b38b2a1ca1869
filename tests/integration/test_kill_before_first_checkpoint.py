"""Adversarial infrastructure faults in a job's first seconds, before any checkpoint completed.

The promise under attack (README, "Durable actions" -> "What you can rely on after a failure"): after any
failure Flink recovers from -- a TaskManager killed with SIGKILL, a restart of the same job before its first
checkpoint completed -- every journaled call and action is reused, not repeated, and the committed outputs
equal a failure-free run's, each exactly once.

Set-up, as an operator would run it: a standalone session cluster with ONE TaskManager, the job submitted
with ``flink run -py`` (``agent_failover_job.py --traced``: checkpoint interval 60 s and min-pause 60 s, so the first
checkpoint comes 60 s after the job starts; fixed-delay restarts), 60 inputs over 6 keys, 6 tool calls per
input at 0.15 s each, outputs through Flink's exactly-once ``KafkaSink``.

(a) The TaskManager running the job is SIGKILLed a few seconds in, calls under way, no checkpoint even
    triggered (checked on the REST API before and after the kill); a new TaskManager is started and Flink
    restarts the job from nothing.
(b) Then the replacement TaskManager is SIGKILLed again while the restarted attempt is recovering (it has
    re-made calls and journaled some of them); a third TaskManager finishes the job. (a) and (b) are one job.
(c) A SIGKILL the moment the first checkpoint is triggered, before it completes.

What is checked after each kill, from outside the worker:

* right after the SIGKILL (the process is gone, no replacement started yet) the invocation counter file
  (``call:`` when a tool call begins, ``done:`` when it returns) and the journal topic are snapshotted: the
  calls under way at the kill, and the calls whose result the journal held;
* a call whose result the journal held at a kill never runs again after it (the promise's core);
* a call runs at most once plus once per kill that caught it exposed (under way, or returned while its
  record was still travelling: ``per_action`` durability acknowledges call records at the action's end);
* every logical call ran, and the committed outputs (``read_committed``) equal the failure-free reference:
  none missing, none twice;
* the operator log says ``job <id> restarted before its first completed checkpoint`` after every restart
  and never treats a restart as a fresh start.

Run: ``./run tests tests/integration/test_kill_before_first_checkpoint.py -s`` (``-s`` prints a summary per
scenario). Written by an adversarial review of the restart-before-the-first-checkpoint guarantee.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from flink_agents_replay.core.events import EventTypes
from flink_agents_replay.local.processes import pid_alive
from flink_agents_replay.storage.journal.kafka_store import KafkaJournalStore
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import CallOutcome, RecordKind, key_digest, parse_journal_key
from flink_agents_replay.testing.agents import Classified, Drafted, chain_agent
from flink_agents_replay.testing.committed import CommittedReader, poll_until
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import (
    canonical_output,
    failure_free_outputs,
    make_inputs,
    produce_inputs,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOB = Path(__file__).resolve().parents[1] / "jobs" / "agent_failover_job.py"
AGENT_NAME = "chain"  # chain_agent's, as the job runs it
SIGNING_KEY = "infra-adversary-signing-key-0123"
KEYS, PER_KEY = 6, 10
CALL_DELAY_S = 0.15
CHECKPOINT_MS = 60_000
MAX_PARALLELISM = 128
SUMMARY_DIR = Path(os.environ.get("INFRA_ADVERSARY_SUMMARY_DIR", tempfile.gettempdir())) / "kill-before-checkpoint"
#: Exploration knobs (defaults are what the committed tests use): the share of all calls begun at the first
#: kill, and in (b) the calls the restarted attempt must have returned before the second kill (0: kill as soon
#: as both subtasks logged their restore, before any new call).
KILL_AT = float(os.environ.get("INFRA_ADVERSARY_KILL_AT", "0.25"))
SECOND_KILL_AFTER_DONE = int(os.environ.get("INFRA_ADVERSARY_SECOND_KILL_AFTER_DONE", "2"))


# -- the journal and the counter, seen from outside -----------------------------------------------------
CallId = tuple[str, int, str]  # (key, seq, tool): unique per logical call of the chain agent


def call_id(name: str) -> CallId:
    """``call:<tool>:<argument>`` (or ``done:...``) -> (key, seq, tool); every argument nests ``<key>|<seq>|``."""
    _, tool, argument = name.split(":", 2)
    match = re.search(r"(key-\d+)\|(\d+)\|", argument)
    assert match, f"unexpected call name {name}"
    return match.group(1), int(match.group(2)), tool


def split_counts(counts: dict[str, int]) -> tuple[dict[CallId, int], dict[CallId, int]]:
    begun = {call_id(n): c for n, c in counts.items() if n.startswith("call:")}
    done = {call_id(n): c for n, c in counts.items() if n.startswith("done:")}
    return begun, done


@dataclass
class JournalView:
    """What the journal topic held at one moment."""

    records: int = 0
    kinds: Counter = field(default_factory=Counter)
    results: set[CallId] = field(default_factory=set)  # calls with a returned/raised record
    started_only: set[CallId] = field(default_factory=set)  # external calls with a "started" record and no result
    attempts: list[dict] = field(default_factory=list)  # attempt records' payloads


def read_journal(bootstrap: str, topic: str, keys: list[str]) -> JournalView:
    """Every record of the journal topic, verified and decoded as the operator would."""
    digests = {key_digest(k): k for k in keys}
    store = KafkaJournalStore({"bootstrap.servers": bootstrap}, topic, MAX_PARALLELISM, create_topic=False)
    # The agent's own event types resolve the events its completions hold, as the operator's codec does.
    codec = RecordCodec(SIGNING_KEY.encode(), f"flink-agents-replay/{AGENT_NAME}",
                        event_types=EventTypes([Classified, Drafted]))
    view = JournalView()
    started: set[CallId] = set()
    try:
        partitions = range(MAX_PARALLELISM)
        for stored in store.read(store.start_offsets(partitions), store.end_offsets(partitions)):
            record = codec.decode(stored.key, stored.value, topic=topic, partition=stored.partition)
            view.records += 1
            view.kinds[record.kind] += 1
            if record.kind == RecordKind.ATTEMPT:
                view.attempts.append(dict(record.payload, partition=stored.partition))
            if record.kind != RecordKind.CALL:
                continue
            _, seq, _, _, digest = parse_journal_key(stored.key)
            call = record.payload
            identity = (digests[digest], call.seq, call.resource)
            assert call.seq == seq
            if call.outcome is CallOutcome.STARTED:
                started.add(identity)
            else:
                view.results.add(identity)
    finally:
        store.close()
    view.started_only = started - view.results
    return view


# -- the cluster, seen as an operator sees it ----------------------------------------------------------
def rest_post(cluster, path: str, body: dict) -> dict:
    request = urllib.request.Request(cluster.rest_url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback
        return json.loads(response.read())


def checkpoint_counts(cluster, job_id: str) -> dict:
    return cluster.rest_get(f"/jobs/{job_id}/checkpoints")["counts"]


def trigger_checkpoint(cluster, job_id: str) -> int:
    """A manual checkpoint (REST ``POST /jobs/<id>/checkpoints``), to commit the sink's transactions now
    instead of 60 s later; returns its id once completed."""
    trigger = rest_post(cluster, f"/jobs/{job_id}/checkpoints", {"checkpointType": "FULL"})["request-id"]

    def finished():
        answer = cluster.rest_get(f"/jobs/{job_id}/checkpoints/{trigger}")
        return answer if answer["status"]["id"] == "COMPLETED" else None

    answer = poll_until(finished, 120, lambda: f"checkpoint {trigger}; {cluster.job_diagnostics(job_id)}", 0.5)
    operation = answer.get("operation", {})
    assert "failure-cause" not in operation, f"manual checkpoint failed: {operation}"
    return operation.get("checkpointId", -1)


@dataclass
class Kill:
    """One SIGKILL and what the world looked like right after it."""

    victim: str
    pid: int
    after_job_start_s: float
    after_first_call_s: float
    checkpoints_before: dict
    checkpoints_after: dict
    begun: dict[CallId, int]
    done: dict[CallId, int]
    journal: JournalView
    unfinished_before: dict[CallId, int]  # executions begun and never done, as of the previous kill

    @property
    def in_flight(self) -> set[CallId]:
        """Calls under way at this kill: one more execution begun and not done than at the previous kill."""
        return {c for c, n in self.begun.items() if n - self.done.get(c, 0) > self.unfinished_before.get(c, 0)}

    @property
    def exposed(self) -> set[CallId]:
        """Calls begun whose result the journal did not hold: a restart may (must) make them again."""
        return {c for c in self.begun if c not in self.journal.results}

    @property
    def returned_unjournaled(self) -> set[CallId]:
        """Calls that had returned, but whose result record had not reached the journal at the kill."""
        return {c for c in self.exposed if self.done.get(c, 0) > 0}

    def describe(self) -> dict:
        return {"victim": self.victim, "pid": self.pid, "after_job_start_s": round(self.after_job_start_s, 2),
                "after_first_call_s": round(self.after_first_call_s, 2),
                "checkpoints_before": self.checkpoints_before, "checkpoints_after": self.checkpoints_after,
                "calls_begun": sum(self.begun.values()), "calls_done": sum(self.done.values()),
                "in_flight": sorted(map(list, self.in_flight)),
                "returned_unjournaled": sorted(map(list, self.returned_unjournaled)),
                "journal_records": self.journal.records, "journal_kinds": dict(self.journal.kinds),
                "journaled_results": len(self.journal.results),
                "attempt_records": Counter((a["attempt"], a["subtask"]) for a in self.journal.attempts).most_common()}


class Scenario:
    def __init__(self, kafka_bootstrap, new_topic, flink_cluster, tmp_path, operator_log,
                 checkpoint_ms: int = CHECKPOINT_MS):
        self.checkpoint_ms = checkpoint_ms
        self.bootstrap = kafka_bootstrap
        self.log = operator_log
        self.inputs = make_inputs(KEYS, PER_KEY)
        self.keys = sorted({record["key"] for record in self.inputs})
        reference_counter = InvocationCounter(tmp_path / "reference.db")
        outputs = failure_free_outputs(chain_agent(reference_counter, traced=True), self.inputs)
        self.expected = Counter(canonical_output(output) for output in outputs)
        self.expected_calls = set(split_counts(reference_counter.counts())[0])
        assert len(self.expected_calls) == len(self.inputs) * 6
        self.input_topic = produce_inputs(kafka_bootstrap, self.inputs)
        self.output_topic = new_topic(prefix="early-kill-out")
        self.journal_topic = f"early-kill-journal-{uuid.uuid4().hex[:8]}"
        self.counter = InvocationCounter(tmp_path / "calls.db")
        self.cluster = flink_cluster(taskmanagers=1)
        self.kills: list[Kill] = []
        self.first_call_at: float | None = None

    # -- phases ------------------------------------------------------------------------------------
    def submit(self) -> None:
        self.cluster.start()
        self.job_id = self.cluster.submit_python_job(
            JOB, "--bootstrap-servers", self.bootstrap, "--input-topic", self.input_topic,
            "--output-topic", self.output_topic, "--journal-topic", self.journal_topic,
            "--counter-path", str(self.counter.path), "--signing-key", SIGNING_KEY, "--parallelism", "2",
            "--checkpoint-interval-ms", str(self.checkpoint_ms), "--min-pause-ms", str(self.checkpoint_ms),
            "--restart-attempts", "5", "--restart-delay-ms", "1000", "--call-delay-s", str(CALL_DELAY_S),
            "--max-concurrent-runs", "16", "--transaction-timeout-ms", "300000", "--traced")
        self.job_start = self.cluster.rest_get(f"/jobs/{self.job_id}")["start-time"] / 1000
        config = self.cluster.rest_get(f"/jobs/{self.job_id}/checkpoints/config")
        assert (config["interval"], config["min_pause"]) == (self.checkpoint_ms, self.checkpoint_ms), config

    def recover_once_and_finish(self, name: str) -> None:
        """After one kill: a new TaskManager, the restart logged by both subtasks as attempt 1, the outputs and
        calls checked (:meth:`finish`) and saved under ``name``, and no restart taken for a fresh start."""
        log_mark = len(self.log())
        self.replace_taskmanager()
        poll_until(lambda: self.restarted_subtasks(log_mark, attempt=1) == {0, 1}, 180,
                   lambda: f"no restart logged by both subtasks; {self.cluster.job_diagnostics(self.job_id)}")
        summary = self.finish()
        summary["restart_log"] = sorted(set(self.restart_logged(log_mark)))
        _save(name, summary)
        fresh = [line for line in self.log()[log_mark:] if "fresh start of job" in line]
        assert fresh == [], f"a restart was taken for a fresh start: {fresh}"

    def wait_for_calls(self, condition, what: str, timeout_s: float = 120) -> None:
        def check():
            if self.first_call_at is None and self.counter.count("calls"):
                self.first_call_at = time.time()
            return condition()
        poll_until(check, timeout_s, lambda: f"{what}; calls {self.counter.count('calls')}; "
                                             f"{self.cluster.job_diagnostics(self.job_id)}", 0.02)

    def checkpoint_dirs(self) -> dict[str, bool]:
        """``chk-N`` directories of the job (created when checkpoint N is triggered) -> whether it has its
        ``_metadata`` (written when it completes)."""
        root = self.cluster.checkpoints_dir / self.job_id
        return {d.name: (d / "_metadata").exists() for d in root.glob("chk-*")} if root.is_dir() else {}

    def kill(self, *, checkpoint_triggered: bool = False) -> Kill:
        """SIGKILL the TaskManager running the job; snapshot the counter and the journal before any other starts.

        ``checkpoint_triggered``: the first checkpoint was seen triggered (its directory exists), so kill at once
        without asking the REST API first; it must not have completed either.
        """
        live = self.cluster.taskmanager_processes()
        assert len(live) == 1, live
        [victim] = live
        before = None
        if not checkpoint_triggered:
            before = checkpoint_counts(self.cluster, self.job_id)
            assert before["completed"] == 0 and before["total"] == 0, \
                f"a checkpoint was triggered before the kill: {before}"
        pid = self.cluster.kill_taskmanager(resource_id=victim)
        killed_at = time.time()
        assert not pid_alive(pid)
        counts = self.counter.counts()  # the killed process can no longer write: this is the state at the kill
        dirs_at_kill = self.checkpoint_dirs()
        # No task runs now, so no checkpoint can complete any more: once none is pending (and the REST API's
        # 1 s cache has passed), the counts are those of the moment of the kill.
        after = poll_until(lambda: time.time() - killed_at > 2 and (c := checkpoint_counts(self.cluster, self.job_id))
                           ["in_progress"] == 0 and c, 60, lambda: f"{self.cluster.job_diagnostics(self.job_id)}", 0.25)
        assert after["completed"] == 0, f"a checkpoint completed before the kill: {after}"
        assert not any(dirs_at_kill.values()), f"a checkpoint had its metadata written at the kill: {dirs_at_kill}"
        if checkpoint_triggered:
            after["directories_at_kill"] = dirs_at_kill
        time.sleep(0.5)  # records already in the dead process's socket buffers reach the broker, if they do
        begun, done = split_counts(counts)
        previous = self.kills[-1] if self.kills else None
        unfinished = {c: n - previous.done.get(c, 0) for c, n in previous.begun.items()} if previous else {}
        kill = Kill(victim, pid, killed_at - self.job_start, killed_at - (self.first_call_at or killed_at),
                    before, after, begun, done, read_journal(self.bootstrap, self.journal_topic, self.keys),
                    unfinished)
        self.kills.append(kill)
        return kill

    def replace_taskmanager(self) -> str:
        return self.cluster.start_taskmanager().resource_id

    def restart_logged(self, since: int) -> list[str]:
        return [line for line in self.log()[since:]
                if f"job {self.job_id} restarted before its first completed checkpoint" in line]

    def restarted_subtasks(self, since: int, attempt: int | None = None) -> set[int]:
        """Subtasks that logged a restart before the first checkpoint (of ``attempt``) since log line ``since``."""
        return {int(re.search(r"subtask (\d+) restored", line).group(1)) for line in self.restart_logged(since)
                if attempt is None or f"(attempt {attempt})" in line}

    def finish(self) -> dict:
        """Wait for every logical call to have returned, commit with manual checkpoints, read, check, report."""
        def all_done() -> bool:
            _, done = split_counts(self.counter.counts())
            return self.expected_calls <= set(done)

        self.wait_for_calls(all_done, "all logical calls returned", timeout_s=240)
        reader = CommittedReader(self.bootstrap, self.output_topic, decode=lambda value: tuple(json.loads(value)))
        manual = []
        try:
            deadline = time.monotonic() + 180
            while not set(reader.poll(1.0)) >= set(self.expected):
                assert time.monotonic() < deadline, (
                    f"{len(set(reader.rows) & set(self.expected))} of {len(self.expected)} outputs committed; "
                    f"{self.cluster.job_diagnostics(self.job_id)}")
                manual.append(trigger_checkpoint(self.cluster, self.job_id))
            manual.append(trigger_checkpoint(self.cluster, self.job_id))  # anything still pending, duplicates too
            rows = reader.read_to_committed_end()
        finally:
            reader.close()
        self.cluster.cancel_job(self.job_id)

        got = Counter(rows)
        duplicates = {row: n - 1 for row, n in got.items() if n > 1 and row in self.expected}
        missing = set(self.expected) - set(got)
        unexpected = set(got) - set(self.expected)
        begun, _ = split_counts(self.counter.counts())
        repeated = {c: n for c, n in begun.items() if n > 1}
        # A call whose result the journal held at kill k must not run after kill k.
        reran_after_journaled = {
            c: (k, kill.begun.get(c, 0), begun[c]) for k, kill in enumerate(self.kills, 1)
            for c in kill.journal.results if begun.get(c, 0) > kill.begun.get(c, 0)}
        # Each run beyond the first needs a kill that caught the call exposed.
        allowed = {c: 1 + sum(c in kill.exposed for kill in self.kills) for c in begun}
        over = {c: (n, allowed[c]) for c, n in begun.items() if n > allowed[c]}
        in_flight_any = set().union(*(kill.in_flight for kill in self.kills))
        summary = {
            "job_id": self.job_id, "inputs": len(self.inputs), "expected_outputs": sum(self.expected.values()),
            "committed_rows": len(rows), "distinct_committed": len(got), "duplicates": sum(duplicates.values()),
            "missing": len(missing), "unexpected": len(unexpected), "logical_calls": len(self.expected_calls),
            "real_invocations": sum(begun.values()),
            "repeated_calls": {":".join(map(str, c)): n for c, n in sorted(repeated.items())},
            "repeated_in_flight_at_a_kill": sum(1 for c in repeated if c in in_flight_any),
            "repeated_returned_unjournaled": sum(1 for c in repeated if c not in in_flight_any),
            "journaled_then_rerun": {":".join(map(str, c)): v for c, v in reran_after_journaled.items()},
            "over_allowance": {":".join(map(str, c)): v for c, v in over.items()},
            "manual_checkpoints": manual, "kills": [kill.describe() for kill in self.kills],
            "failovers": [entry["stacktrace"].splitlines()[0][:200] for entry in self.cluster.rest_get(
                f"/jobs/{self.job_id}/exceptions").get("exceptionHistory", {}).get("entries", [])],
        }
        self.summary = summary
        # -- the promise ---------------------------------------------------------------------------------
        assert missing == set() and duplicates == {} and unexpected == set(), (
            f"committed outputs differ from the failure-free run: missing {sorted(missing)[:5]}, "
            f"duplicates {sorted(duplicates.items())[:5]}, unexpected {sorted(unexpected)[:5]}")
        assert got == self.expected
        assert set(begun) == self.expected_calls, "a logical call never ran, or an unexpected one did"
        assert reran_after_journaled == {}, f"journaled calls ran again (kill, runs at kill, runs in all): " \
                                            f"{reran_after_journaled}"
        assert over == {}, f"calls ran more often than the kills that caught them exposed allow: {over}"
        return summary


def _save(name: str, summary: dict) -> None:
    SUMMARY_DIR.mkdir(parents=True, exist_ok=True)
    (SUMMARY_DIR / f"{name}.json").write_text(json.dumps(summary, indent=1, default=str))
    print(f"\n{name}: {json.dumps(summary, default=str)}")


# -- the scenarios -------------------------------------------------------------------------------------
def test_sigkill_twice_second_during_recovery(kafka_bootstrap, new_topic, flink_cluster, tmp_path, operator_log):
    """(a) SIGKILL a few seconds in, calls under way, no checkpoint triggered; a new TaskManager takes over and both
    subtasks restart as attempt 1. (b) Once that attempt has re-made calls and journaled results, SIGKILL again; a
    third TaskManager finishes. Every kill is checked (calls journaled at a kill never run after it), so the first
    kill's recovery is checked as a scenario of its own would."""
    scenario = Scenario(kafka_bootstrap, new_topic, flink_cluster, tmp_path, operator_log)
    scenario.submit()
    total = len(scenario.expected_calls)
    scenario.wait_for_calls(lambda: scenario.counter.count("calls") >= total * KILL_AT, "a quarter of the calls begun")
    first = scenario.kill()
    assert first.in_flight and first.journal.results
    log_mark = len(operator_log())
    scenario.replace_taskmanager()

    # The restarted attempt recovers: it has re-made calls the kill interrupted and journaled a few results.
    begun_at_kill = sum(first.begun.values())
    done_at_kill = sum(first.done.values())

    def recovering() -> bool:
        if scenario.restarted_subtasks(log_mark, attempt=1) != {0, 1}:
            return False
        if SECOND_KILL_AFTER_DONE == 0:
            return True
        begun, done = split_counts(scenario.counter.counts())
        return sum(done.values()) - done_at_kill >= SECOND_KILL_AFTER_DONE and sum(begun.values()) > begun_at_kill

    scenario.wait_for_calls(recovering, "the restarted attempt re-made calls", timeout_s=180)
    first_restart = scenario.restart_logged(log_mark)
    second = scenario.kill()
    assert first_restart, "the second kill came before the restarted attempt logged its restore"
    made_in_recovery = second.journal.results - first.journal.results
    if SECOND_KILL_AFTER_DONE:
        assert made_in_recovery, "the restarted attempt had journaled no result yet: not the intended moment"
        assert second.in_flight, "no call was under way at the second kill"
    log_mark_2 = len(operator_log())
    scenario.replace_taskmanager()
    poll_until(lambda: scenario.restarted_subtasks(log_mark_2) == {0, 1}, 180,
               lambda: f"no second restart logged by both; {scenario.cluster.job_diagnostics(scenario.job_id)}")
    summary = scenario.finish()
    summary["restart_log"] = sorted(set(scenario.restart_logged(log_mark)))
    summary["second_kill_after_first_s"] = round(second.after_job_start_s - first.after_job_start_s, 2)
    summary["journaled_by_recovering_attempt_before_second_kill"] = len(made_in_recovery)
    summary["fully_replayed_before_second_kill"] = sum(
        "recovered journal fully replayed" in line for line in operator_log()[log_mark:log_mark_2])
    _save("b-double-kill", summary)
    fresh = [line for line in operator_log()[log_mark:] if "fresh start of job" in line]
    assert fresh == [], f"a restart was taken for a fresh start: {fresh}"


def test_sigkill_while_first_checkpoint_in_progress(kafka_bootstrap, new_topic, flink_cluster, tmp_path, operator_log):
    """(c) Checkpoints every 5 s (min-pause 5 s): SIGKILL the moment the first one is triggered (its directory
    appears: the operator may have flushed and written its marker, the sink pre-committed its transaction) and
    before it completes; a new TaskManager takes over, and the job restarts with no completed checkpoint."""
    scenario = Scenario(kafka_bootstrap, new_topic, flink_cluster, tmp_path, operator_log, checkpoint_ms=5_000)
    scenario.submit()
    scenario.wait_for_calls(lambda: scenario.counter.count("calls") > 0 and scenario.checkpoint_dirs(),
                            "the first checkpoint triggered while calls are under way", timeout_s=120)
    kill = scenario.kill(checkpoint_triggered=True)
    assert kill.in_flight, "no call was under way at the kill"
    assert kill.journal.results, "nothing was journaled before the kill"
    scenario.recover_once_and_finish("c-kill-during-first-checkpoint")
