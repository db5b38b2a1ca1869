"""Chaos soak: an agent job on a local cluster under random, seeded infrastructure faults, checked afterwards.

    .venv/bin/python bench/chaos_soak.py --minutes 5 --seed 1        # under the integration lock, see bench/README.md

What it starts (all its own, in a temporary directory, all stopped at the end, also on failure or Ctrl-C): a
Kafka broker (so it can pause and restart it), the stub model service and a ledger service (both in this
process, counting every request), and a standalone Flink session cluster with two TaskManagers. It submits
``bench/soak_job.py`` (tickets -> classify with the model -> book on the ledger, an external call -> memory
-> replies through the exactly-once ``KafkaSink``) with ``flink run -d -py`` and feeds tickets at a steady
rate for ``--minutes``, while a seeded schedule injects faults, one at a time, each followed by a wait for
recovery and a random gap:

* ``action_exception``: an exception leaves the action ``book`` right after its ledger call returned (the
  job's fault gate, see ``soak_job.py``); the task fails and Flink restores the last checkpoint;
* ``tm_kill``: SIGKILL of the TaskManager running the agent, calls under way; a new one replaces it once
  the job runs again;
* ``tm_pause``: a zombie. SIGSTOP of the TaskManager running the agent, calls under way, until Flink declares
  it lost (the heartbeat timeout: the template's 30 s, or ``heartbeat_timeout_ms``)
  and restores the job on the other one; then SIGCONT. The
  resumed process finishes what it had under way and delivers journal records after the new attempt's
  fences, which a tail of the journal (written apart from the package's reader) counts: the fault hit when
  it found at least one. Then an exception in an action, so that a restore may read the range holding them;
* ``broker_pause``: SIGSTOP of the broker for a random time, calls under way, then SIGCONT;
* ``broker_restart``: the broker ended (SIGTERM or SIGKILL, seeded) and started again on the same port and data;
* ``savepoint_rescale``: ``flink stop --savepointPath`` and ``flink run -s`` at the other parallelism (2 <-> 3).

The schedule goes in rounds: each round holds every kind once, in a seeded order, so the kinds stay balanced.
Afterwards it stops feeding, waits for every input's reply, and checks the invariants on what it recorded
outside Flink (the fed tickets, the committed replies read with ``read_committed``, the services' counts in
this process and a SQLite file, the journal topic's watermarks):

1. every input answered exactly once (no reply missing, none twice, none for an unknown ticket);
2. every reply and every customer's final memory (carried by the customer's last reply) equal to a
   failure-free run of the same agent in this process;
3. every logical call executed once: ledger bookings per ticket = 1 (a call in doubt re-sent with its
   idempotency key is answered from the ledger's store and counted apart), model requests executed twice = 0;
4. the journal stays bounded: its unpruned records (high - low watermark over the partitions) once the
   job is idle after the last reply is committed, at most ``--journal-bound``.

and that the faults hit: at least ``--min-faults`` of each kind took effect (the exception was raised, the
TaskManager's process is gone, the broker's process was stopped / replaced, the restored job runs from the
savepoint at the other parallelism, a paused TaskManager delivered records late), and calls were under way
at kills and pauses. It reports how many late records restores read and ignored (the operator log): a
restore reads them only when no checkpoint completed between their landing and the failure, so that count
is reported, not asserted (``tests/integration/test_fencing_zombie.py`` arranges it deterministically).

It prints the faults, the invariants with their violations (each with its evidence: ticket ids, counts),
recovery times (fault cleared -> job running with a checkpoint completed after it) and the TaskManagers'
RSS over time (reported, not asserted). Exit status 0 when there is no violation and every kind hit its
minimum, 1 otherwise. ``tests/integration/test_chaos_soak.py`` runs it in CI until every kind hit (``minutes=0``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import re
import secrets
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _soak_ledger import LedgerService  # noqa: E402 - bench/ is not a package

from flink_agents_replay.examples.support_triage import make_tickets  # noqa: E402
from flink_agents_replay.flink.config import default_journal_topic, default_uid  # noqa: E402
from flink_agents_replay.local.errors import LocalServiceError  # noqa: E402
from flink_agents_replay.testing.committed import poll_until  # noqa: E402

JOB = Path(__file__).resolve().with_name("soak_job.py")
FAULT_KINDS = ("action_exception", "tm_kill", "tm_pause", "broker_pause", "broker_restart", "savepoint_rescale")
_IN, _OUT = "soak-tickets", "soak-replies"
_JOB_ID = re.compile(r"JobID\s+([0-9a-f]{32})")
_RECOVERY_TIMEOUT_S = 240.0
_IGNORED = re.compile(r"subtask \d+: (\d+) records of an earlier attempt ignored")


def _now() -> float:
    return time.monotonic()


@dataclass
class Fault:
    """One injected fault: what, when (seconds since the soak began), whether it hit, and what followed."""

    kind: str
    at_s: float
    detail: str = ""
    hit: bool = False
    calls_in_flight: int | None = None
    cleared_s: float | None = None
    recovery_s: float | None = None
    failed_over: bool | None = None
    zombie_records: int | None = None  # tm_pause: records the resumed process delivered after the new fences


@dataclass
class SoakResult:
    """What a soak measured and found."""

    minutes: float
    seed: int
    tickets_fed: int
    replies: int
    faults: list[Fault]
    violations: list[str]
    fault_shortfalls: list[str]
    rss_mb: list[tuple[float, dict[str, float]]]
    journal_records: list[tuple[float, int]]
    journal_final: int | None
    ledger_executions: int
    ledger_replays: int
    model_requests: int
    model_repeated: int
    operator_log: Counter
    failover_causes: Counter
    seconds: float
    zombie_records_ignored: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations and not self.fault_shortfalls

    def fault_counts(self, *, hit_only: bool = True) -> Counter:
        return Counter(f.kind for f in self.faults if f.hit or not hit_only)


# -- the run ---------------------------------------------------------------------------------------------------


def run_soak(*, minutes: float, seed: int, feed_per_second: float = 4.0, customers: int = 24,
             model_delay_ms: int = 60, ledger_delay_ms: int = 150, gap_s: tuple[float, float] = (8.0, 20.0),
             broker_pause_s: tuple[float, float] = (10.0, 40.0), min_faults: int = 1, journal_bound: int = 2000,
             kinds: tuple[str, ...] = FAULT_KINDS, max_minutes: float | None = None,
             heartbeat_timeout_ms: int | None = None, say: Callable[[str], None] = print) -> SoakResult:
    """Run the soak (see the module docstring); everything it started is stopped before it returns or raises.

    It injects faults for at least ``minutes`` and until every kind has *hit* ``min_faults`` times, but no
    longer than ``max_minutes`` (default: twice ``minutes``, at least 10); ``minutes=0`` ends as soon as every
    kind has hit. ``heartbeat_timeout_ms`` shortens the cluster's (the template's 30 s): how long a paused
    TaskManager stays a zombie before Flink restores its work elsewhere."""
    cap_s = (max_minutes if max_minutes is not None else max(2 * minutes, 10.0)) * 60
    soak = _Soak(seed=seed, customers=customers, feed_per_second=feed_per_second, model_delay_ms=model_delay_ms,
                 ledger_delay_ms=ledger_delay_ms, broker_pause_s=broker_pause_s,
                 heartbeat_timeout_ms=heartbeat_timeout_ms, say=say)
    try:
        soak.start()
        soak.inject_faults(minutes * 60, gap_s, min_faults, kinds, cap_s=cap_s)
        result = soak.finish(minutes, min_faults, journal_bound, kinds)
        soak.failed = not result.ok
        return result
    finally:
        soak.stop()


class _Soak:
    """The soak's services, its fault injectors and its checks."""

    def __init__(self, *, seed: int, customers: int, feed_per_second: float, model_delay_ms: int,
                 ledger_delay_ms: int, broker_pause_s: tuple[float, float], heartbeat_timeout_ms: int | None,
                 say: Callable[[str], None]):
        from flink_agents_replay.flink.operator import LOG_FILE_ENV
        from flink_agents_replay.local.flink_cluster import LocalFlinkCluster
        from flink_agents_replay.local.kafka_broker import LocalKafkaBroker
        from flink_agents_replay.local.model_server import StubModelServer
        from flink_agents_replay.local.processes import free_port

        self.begun = _now()
        self.say = lambda message: say(f"[{_now() - self.begun:7.1f} s] {message}")
        self.seed = seed
        self.rng = random.Random(seed)
        self.customers = customers
        self.feed_per_second = feed_per_second
        self.broker_pause_s = broker_pause_s
        self.work = Path(tempfile.mkdtemp(prefix="far-soak-"))
        self.fault_dir = self.work / "faults"
        self.fault_dir.mkdir()
        self.savepoints = self.work / "savepoints"
        self.key_file = self.work / "signing.key"
        self.key_file.write_text(secrets.token_hex(16))
        self._log_env, self._previous_log = LOG_FILE_ENV, os.environ.get(LOG_FILE_ENV)
        os.environ[LOG_FILE_ENV] = str(self.work / "operator.log")  # the cluster's processes inherit it
        # A fixed port: a restarted broker must come back where the job's clients look for it.
        self.broker = LocalKafkaBroker(self.work / "kafka", port=free_port())
        self.model = StubModelServer(port=0, delay_ms=model_delay_ms)
        self.ledger = LedgerService(self.work / "ledger.db", delay_ms=ledger_delay_ms)
        self.cluster = LocalFlinkCluster(self.work / "flink", taskmanagers=2, heartbeat_timeout_ms=heartbeat_timeout_ms)
        self.agent_id = f"soak-{seed}"
        self.journal_topic = default_journal_topic(default_uid(self.agent_id))
        self.broker_up = threading.Event()
        self.paused_pid: int | None = None  # the broker's, while paused
        self.paused_taskmanager: int | None = None
        self.bootstrap = self.job_id = ""
        self.parallelism = 2
        self.faults: list[Fault] = []
        self.violations: list[str] = []
        self.notes: list[str] = []
        self.feeder: _Feeder | None = None
        self.sampler: _Sampler | None = None
        self.reader: _CommittedReplies | None = None
        self.failed = True

    # -- start ---------------------------------------------------------------------------------------------
    def start(self) -> None:
        from flink_agents_replay.integrations.kafka.admin import ensure_topics

        self.say("starting Kafka, the model and ledger services, a Flink cluster with 2 TaskManagers")
        self.bootstrap = self.broker.start().bootstrap_servers
        self.broker_up.set()
        self.model.start()
        self.ledger.start()
        self.cluster.start()
        ensure_topics(self.bootstrap, [_IN, _OUT], partitions=2, replication_factor=1)
        self.job_id = self._submit(self.parallelism, savepoint=None)
        self.say(f"job {self.job_id} submitted (parallelism {self.parallelism}); Flink UI {self.cluster.rest_url}")
        self.reader = _CommittedReplies(self.bootstrap, _OUT)
        self.feeder = _Feeder(self.bootstrap, self.customers, self.feed_per_second)
        self.feeder.start()
        self.sampler = _Sampler(self)
        self.sampler.start()
        self._wait(lambda: self._checkpoints().get("counts", {}).get("completed", 0) >= 1 and self._replies() > 0,
                   240, "the first checkpoint and the first reply")
        self.say(f"warm: {self._progress()}")

    def _submit(self, parallelism: int, savepoint: str | None) -> str:
        restore = ["-s", savepoint] if savepoint else []
        result = self.cluster.flink_command(
            "run", "-d", *restore, "-py", str(JOB), "--bootstrap-servers", self.bootstrap, "--input-topic", _IN,
            "--output-topic", _OUT, "--agent-id", self.agent_id, "--parallelism", str(parallelism),
            "--model-base-url", self.model.base_url, "--ledger-base-url", self.ledger.base_url,
            "--fault-dir", str(self.fault_dir), "--signing-key-file", str(self.key_file), check=True)
        return _JOB_ID.search(result.stdout + result.stderr).group(1)

    # -- faults --------------------------------------------------------------------------------------------
    def inject_faults(self, seconds: float, gap_s: tuple[float, float], min_faults: int,
                      kinds: tuple[str, ...] = FAULT_KINDS, *, cap_s: float) -> None:
        """Faults from the seeded schedule until ``seconds`` have passed since the warm-up ended and every kind
        has hit ``min_faults`` times, or ``cap_s`` has passed (a kind that keeps missing is then a shortfall)."""
        injectors = {"action_exception": self._action_exception, "tm_kill": self._tm_kill,
                     "tm_pause": self._tm_pause, "broker_pause": self._broker_pause,
                     "broker_restart": self._broker_restart, "savepoint_rescale": self._savepoint_rescale}
        begun = _now()
        schedule: list[str] = []
        while True:
            self._idle(self.rng.uniform(*gap_s))
            hits = Counter(f.kind for f in self.faults if f.hit)
            if _now() - begun >= cap_s or (
                    _now() - begun >= seconds and all(hits[kind] >= min_faults for kind in kinds)):
                break
            if not schedule:
                schedule = list(kinds)
                self.rng.shuffle(schedule)
            fault = Fault(schedule.pop(0), _now() - self.begun)
            restored_before = self._restored_marker()
            self.say(f"fault {len(self.faults) + 1}: {fault.kind}")
            injectors[fault.kind](fault)
            self.faults.append(fault)
            self.say(f"  {fault.detail}")
            if not self._await_recovery(fault, restored_before):
                break
            if fault.kind == "tm_kill" or len(self.cluster.taskmanager_processes()) < 2:
                replacement = self.cluster.start_taskmanager()
                self.say(f"  replacement TaskManager {replacement.resource_id} (pid {replacement.pid}) registered")

    def _idle(self, seconds: float) -> None:
        end = _now() + seconds
        while _now() < end:
            self.reader.poll(min(0.5, max(0.0, end - _now())))

    def _calls_in_flight(self, wait_s: float = 20.0) -> int:
        """Wait (bounded) until a model or ledger call is under way; how many are."""
        def in_flight() -> int:
            return self.model.stats().in_flight + self.ledger.stats().in_flight

        try:
            return poll_until(in_flight, wait_s, "", interval_s=0.02)
        except TimeoutError:
            return 0

    def _action_exception(self, fault: Fault) -> None:
        fired = self._raise_in_action(fault.at_s)
        fault.hit = fired is not None
        fault.cleared_s = _now() - self.begun
        fault.detail = f"raised in action book at {fired}" if fired else "the trigger was not taken within 90 s"

    def _raise_in_action(self, tag: float) -> str | None:
        """Make the next fault-gate call raise (see ``soak_job.py``); the ticket it raised at, None if not taken."""
        trigger = self.fault_dir / "raise-next"
        trigger.write_text(str(tag))
        try:
            poll_until(lambda: not trigger.exists(), 90, "", interval_s=0.05)
        except TimeoutError:
            trigger.unlink(missing_ok=True)
        fired = sorted(self.fault_dir.glob("fired-*"), key=lambda p: p.stat().st_mtime)
        fresh = [p for p in fired if p.read_text() == str(tag)]
        return fresh[0].name.removeprefix("fired-").rsplit("-", 1)[0] if fresh else None

    def _tm_kill(self, fault: Fault) -> None:
        running_on = self.cluster.job_taskmanagers(self.job_id)
        live = self.cluster.taskmanager_processes()
        victim = max(running_on, key=running_on.get) if running_on else list(live)[-1]
        fault.calls_in_flight = self._calls_in_flight()
        pid = self.cluster.kill_taskmanager(resource_id=victim)
        fault.cleared_s = _now() - self.begun
        fault.hit = victim not in self.cluster.taskmanager_processes()
        fault.detail = (f"SIGKILL {victim} (pid {pid}, {running_on.get(victim, 0)} subtasks), "
                        f"{fault.calls_in_flight} calls under way")

    def _tm_pause(self, fault: Fault) -> None:
        """A zombie: the TaskManager running the agent stopped (SIGSTOP) until Flink declared it lost and restored
        the job on the other one, then resumed. Its calls under way return and their journal records land after
        the new attempt's fences; a tail of the journal, started before the pause, counts them. Then an
        exception in an action, so that a restore reads the range holding them (whether it does depends on a
        checkpoint completing in between: the operator log's "ignored" count says)."""
        running_on = self.cluster.job_taskmanagers(self.job_id)
        victim = max(running_on, key=running_on.get)
        pid = self.cluster.taskmanager_processes()[victim]
        tail = _LateJournalRecords(self.bootstrap, self.journal_topic, self.key_file.read_text().strip().encode(),
                                   default_uid(self.agent_id))
        tail.start()
        try:
            fault.calls_in_flight = self._calls_in_flight()
            self.paused_taskmanager = pid
            os.kill(pid, signal.SIGSTOP)
            restored = self._restored_without(victim, timeout_s=180)
            lost_after_s = _now() - self.begun - fault.at_s
            os.kill(pid, signal.SIGCONT)
            self.paused_taskmanager = None
            fault.cleared_s = _now() - self.begun
            try:
                poll_until(lambda: tail.late > 0, 30, "", interval_s=0.1)
            except TimeoutError:
                pass
            fault.zombie_records = tail.late
        finally:
            tail.stop()
        fault.hit = restored and fault.zombie_records > 0
        fault.detail = (f"SIGSTOP {victim} (pid {pid}, {running_on[victim]} subtasks), {fault.calls_in_flight} calls "
                        f"under way; {'restored elsewhere' if restored else 'NOT restored elsewhere'} "
                        f"{lost_after_s:.1f} s after the pause, SIGCONT; {fault.zombie_records} records delivered "
                        f"late by the zombie{'' if _alive(pid) else ', which then exited'}")
        if restored:
            self._raise_in_action(fault.at_s)

    def _restored_without(self, victim: str, *, timeout_s: float) -> bool:
        def running_elsewhere() -> bool:
            try:
                subtasks = self.cluster.job_subtasks(self.job_id)
            except Exception:  # noqa: BLE001 - REST answers during a failover are not conclusive
                return False
            return bool(subtasks) and all(t["status"] == "RUNNING" and t["taskmanager"] not in (None, victim)
                                          for t in subtasks)

        try:
            self._wait(running_elsewhere, timeout_s, "the job restored on another TaskManager")
            return True
        except TimeoutError:
            return False

    def _broker_pause(self, fault: Fault) -> None:
        pid = self.broker.status().pid
        seconds = self.rng.uniform(*self.broker_pause_s)
        fault.calls_in_flight = self._calls_in_flight()
        self.broker_up.clear()
        self.paused_pid = pid
        os.kill(pid, signal.SIGSTOP)
        try:
            fault.hit = poll_until(lambda: _process_state(pid) == "T", 5, "", interval_s=0.02) is not None
        except TimeoutError:
            fault.hit = False
        self._idle(seconds)
        os.kill(pid, signal.SIGCONT)
        self.paused_pid = None
        self.broker_up.set()
        fault.cleared_s = _now() - self.begun
        fault.detail = f"SIGSTOP broker pid {pid} for {seconds:.1f} s, {fault.calls_in_flight} calls under way"

    def _broker_restart(self, fault: Fault) -> None:
        old_pid = self.broker.status().pid
        how = self.rng.choice(["SIGTERM", "SIGKILL"])
        down_s = self.rng.uniform(2.0, 8.0)
        fault.calls_in_flight = self.model.stats().in_flight + self.ledger.stats().in_flight
        self.broker_up.clear()
        if how == "SIGKILL":
            os.kill(old_pid, signal.SIGKILL)
        took = _now()
        self.broker.stop(timeout_s=60)  # SIGTERM (a controlled shutdown); reaps a killed one; forgets its PID
        stopped_s = _now() - took
        self._idle(down_s)
        status = self.broker.start()
        self.broker_up.set()
        fault.cleared_s = _now() - self.begun
        fault.hit = status.running and status.pid != old_pid and not _alive(old_pid)
        fault.detail = (f"{how} broker pid {old_pid} (gone after {stopped_s:.1f} s), down {down_s:.1f} s more, "
                        f"restarted as pid {status.pid} on {status.bootstrap_servers}")

    def _savepoint_rescale(self, fault: Fault) -> None:
        target = 3 if self.parallelism == 2 else 2
        fault.calls_in_flight = self.model.stats().in_flight + self.ledger.stats().in_flight
        try:
            savepoint = self.cluster.stop_with_savepoint(self.job_id, self.savepoints, timeout_s=300)
        except LocalServiceError as exc:
            fault.cleared_s = _now() - self.begun
            fault.detail = f"stop with a savepoint failed: {str(exc)[:400]}"
            return
        old_job = self.job_id
        self.job_id = self._submit(target, savepoint)
        self.parallelism = target
        fault.cleared_s = _now() - self.begun
        agent_parallelism = self._agent_parallelism()
        fault.hit = agent_parallelism == target
        fault.detail = (f"stopped {old_job[:8]} with savepoint {Path(savepoint).name}, restored as {self.job_id[:8]} "
                        f"at parallelism {agent_parallelism} (wanted {target}), {fault.calls_in_flight} calls "
                        "under way at the stop")
        self.savepoint_path = savepoint

    # -- recovery ------------------------------------------------------------------------------------------
    def _restored_marker(self) -> object:
        try:
            return (self.job_id, json.dumps(self._checkpoints().get("latest", {}).get("restored"), sort_keys=True))
        except Exception:  # noqa: BLE001 - the REST API may be busy; no marker then
            return None

    def _recovered(self, cleared_at_ms: float) -> bool:
        try:
            if self.cluster.job_status(self.job_id) != "RUNNING":
                return False
            if not all(t["status"] == "RUNNING" for t in self.cluster.job_subtasks(self.job_id)):
                return False
            # Triggered after the fault cleared: one triggered during a broker pause may complete right after it
            # and prove nothing about the job's state since.
            completed = (self._checkpoints().get("latest") or {}).get("completed") or {}
            return completed.get("trigger_timestamp", 0) > cleared_at_ms
        except Exception:  # noqa: BLE001 - REST answers during a failover are not conclusive
            return False

    def _await_recovery(self, fault: Fault, restored_before: object) -> bool:
        """Wait until the job runs with a checkpoint completed after the fault cleared; False if it does not."""
        cleared_at_ms = (time.time() - (_now() - self.begun - fault.cleared_s)) * 1000
        try:
            self._wait(lambda: self._recovered(cleared_at_ms), _RECOVERY_TIMEOUT_S, f"recovery from {fault.kind}")
        except TimeoutError as exc:
            self.violations.append(f"no recovery within {_RECOVERY_TIMEOUT_S:.0f} s after {fault.kind} at "
                                   f"{fault.at_s:.0f} s: {exc}")
            return False
        fault.recovery_s = _now() - self.begun - fault.cleared_s
        fault.failed_over = self._restored_marker() != restored_before
        self.say(f"  recovered {fault.recovery_s:.1f} s after the fault cleared (failed over: {fault.failed_over}); "
                 f"{self._progress()}")
        return True

    # -- finish and check ------------------------------------------------------------------------------------
    def finish(self, minutes: float, min_faults: int, journal_bound: int,
               kinds: tuple[str, ...] = FAULT_KINDS) -> SoakResult:
        self.feeder.stop()
        fed = self.feeder.delivered()
        if len(fed) != len(self.feeder.produced):
            self.violations.append(f"inputs: {len(self.feeder.produced) - len(fed)} tickets were not delivered to "
                                   f"the input topic: {self.feeder.errors[:3]}")
        self.say(f"fed {len(fed)} tickets; waiting for every reply")
        wanted = {ticket["ticket_id"] for ticket in fed}
        try:
            self._wait(lambda: {row["ticket_id"] for row in self.reader.poll(0.3)} >= wanted, 420, "every reply")
            last = self._checkpoints()["counts"]["completed"]
            self._wait(lambda: self._checkpoints()["counts"]["completed"] > last + 1, 120, "two more checkpoints")
        except TimeoutError as exc:
            self.violations.append(f"not every input was answered in time: {exc}")
        rows = self.reader.read_to_committed_end(timeout_s=180)
        journal_final = self._journal_records()
        self.sampler.stop()
        self.cluster.cancel_job(self.job_id, timeout_s=120)
        self._check(fed, rows, journal_final, journal_bound)
        shortfalls = self._fault_shortfalls(min_faults, kinds)
        model, ledger = self.model.stats(), self.ledger.stats()
        return SoakResult(
            minutes=minutes, seed=self.seed, tickets_fed=len(fed), replies=len(rows), faults=self.faults,
            violations=self.violations, fault_shortfalls=shortfalls, rss_mb=self.sampler.rss,
            journal_records=self.sampler.journal, journal_final=journal_final,
            ledger_executions=ledger.executions, ledger_replays=ledger.idempotent_replays,
            model_requests=model.chat, model_repeated=model.repeated, operator_log=self._operator_log(),
            failover_causes=_failover_causes(self.cluster.log_dir),
            seconds=_now() - self.begun, notes=self.notes, zombie_records_ignored=self._records_ignored())

    def _check(self, fed: list[dict], rows: list[dict], journal_final: int | None, journal_bound: int) -> None:
        expected, final_memory = _reference(fed, self.agent_id)
        seen = Counter(row["ticket_id"] for row in rows)
        missing = sorted(expected.keys() - seen.keys())
        twice = sorted(t for t, n in seen.items() if n > 1)
        unknown = sorted(seen.keys() - expected.keys())
        for name, tickets in (("missing replies", missing), ("replies committed more than once", twice),
                              ("replies for tickets never fed", unknown)):
            if tickets:
                self.violations.append(f"{name}: {len(tickets)} ({_sample(tickets)})")
        by_ticket = {row["ticket_id"]: row for row in rows}
        differ = sorted(t for t in expected.keys() & by_ticket.keys() if by_ticket[t] != expected[t])
        if differ:
            first = differ[0]
            self.violations.append(f"replies differing from the failure-free run: {len(differ)} ({_sample(differ)}); "
                                   f"{first}: got {by_ticket[first]}, expected {expected[first]}")
        last_reply: dict[str, dict] = {}
        for row in rows:
            if row["seq"] >= last_reply.get(row["customer"], {}).get("seq", 0):
                last_reply[row["customer"]] = row
        memory_differs = sorted(c for c, memory in final_memory.items()
                                if last_reply.get(c, {}).get("memory") != memory)
        if memory_differs:
            c = memory_differs[0]
            self.violations.append(f"final memory differing from the failure-free run: {len(memory_differs)} "
                                   f"customers ({_sample(memory_differs)}); {c}: got "
                                   f"{last_reply.get(c, {}).get('memory')}, expected {final_memory[c]}")
        self._check_calls(wanted=expected.keys(), fed=len(fed))
        if journal_final is None:
            self.violations.append("journal: its watermarks could not be read at the end")
        elif journal_final > journal_bound:
            self.violations.append(f"journal not bounded: {journal_final} unpruned records once idle "
                                   f"(bound {journal_bound}); {self.journal_topic}")

    def _check_calls(self, wanted, fed: int) -> None:
        bookings = self.ledger.executions_per_ticket()
        repeated = sorted(t for t, n in bookings.items() if n > 1)
        never = sorted(t for t in wanted if bookings.get(t, 0) == 0)
        if repeated:
            self.violations.append(f"ledger calls executed more than once: {len(repeated)} tickets "
                                   f"({', '.join(f'{t} x{bookings[t]}' for t in repeated[:8])})")
        if never:
            self.violations.append(f"ledger calls never executed: {len(never)} ({_sample(never)})")
        model = self.model.stats()
        if model.repeated:
            self.violations.append(f"model requests executed twice: {model.repeated} (of {model.chat} executed; "
                                   f"{fed} logical calls)")
        if self.ledger.stats().without_key:
            self.violations.append(f"ledger calls without an idempotency key: {self.ledger.stats().without_key}")

    def _fault_shortfalls(self, min_faults: int, kinds: tuple[str, ...]) -> list[str]:
        shortfalls = []
        hits = Counter(f.kind for f in self.faults if f.hit)
        for kind in kinds:
            if hits[kind] < min_faults:
                shortfalls.append(f"{kind}: {hits[kind]} hit, at least {min_faults} wanted")
        for kind in ("tm_kill", "tm_pause", "broker_pause"):
            hit = [f for f in self.faults if f.kind == kind and f.hit]
            if hit and not any(f.calls_in_flight for f in hit):
                shortfalls.append(f"{kind}: no call was under way at any of them")
        return shortfalls

    def _operator_log(self) -> Counter:
        path = self.work / "operator.log"
        text = path.read_text(errors="replace") if path.is_file() else ""
        patterns = {"restores (subtask restored)": " restored: ", "warnings": " WARNING ", "errors": " ERROR ",
                    "call differs from the journaled one": "differs from the journaled one",
                    "restarted before its first completed checkpoint": "restarted before its first completed"}
        return Counter({name: text.count(pattern) for name, pattern in patterns.items()})

    def _records_ignored(self) -> int:
        """Records of an earlier attempt that restores read and ignored (fenced), from the operator log."""
        path = self.work / "operator.log"
        text = path.read_text(errors="replace") if path.is_file() else ""
        return sum(int(found.group(1)) for found in _IGNORED.finditer(text))

    # -- stop --------------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop everything started, whatever state it is in (a paused broker is resumed first)."""
        for pid in (self.paused_pid, self.paused_taskmanager):
            if pid is not None:
                _signal(pid, signal.SIGCONT)
        for thread in (self.sampler, self.feeder):
            if thread is not None:
                thread.stop()
        if self.reader is not None:
            self.reader.close()
        self.say("stopping Flink, the services and Kafka")
        for stop in (self.cluster.stop, self.model.stop, self.ledger.stop, self.broker.discard):
            try:
                stop()
            except Exception as exc:  # noqa: BLE001 - keep cleaning up; say what did not stop
                self.say(f"while stopping: {exc}")
        if self.failed:
            kept = Path(tempfile.gettempdir()) / f"far-soak-logs-{int(time.time())}"
            shutil.copytree(self.work, kept, ignore=shutil.ignore_patterns("data", "checkpoints", "*.jar", "lib"),
                            dirs_exist_ok=True, ignore_dangling_symlinks=True, symlinks=True)
            self.say(f"logs kept in {kept}")
        shutil.rmtree(self.work, ignore_errors=True)
        if self._previous_log is None:
            os.environ.pop(self._log_env, None)
        else:
            os.environ[self._log_env] = self._previous_log

    # -- helpers -----------------------------------------------------------------------------------------------
    def _checkpoints(self) -> dict:
        return self.cluster.rest_get(f"/jobs/{self.job_id}/checkpoints")

    def _agent_parallelism(self) -> int:
        # The source runs at 1; the agent and the sink at the job's parallelism.
        return max(node["parallelism"] for node in self.cluster.rest_get(f"/jobs/{self.job_id}/plan")["plan"]["nodes"])

    def _replies(self) -> int:
        return len(self.reader.poll(0.2))

    def _journal_records(self) -> int | None:
        from flink_agents_replay.storage.journal.inspect import summarize_topic

        if not self.broker_up.is_set():
            return None
        try:
            return sum(p.high - p.low for p in summarize_topic({"bootstrap.servers": self.bootstrap},
                                                              self.journal_topic, timeout_s=10))
        except Exception:  # noqa: BLE001 - a broker on its way down or up; no sample then
            return None

    def _progress(self) -> str:
        model, ledger = self.model.stats(), self.ledger.stats()
        return (f"fed {self.feeder.fed}, replies committed {len(self.reader.rows)}, model {model.chat}, "
                f"ledger {ledger.executions} (+{ledger.idempotent_replays} by key), job {self.job_id[:8]} "
                f"p={self.parallelism}")

    def _wait(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        last = [_now()]

        def check() -> bool:
            if condition():
                return True
            if _now() - last[0] > 15:
                self.say(f"  waiting for {what}: {self._progress()}")
                last[0] = _now()
            return False

        try:
            poll_until(check, timeout_s, what, interval_s=0.3)
        except TimeoutError:
            diagnostics = self.cluster.job_diagnostics(self.job_id) if self.job_id else ""
            raise TimeoutError(f"{what} not within {timeout_s:.0f} s; {self._progress()}; {diagnostics}") from None


def _reference(fed: list[dict], agent_id: str) -> tuple[dict[str, dict], dict[str, dict]]:
    """Replies and final memory summaries of a failure-free run of the same agent in this process, on
    separate instances of the services (so their counts stay the soak's)."""
    from flink_agents_replay.core.keygroups import key_group
    from flink_agents_replay.engine import RunInput, execute_run
    from flink_agents_replay.local.model_server import StubModelServer

    job = _soak_job_module()
    with tempfile.TemporaryDirectory(prefix="far-soak-ref-") as directory, StubModelServer() as model:
        ledger = LedgerService(Path(directory) / "ledger.db").start()
        try:
            agent = job.soak_agent(name=f"{agent_id}-reference", model_base_url=model.base_url,
                                   ledger_base_url=ledger.base_url, fault_dir=None)
            memory: dict[str, dict] = {}
            seqs: Counter = Counter()
            replies = {}
            for ticket in fed:
                customer = ticket["customer"]
                seqs[customer] += 1
                result = execute_run(agent, RunInput(customer, key_group(customer, "STRING", 128), seqs[customer],
                                                     ticket), memory.get(customer, {}))
                memory[customer] = result.memory
                for output in result.outputs:
                    replies[output.output["ticket_id"]] = {"seq": seqs[customer], **output.output}
        finally:
            ledger.stop()
    final = {c: job.memory_summary(len(m["history"]), m["total"], m["history"]) for c, m in memory.items()}
    return replies, final


def _failover_causes(log_dir: Path) -> Counter:
    """Why Flink failed tasks, from the JobManager's log: the root cause of each task that switched to FAILED
    (injected faults included), counted. The root cause: the Python exception if the block has one, else the
    last ``Caused by``, else the exception's first line; numbers and ids masked so equal causes group."""
    causes: Counter = Counter()
    for path in sorted(log_dir.glob("flink-*-standalonesession-*.log*")):
        block: list[str] | None = None
        for line in [*path.read_text(errors="replace").splitlines(), "20 end"]:
            if line[:2] == "20":  # a new log line ends the previous failure's block
                if block is not None:
                    causes[_root_cause(block)] += 1
                block = [] if "switched from RUNNING to FAILED" in line else None
            elif block is not None:
                block.append(line)
    return causes


def _root_cause(block: list[str]) -> str:
    python = [line for line in block if re.match(r"^[a-z_][\w.]*\.\w*(Error|Exception): ", line)
              and not line.startswith(("org.", "java.", "io.", "pemja."))]
    pemja = [line.split("<class '", 1)[1].replace("'>", "", 1) for line in block
             if line.startswith("Caused by: pemja.core.PythonException: <class '")]
    caused = [line.removeprefix("Caused by: ") for line in block if line.startswith("Caused by: ")]
    header = [line for line in block if line.strip() and not line.lstrip().startswith(("at ", "..."))][:1]
    cause = (python or pemja or caused or header or ["(no cause logged)"])[-1]
    return re.sub(r"\b[0-9a-f]{16,}\b|T-\d+|\d+", "N", cause)[:220]


def _soak_job_module():
    spec = importlib.util.spec_from_file_location("soak_job", JOB)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: How long the replies reader may read nothing, below the committed end, before it assigns its partitions again.
_STALLED_S = 15.0


class _CommittedReplies:
    """A ``read_committed`` consumer of the replies topic (like ``testing.committed.CommittedReader``, which it
    follows) that outlives broker restarts: quiet librdkafka logs, and the committed end asked again with a
    new admin client when the first answer is an error (stale leader epochs after a restart)."""

    def __init__(self, bootstrap: str, topic: str):
        import uuid

        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self.bootstrap = bootstrap
        self.topic = topic
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"soak-reader-{uuid.uuid4().hex[:8]}",
                                  "enable.auto.commit": False, "isolation.level": "read_committed", "log_level": 2})
        partitions = self._admin().list_topics(topic, timeout=30).topics[topic].partitions
        self.partitions = [TopicPartition(topic, p) for p in sorted(partitions)]
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(partitions)])
        self.rows: list[dict] = []
        self.last_row_at = _now()

    def _admin(self):
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 2})

    def poll(self, seconds: float = 0.5) -> list[dict]:
        deadline = _now() + seconds
        while _now() < deadline:
            message = self.consumer.poll(0.1)
            if message is not None and message.error() is None:
                self.rows.append(json.loads(message.value()))
                self.last_row_at = _now()
        if _now() - self.last_row_at > _STALLED_S:
            # librdkafka can stop fetching an assign()ed partition after a broker restart until the consumer is
            # assigned again (an open librdkafka issue, confluentinc/librdkafka#5153; seen in CI: the reader stuck 5
            # minutes below the committed end); assigning again where it is costs nothing when nothing is there.
            self._reassign(self.consumer.position(self.partitions))
            self.last_row_at = _now()
        return self.rows

    def _committed_ends(self) -> dict[int, int] | None:
        from confluent_kafka import IsolationLevel, KafkaException
        from confluent_kafka.admin import OffsetSpec

        admin = self._admin()  # referenced until the answers are in: a client collected earlier never answers
        futures = admin.list_offsets({tp: OffsetSpec.latest() for tp in self.partitions},
                                     isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=30)
        try:
            return {tp.partition: future.result(timeout=60).offset for tp, future in futures.items()}
        except (KafkaException, TimeoutError):
            return None

    def read_to_committed_end(self, timeout_s: float = 120) -> list[dict]:
        """Read on until every partition reaches its last stable offset as it is now; every row read."""
        ends = poll_until(self._committed_ends, timeout_s, "the replies topic's committed end", interval_s=1.0)

        def reached() -> bool:
            self.poll(0.2)
            positions = self.consumer.position(self.partitions)
            return all(ends[tp.partition] == 0 or tp.offset >= ends[tp.partition] for tp in positions)

        poll_until(reached, timeout_s, lambda: f"positions {self.consumer.position(self.partitions)}, ends {ends}",
                   interval_s=0)
        return self.rows

    def _reassign(self, positions) -> None:
        """Assign the partitions again at the positions read so far (nothing skipped, nothing read twice)."""
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        self.consumer.assign([TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING)
                              for tp in positions])

    def close(self) -> None:
        self.consumer.close()


# -- threads -------------------------------------------------------------------------------------------------


class _LateJournalRecords(threading.Thread):
    """Tails the journal topic from its end as it is at the start and counts *late* records: records an older
    attempt delivered after a newer attempt's fence in their partition. Written apart from the package's
    reader: an attempt record with ``fences`` at offset m sets the partition's fence to m + 1, and every
    other record carries its writer's fence in header ``att``."""

    def __init__(self, bootstrap: str, topic: str, signing_key: bytes, producer: str):
        from confluent_kafka import Consumer, TopicPartition

        from flink_agents_replay.integrations.kafka.settings import LIBRDKAFKA_LOGGER
        from flink_agents_replay.storage.records.codec import RecordCodec

        super().__init__(name="soak-late-records", daemon=True)
        self.topic = topic
        self.codec = RecordCodec(signing_key, producer)
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "soak-late-records",
                                  "enable.auto.commit": False, "logger": LIBRDKAFKA_LOGGER})
        partitions = sorted(self.consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        ends = {p: self.consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions}
        self.consumer.assign([TopicPartition(topic, p, end) for p, end in ends.items()])
        self.fences: dict[int, int] = {}
        self.late = 0
        self.halt = threading.Event()

    def run(self) -> None:
        from flink_agents_replay.storage.records.codec import RecordCodec
        from flink_agents_replay.storage.records.journal import parse_journal_key

        try:
            while not self.halt.is_set():
                message = self.consumer.poll(0.2)
                if message is None or message.error() is not None:
                    continue
                partition, offset = message.partition(), message.offset()
                if parse_journal_key(message.key())[3] == "_attempt":
                    marker = self.codec.decode(message.key(), message.value(), topic=self.topic, partition=partition)
                    if marker.payload.get("fences"):
                        self.fences[partition] = offset + 1
                elif (RecordCodec.peek_header(message.value()) or {}).get("att", 0) < self.fences.get(partition, 0):
                    self.late += 1
        finally:
            self.consumer.close()

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=30)



class _Feeder(threading.Thread):
    """Writes tickets at a steady rate, keyed by customer (a customer's tickets keep their order), and
    records which were delivered. Its producer waits out broker outages (no delivery timeout in practice)."""

    def __init__(self, bootstrap: str, customers: int, per_second: float):
        super().__init__(name="soak-feeder", daemon=True)
        from confluent_kafka import Producer

        # log_level 2: broker outages are the point here, librdkafka's connection errors are not news.
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                                  "message.timeout.ms": 1_800_000, "log_level": 2})
        self.customers = customers
        self.interval_s = 1.0 / per_second
        self.produced: list[dict] = []
        self._delivered: set[str] = set()
        self.errors: list[str] = []
        self.fed = 0
        self._stopped = threading.Event()

    def run(self) -> None:
        next_at = _now()
        while not self._stopped.wait(max(0.0, next_at - _now())):
            [ticket] = make_tickets(1, self.customers, start=len(self.produced))
            self.produced.append(ticket)
            self.producer.produce(_IN, key=ticket["customer"].encode(), value=json.dumps(ticket).encode(),
                                  on_delivery=lambda err, _msg, t=ticket["ticket_id"]: self._on_delivery(err, t))
            self.producer.poll(0)
            self.fed += 1
            next_at += self.interval_s

    def _on_delivery(self, error, ticket_id: str) -> None:
        if error is None:
            self._delivered.add(ticket_id)
        else:
            self.errors.append(f"{ticket_id}: {error}")

    def stop(self) -> None:
        self._stopped.set()
        if self.is_alive():
            self.join(timeout=30)
        if self.producer is not None:
            self.producer.flush(120)

    def delivered(self) -> list[dict]:
        """The tickets the broker acknowledged, in the order they were produced."""
        return [t for t in self.produced if t["ticket_id"] in self._delivered]


class _Sampler(threading.Thread):
    """Every few seconds: the TaskManagers' RSS (from /proc) and the journal's unpruned records."""

    def __init__(self, soak: _Soak, every_s: float = 10.0):
        super().__init__(name="soak-sampler", daemon=True)
        self.soak = soak
        self.every_s = every_s
        self.rss: list[tuple[float, dict[str, float]]] = []
        self.journal: list[tuple[float, int]] = []
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.wait(self.every_s):
            at = _now() - self.soak.begun
            rss = {rid: mb for rid, pid in self.soak.cluster.taskmanager_processes().items()
                   if (mb := _rss_mb(pid)) is not None}
            self.rss.append((at, rss))
            records = self.soak._journal_records()
            if records is not None:
                self.journal.append((at, records))

    def stop(self) -> None:
        self._stopped.set()
        if self.is_alive():
            self.join(timeout=30)


# -- small helpers -------------------------------------------------------------------------------------------


def _process_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    from flink_agents_replay.local.processes import pid_alive

    return pid_alive(pid)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _sample(items: list[str], n: int = 8) -> str:
    return ", ".join(items[:n]) + (" ..." if len(items) > n else "")


# -- the table -----------------------------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def format_report(result: SoakResult) -> str:
    """The soak's tables for people."""
    lines = [f"chaos soak: {result.minutes:g} min of faults, seed {result.seed}, {result.seconds:.0f} s in all; "
             f"{result.tickets_fed} tickets fed, {result.replies} replies committed", "",
             "fault               injected  hit  calls under way (min-max)  failed over  recovery s p50 / max"]
    for kind in FAULT_KINDS:
        faults = [f for f in result.faults if f.kind == kind]
        hit = [f for f in faults if f.hit]
        under_way = [f.calls_in_flight for f in faults if f.calls_in_flight is not None]
        recoveries = [f.recovery_s for f in faults if f.recovery_s is not None]
        spread = f"{min(under_way)}-{max(under_way)}" if under_way else "-"
        times = (f"{statistics.median(recoveries):.1f} / {max(recoveries):.1f}" if recoveries else "-")
        lines.append(f"{kind:<19} {len(faults):>8}  {len(hit):>3}  {spread:>25}  "
                     f"{sum(1 for f in faults if f.failed_over):>11}  {times:>20}")
    every = [f.recovery_s for f in result.faults if f.recovery_s is not None]
    if every:
        lines.append(f"{'all':<19} {len(result.faults):>8}  {sum(f.hit for f in result.faults):>3}  {'':>25}  "
                     f"{sum(1 for f in result.faults if f.failed_over):>11}  "
                     f"{f'{statistics.median(every):.1f} / {max(every):.1f}':>20}")
    late = [f.zombie_records for f in result.faults if f.zombie_records is not None]
    lines.append(f"zombie deliveries   {sum(late)} records delivered late by resumed TaskManagers (per pause: "
                 f"{', '.join(map(str, late)) or '-'}); {result.zombie_records_ignored} records of earlier attempts "
                 "ignored by restores")
    lines += ["", "invariant                                   violations"]
    checks = [("every input answered exactly once", ("missing replies", "more than once", "never fed",
                                                    "not every input", "not delivered")),
              ("replies and final memory = failure-free run", ("differing",)),
              ("each logical call executed once", ("ledger calls", "model requests")),
              ("journal bounded", ("journal",)),
              ("job recovered from every fault", ("no recovery",))]
    for name, markers in checks:
        count = sum(1 for v in result.violations if any(m in v for m in markers))
        lines.append(f"{name:<43} {count}")
    lines += [f"  violation: {v}" for v in result.violations]
    lines += [f"  fault shortfall: {s}" for s in result.fault_shortfalls]
    lines += ["", f"calls: ledger {result.ledger_executions} executed, {result.ledger_replays} answered by idempotency "
                  f"key; model {result.model_requests} executed, {result.model_repeated} executed twice",
              f"journal unpruned records: max {max((r for _, r in result.journal_records), default=0)} during the run, "
              f"{result.journal_final} once idle at the end",
              "operator log: " + ", ".join(f"{name} {n}" for name, n in result.operator_log.items()),
              f"task failures seen by Flink: {sum(result.failover_causes.values())}, by root cause:"]
    lines += [f"  {n:4d}  {cause}" for cause, n in result.failover_causes.most_common()]
    lines += ["", "TaskManager RSS over time (MB; reported, not asserted)"] + _rss_rows(result.rss_mb)
    lines += [f"note: {note}" for note in result.notes]
    lines.append("verdict: " + ("OK" if result.ok else "FAILED"))
    return "\n".join(lines)


def _rss_rows(samples: list[tuple[float, dict[str, float]]], rows: int = 12) -> list[str]:
    if not samples:
        return ["  (no samples)"]
    step = max(1, len(samples) // rows)
    picked = samples[::step] + ([samples[-1]] if (len(samples) - 1) % step else [])
    return [f"  {at:7.0f} s  " + "  ".join(f"{rid} {mb:6.0f}" for rid, mb in sorted(rss.items())) for at, rss in picked]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="how long faults are injected (default 5)")
    parser.add_argument("--seed", type=int, default=1, help="seeds the fault schedule (default 1)")
    parser.add_argument("--feed-per-second", type=float, default=4.0, help="tickets fed per second (default 4)")
    parser.add_argument("--customers", type=int, default=24, help="distinct customers, the key (default 24)")
    parser.add_argument("--min-faults", type=int, default=1, help="hits wanted of each fault kind (default 1)")
    parser.add_argument("--journal-bound", type=int, default=2000,
                        help="most unpruned journal records allowed once idle at the end (default 2000)")
    parser.add_argument("--broker-pause-s", type=float, nargs=2, default=(10.0, 40.0), metavar=("MIN", "MAX"))
    parser.add_argument("--kinds", nargs="+", choices=FAULT_KINDS, default=list(FAULT_KINDS),
                        help="the fault kinds to inject (default: all)")
    parser.add_argument("--gap-s", type=float, nargs=2, default=(8.0, 20.0), metavar=("MIN", "MAX"),
                        help="seconds between a recovery and the next fault (default 8 20)")
    args = parser.parse_args(argv)
    result = run_soak(minutes=args.minutes, seed=args.seed, feed_per_second=args.feed_per_second,
                      customers=args.customers, min_faults=args.min_faults, journal_bound=args.journal_bound,
                      broker_pause_s=tuple(args.broker_pause_s), gap_s=tuple(args.gap_s), kinds=tuple(args.kinds))
    print(format_report(result))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
