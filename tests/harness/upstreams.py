"""Same-key inputs from two upstream instances, with an interleaving a test controls (docs/design.md §8).

The job: a Kafka topic with 2 partitions -> ``KafkaSource`` at parallelism 2 (each reader owns one
partition) -> a pacing ``flat_map`` at parallelism 2 (chained to its reader) -> ``key_by(key)`` -> the
agent at parallelism 1. Partition (*lane*) ``l`` holds the inputs ``n = 2*j + l`` of every key, round
``j`` by round ``j``, so every key's inputs alternate between the two upstream instances.

**Pacing.** Each lane record carries its position ``pos`` in its lane (``j * keys + k``). Upstream
instance ``i`` emits the record at position ``pos`` at ``origin + pos * period + delay[i]``; ``period``
and the per-instance ``delay`` come from a small JSON control file (:class:`UpstreamControl`) that the test
rewrites while the job runs, and ``origin`` is fixed per job attempt once the agent has restored and both
instances have their first record (see :class:`LanePacer`). With delays ``[0, keys * period / 2]``
instance 0 leads: every key receives the input of instance 0 half-way between two inputs of instance 1.
Swapping the two delays at a failure makes instance 1 lead in the restored attempt, so the replayed inputs
of a key arrive in the other interleaving. Emission times depend on the position in the lane, not on
where a lane resumed after the restore, so the reversal does not depend on the checkpointed source
offsets. The pacing blocks a lane for at most one record's slot at a time (after the start), so
checkpoint barriers pass between records. The agent operator's own snapshot holds its task thread for a
while (flush and offsets request); records arriving meanwhile queue and are then taken channel by
channel, so arrival order is not exactly emission order: tests read the actual order from the recorder.

**Observation.** :class:`JobRecorder` (a SQLite file outside the Flink worker, like
:class:`~flink_agents_replay.testing.counter.InvocationCounter`) records what the job does, per attempt:
what each upstream instance emitted, every input as it *arrives* at the agent operator (before the
operator decides when it runs), every output the operator emits (committed or not), every agent
snapshot (with the last arrival it covers) and every completed checkpoint. :class:`JobRecord` answers
the questions tests ask of it: which inputs the failed attempt accepted after the restored checkpoint,
in which order they arrived again, which keys were waiting for a missing predecessor at a checkpoint.
The operator is the package's own :class:`~flink_agents_replay.flink.operator.ActionExecutionOperator`,
subclassed only to record (:class:`ObservedOperator`).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyflink.datastream import FlatMapFunction

from flink_agents_replay.api.agent import Agent, Event, InputEvent, OutputEvent, action
from flink_agents_replay.api.resources import Tool
from flink_agents_replay.flink.config import AgentConfig
from flink_agents_replay.flink.operator import ActionExecutionOperator, AgentOutput
from flink_agents_replay.flink.runtime_info import subtask_info
from flink_agents_replay.testing.agents import InjectedFailure
from flink_agents_replay.testing.counter import InvocationCounter, SharedSqliteFile
from flink_agents_replay.testing.jobs import canonical_output, collect_outputs

__all__ = [
    "FailOnceAfterCheckpoint", "FailOnceWhileWaiting", "JobRecord", "JobRecorder", "LanePacer", "ObservedOperator",
    "Remembered", "UpstreamControl", "connect_observed_agent", "history_agent", "key_name", "lane_records",
    "produce_lane_inputs", "run_lane_job",
]

LANES = 2


# -- inputs ----------------------------------------------------------------------------------------
def key_name(k: int) -> str:
    return f"key-{k:02d}"


def lane_records(keys: int, rounds: int) -> list[list[dict]]:
    """The records of each lane (partition), in lane order: lane ``l`` holds ``n = 2*j + l`` of every key."""
    return [[{"key": key_name(k), "n": 2 * j + lane, "lane": lane, "pos": j * keys + k}
             for j in range(rounds) for k in range(keys)] for lane in range(LANES)]


def produce_lane_inputs(bootstrap_servers: str, topic: str, keys: int, rounds: int) -> list[dict]:
    """Write :func:`lane_records` to ``topic`` (which must have 2 partitions), lane ``l`` to partition ``l``."""
    from confluent_kafka import Producer

    from flink_agents_replay.integrations.kafka.settings import LIBRDKAFKA_LOGGER

    producer = Producer({"bootstrap.servers": bootstrap_servers, "enable.idempotence": True,
                         "logger": LIBRDKAFKA_LOGGER})
    records = lane_records(keys, rounds)
    for lane, lane_inputs in enumerate(records):
        for record in lane_inputs:
            producer.produce(topic, json.dumps(record).encode(), key=record["key"].encode(), partition=lane)
    if producer.flush(60):
        raise RuntimeError("input records were not acknowledged")
    return [record for lane_inputs in records for record in lane_inputs]


# -- control file ----------------------------------------------------------------------------------
class UpstreamControl:
    """The pacing of the two upstream instances: a JSON file read by every record, rewritten atomically.

    Settings: ``period_ms`` (slot width per lane position), ``delay_ms`` (per upstream instance, by subtask
    index), ``gap_ms`` (per upstream instance: the least time between two of its records, which makes an
    instance lag further behind with every record while checkpoint barriers still pass between its records),
    ``start_margin_ms`` (from the first record of an attempt to its first slot), ``drop`` (``[key, n]`` inputs
    the upstream skips from now on: a record that never comes back).
    """

    def __init__(self, path: str | Path, *, period_ms: float = 40.0, delay_ms: tuple[float, float] | None = None,
                 keys: int = 4, start_margin_ms: float = 300.0):
        self.path = str(path)
        if not os.path.exists(self.path):
            half_round = keys * period_ms / 2
            self.write({"period_ms": period_ms, "delay_ms": list(delay_ms or (0.0, half_round)),
                        "gap_ms": [0.0] * LANES, "start_margin_ms": start_margin_ms, "drop": []})

    def read(self) -> dict:
        with open(self.path, encoding="utf-8") as handle:
            return json.load(handle)

    def write(self, settings: Mapping[str, Any]) -> None:
        directory = os.path.dirname(os.path.abspath(self.path))
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=".control-")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(dict(settings), handle)
        os.replace(temporary, self.path)  # readers see the old or the new file, never half of one

    def update(self, **changes: Any) -> dict:
        """Change some settings; return the new ones. (One writer at a time: the test, or the failing run.)"""
        settings = {**self.read(), **changes}
        self.write(settings)
        return settings

    def swap_delays(self) -> dict:
        """Swap the delays of instance 0 and 1: the other instance leads from now on."""
        first, second = self.read()["delay_ms"]
        return self.update(delay_ms=[second, first])


# -- recorder --------------------------------------------------------------------------------------
_SCHEMA = """
CREATE TABLE IF NOT EXISTS arrivals (id INTEGER PRIMARY KEY AUTOINCREMENT, attempt INTEGER, key TEXT, n INTEGER,
    lane INTEGER, pos INTEGER, t REAL);
CREATE TABLE IF NOT EXISTS emissions (id INTEGER PRIMARY KEY AUTOINCREMENT, attempt INTEGER, instance INTEGER,
    key TEXT, n INTEGER, lane INTEGER, pos INTEGER, dropped INTEGER, t REAL);
CREATE TABLE IF NOT EXISTS outputs (id INTEGER PRIMARY KEY AUTOINCREMENT, attempt INTEGER, key TEXT, seq INTEGER,
    n INTEGER, output TEXT, t REAL);
CREATE TABLE IF NOT EXISTS snapshots (id INTEGER PRIMARY KEY AUTOINCREMENT, attempt INTEGER, checkpoint_id INTEGER,
    last_arrival INTEGER, t REAL);
CREATE TABLE IF NOT EXISTS completions (id INTEGER PRIMARY KEY AUTOINCREMENT, attempt INTEGER,
    checkpoint_id INTEGER, t REAL);
CREATE TABLE IF NOT EXISTS origins (attempt INTEGER PRIMARY KEY, t0 REAL);
CREATE TABLE IF NOT EXISTS ready (attempt INTEGER PRIMARY KEY, t REAL);
CREATE TABLE IF NOT EXISTS checkins (attempt INTEGER, instance INTEGER, pos INTEGER, t REAL,
    PRIMARY KEY (attempt, instance));
CREATE TABLE IF NOT EXISTS faults (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, attempt INTEGER, detail TEXT,
    t REAL);
"""


@dataclass(frozen=True)
class Arrival:
    id: int
    attempt: int
    key: str
    n: int
    lane: int
    pos: int
    t: float


@dataclass(frozen=True)
class Emission:
    id: int
    attempt: int
    instance: int
    key: str
    n: int
    lane: int
    pos: int
    dropped: bool
    t: float


@dataclass(frozen=True)
class EmittedOutput:
    id: int
    attempt: int
    key: str
    seq: int
    n: int | None
    output: str  # JSON, sorted keys
    t: float


@dataclass(frozen=True)
class Snapshot:
    id: int
    attempt: int
    checkpoint_id: int
    last_arrival: int  # id of the last arrival before this snapshot (0: none)
    t: float


@dataclass(frozen=True)
class Completion:
    id: int
    attempt: int
    checkpoint_id: int
    t: float


@dataclass(frozen=True)
class Fault:
    id: int
    name: str
    attempt: int
    detail: str
    t: float


class JobRecorder(SharedSqliteFile):
    """What a lane job did, per attempt, in a SQLite file; safe across threads and pickled into Flink functions."""

    def __init__(self, path: str | Path):
        super().__init__(path)
        with self._connect() as connection:
            connection.executescript(_SCHEMA)

    def _insert(self, table: str, **values: Any) -> int:
        columns = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        with self._connect() as connection:
            return connection.execute(f"INSERT INTO {table} ({columns}) VALUES ({marks})",
                                      tuple(values.values())).lastrowid

    # writers (from the job)
    def arrived(self, attempt: int, key: str, record: Mapping[str, Any]) -> None:
        self._insert("arrivals", attempt=attempt, key=key, n=record.get("n"), lane=record.get("lane"),
                     pos=record.get("pos"), t=time.time())

    def emitted(self, attempt: int, instance: int, record: Mapping[str, Any], dropped: bool = False) -> None:
        self._insert("emissions", attempt=attempt, instance=instance, key=record["key"], n=record["n"],
                     lane=record["lane"], pos=record["pos"], dropped=int(dropped), t=time.time())

    def output(self, attempt: int, output: AgentOutput) -> None:
        value = output.output
        n = value.get("n") if isinstance(value, Mapping) else None
        self._insert("outputs", attempt=attempt, key=output.key, seq=output.seq, n=n,
                     output=json.dumps(value, sort_keys=True, default=repr), t=time.time())

    def snapshot(self, attempt: int, checkpoint_id: int) -> None:
        with self._connect() as connection:
            last = connection.execute("SELECT COALESCE(MAX(id), 0) FROM arrivals").fetchone()[0]
            connection.execute("INSERT INTO snapshots (attempt, checkpoint_id, last_arrival, t) VALUES (?, ?, ?, ?)",
                               (attempt, checkpoint_id, last, time.time()))

    def completed(self, attempt: int, checkpoint_id: int) -> None:
        self._insert("completions", attempt=attempt, checkpoint_id=checkpoint_id, t=time.time())

    def fault(self, name: str, detail: Any = None) -> None:
        self._insert("faults", name=name, attempt=self.current_attempt(), detail=json.dumps(detail, default=repr),
                     t=time.time())

    def agent_ready(self, attempt: int) -> None:
        self._insert("ready", attempt=attempt, t=time.time())

    def agent_ready_at(self, attempt: int) -> float | None:
        """When the agent of ``attempt`` finished its restore (``None``: not yet)."""
        row = self._connect().execute("SELECT t FROM ready WHERE attempt = ?", (attempt,)).fetchone()
        return row[0] if row else None

    def check_in(self, attempt: int, instance: int, pos: int) -> None:
        """An upstream instance has its first record of ``attempt`` (at lane position ``pos``)."""
        with self._connect() as connection:
            connection.execute("INSERT OR IGNORE INTO checkins (attempt, instance, pos, t) VALUES (?, ?, ?, ?)",
                               (attempt, instance, pos, time.time()))

    def check_ins(self, attempt: int) -> list[tuple[int, int, float]]:
        """(instance, first position, time) of every upstream instance that checked in for ``attempt``."""
        return self._connect().execute("SELECT instance, pos, t FROM checkins WHERE attempt = ? ORDER BY instance",
                                       (attempt,)).fetchall()

    def origin(self, attempt: int, proposal: float) -> float:
        """The pacing origin of ``attempt``: the first proposal wins, every instance gets the same value."""
        with self._connect() as connection:
            connection.execute("INSERT OR IGNORE INTO origins (attempt, t0) VALUES (?, ?)", (attempt, proposal))
            return connection.execute("SELECT t0 FROM origins WHERE attempt = ?", (attempt,)).fetchone()[0]

    # readers
    def current_attempt(self) -> int:
        """The agent's attempt that saw the latest input (0 before any)."""
        row = self._connect().execute("SELECT COALESCE(MAX(attempt), 0) FROM arrivals").fetchone()
        return row[0]

    def read(self) -> JobRecord:
        """Everything recorded so far."""
        connection = self._connect()

        def rows(table: str, kind):
            return [kind(*row) for row in connection.execute(f"SELECT * FROM {table} ORDER BY id")]

        with connection:  # one read transaction: a consistent view
            return JobRecord(
                arrivals=rows("arrivals", Arrival),
                emissions=[Emission(*row[:7], bool(row[7]), row[8])
                           for row in connection.execute("SELECT * FROM emissions ORDER BY id")],
                outputs=rows("outputs", EmittedOutput),
                snapshots=rows("snapshots", Snapshot),
                completions=rows("completions", Completion),
                faults=rows("faults", Fault),
            )


@dataclass
class JobRecord:
    """A consistent read of a :class:`JobRecorder`, with the questions tests ask of it."""

    arrivals: list[Arrival] = field(default_factory=list)
    emissions: list[Emission] = field(default_factory=list)
    outputs: list[EmittedOutput] = field(default_factory=list)
    snapshots: list[Snapshot] = field(default_factory=list)
    completions: list[Completion] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)

    def attempts(self) -> list[int]:
        return sorted({a.attempt for a in self.arrivals})

    def snapshot_of(self, attempt: int, checkpoint_id: int) -> Snapshot | None:
        return next((s for s in reversed(self.snapshots)
                     if s.attempt == attempt and s.checkpoint_id == checkpoint_id), None)

    def restored_snapshot(self, attempt: int) -> Snapshot | None:
        """The agent snapshot of the checkpoint ``attempt`` restored: the last one completed before it."""
        completed = [c for c in self.completions if c.attempt < attempt]
        return self.snapshot_of(completed[-1].attempt, completed[-1].checkpoint_id) if completed else None

    def arrivals_after(self, snapshot: Snapshot) -> list[Arrival]:
        """The inputs that reached the agent after ``snapshot``, in the same attempt (those a restore replays)."""
        return [a for a in self.arrivals if a.attempt == snapshot.attempt and a.id > snapshot.last_arrival]

    def recorded_after_restore(self, attempt: int) -> dict[str, list[int]]:
        """Per key, in seq order, the inputs the attempt before ``attempt`` ran after the restored checkpoint.

        Those whose runs finished (an output left the operator), so journaled for sure: what ``attempt``
        replays from the source and may reuse.
        """
        snapshot = self.restored_snapshot(attempt)
        if snapshot is None:
            return {}
        replayed = {(a.key, a.n) for a in self.arrivals_after(snapshot)}
        order: dict[str, list[int]] = defaultdict(list)
        for output in sorted(self.outputs, key=lambda o: (o.key, o.seq, o.id)):
            if output.attempt == snapshot.attempt and (output.key, output.n) in replayed:
                if output.n not in order[output.key]:
                    order[output.key].append(output.n)
        return dict(order)

    def arrival_order(self, attempt: int) -> dict[str, list[int]]:
        """Per key, the inputs in the order they reached the agent in ``attempt``."""
        order: dict[str, list[int]] = defaultdict(list)
        for arrival in self.arrivals:
            if arrival.attempt == attempt:
                order[arrival.key].append(arrival.n)
        return dict(order)

    def reordered(self, attempt: int) -> dict[str, tuple[list[int], list[int]]]:
        """Keys whose replayed inputs did not reach the agent in ``attempt`` in the order they ran before.

        Per such key: (the order they ran in before the failure, the order in which those of them that came
        back arrived in ``attempt``). A key is reordered when an input arrived before one that ran before
        it, or while one that ran before it never came back.
        """
        arrived = self.arrival_order(attempt)
        result = {}
        for key, before in self.recorded_after_restore(attempt).items():
            again = [n for n in dict.fromkeys(arrived.get(key, [])) if n in before]
            if again != before[:len(again)]:
                result[key] = (before, again)
        return result

    def waiting_at(self, attempt: int, checkpoint_id: int) -> dict[str, tuple[list[int], list[int]]]:
        """Keys that, at this checkpoint's agent snapshot, held a replayed input whose recorded predecessor had
        not arrived again yet: per key (inputs arrived out of their recorded order, predecessors missing)."""
        snapshot = self.snapshot_of(attempt, checkpoint_id)
        if snapshot is None:
            return {}
        arrived = {(a.key, a.n) for a in self.arrivals if a.attempt == attempt and a.id <= snapshot.last_arrival}
        result = {}
        for key, recorded in self.recorded_after_restore(attempt).items():
            early = [n for i, n in enumerate(recorded)
                     if (key, n) in arrived and any((key, m) not in arrived for m in recorded[:i])]
            if early:
                missing = [m for m in recorded[:recorded.index(early[-1])] if (key, m) not in arrived]
                result[key] = (early, missing)
        return result

    def upstream_instances(self) -> dict[int, set[int]]:
        """Per lane (partition), the upstream subtasks that emitted its records."""
        instances: dict[int, set[int]] = defaultdict(set)
        for emission in self.emissions:
            instances[emission.lane].add(emission.instance)
        return dict(instances)

    def outputs_by_position(self) -> dict[tuple[str, int], set[str]]:
        """Per (key, seq), the distinct outputs the operator emitted for it over all attempts."""
        distinct: dict[tuple[str, int], set[str]] = defaultdict(set)
        for output in self.outputs:
            distinct[(output.key, output.seq)].add(output.output)
        return dict(distinct)

    def ready_for_failure(self, key: str, n: int, keys: int) -> bool:
        """Whether a failure now makes the restore replay, for ``keys`` keys, inputs of both instances that ran.

        True when, in the current attempt: a checkpoint that covers some input completed; after the latest
        agent snapshot (completed or still under way: the restore replays at least what follows it) at least
        ``keys`` keys finished a complete round (inputs ``2j`` and ``2j + 1``, one per instance, their outputs
        left the operator); and input (``key``, ``n``) arrived after that snapshot too.
        """
        if not self.arrivals:
            return False
        attempt = self.arrivals[-1].attempt
        covering = [c for c in self.completions if c.attempt == attempt
                    and (self.snapshot_of(attempt, c.checkpoint_id) or Snapshot(0, 0, 0, 0, 0)).last_arrival > 0]
        snapshots = [s for s in self.snapshots if s.attempt == attempt]
        if not covering or not snapshots:
            return False
        after = {(a.key, a.n) for a in self.arrivals_after(snapshots[-1])}
        if (key, n) not in after:
            return False
        done = defaultdict(set)
        for output in self.outputs:
            if output.attempt == attempt and (output.key, output.n) in after:
                done[output.key].add(output.n)
        full = [k for k, ns in done.items() if any(m % 2 == 0 and m + 1 in ns for m in ns)]
        return len(full) >= keys


# -- the job's functions ---------------------------------------------------------------------------
class LanePacer(FlatMapFunction):
    """Emits each lane record at its slot (``origin + pos * period + delay[instance]``), or drops it.

    The origin of an attempt is fixed once the agent of that attempt has finished its restore (an
    :class:`ObservedOperator` records it) and every upstream instance has its first record, so that the
    lane resuming at the lower position starts ``start_margin_ms`` later and neither lane starts behind its
    schedule (records sent while the agent still reads its journal, or a lane whose reader started late,
    would reach the agent in one burst, in an order no pacing decides). Each wait is bounded by
    ``start_wait_s`` (a lane that has no record left in an attempt never checks in).
    """

    def __init__(self, control: UpstreamControl, recorder: JobRecorder, start_wait_s: float = 10.0):
        self.control = control
        self.recorder = recorder
        self.start_wait_s = start_wait_s

    def open(self, runtime_context) -> None:
        info = subtask_info(runtime_context)
        self.instance, self.instances, self.attempt = info.index, info.parallelism, info.attempt
        self.origin = None
        self.last_emitted = 0.0

    def _start(self, pos: int, settings: Mapping[str, Any]) -> float:
        deadline = time.monotonic() + self.start_wait_s
        while self.recorder.agent_ready_at(self.attempt) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        self.recorder.check_in(self.attempt, self.instance, pos)
        while len(self.recorder.check_ins(self.attempt)) < self.instances and time.monotonic() < deadline:
            time.sleep(0.02)
        check_ins = self.recorder.check_ins(self.attempt)
        ready = self.recorder.agent_ready_at(self.attempt) or 0.0
        start = max(ready, *(t for _, _, t in check_ins)) + settings["start_margin_ms"] / 1000
        first = min(p for _, p, _ in check_ins)
        return self.recorder.origin(self.attempt, start - first * settings["period_ms"] / 1000)

    def flat_map(self, raw):
        record = json.loads(raw)
        settings = self.control.read()
        if [record["key"], record["n"]] in settings.get("drop", []):
            self.recorder.emitted(self.attempt, self.instance, record, dropped=True)
            return
        if self.origin is None:
            self.origin = self._start(record["pos"], settings)
        due = self.origin + (record["pos"] * settings["period_ms"] + settings["delay_ms"][self.instance]) / 1000
        due = max(due, self.last_emitted + settings.get("gap_ms", [0.0] * LANES)[self.instance] / 1000)
        pause = due - time.time()
        if pause > 0:
            time.sleep(pause)
        self.last_emitted = time.time()
        self.recorder.emitted(self.attempt, self.instance, record)
        yield record


class ObservedOperator(ActionExecutionOperator):
    """The agent operator, unchanged, plus records: arrivals, emitted outputs, snapshots, completed checkpoints.

    ``after_checkpoint(attempt, checkpoint_id)``, if given, runs after each completed checkpoint was
    handled (a test's fault injection may raise there: the task then fails over).
    """

    def __init__(self, agent: Agent, config: AgentConfig, key_type: str, recorder: JobRecorder,
                 after_checkpoint: Callable[[int, int], None] | None = None):
        super().__init__(agent, config, key_type)
        self.recorder = recorder
        self.after_checkpoint = after_checkpoint

    def open(self, runtime_context) -> None:
        super().open(runtime_context)
        self.attempt = subtask_info(runtime_context).attempt

    def initialize_state(self, values: list[bytes]) -> None:
        super().initialize_state(values)
        self.recorder.agent_ready(self.attempt)

    def process_element(self, value, ctx):
        self.recorder.arrived(self.attempt, ctx.get_current_key(), value)
        yield from self._recorded(super().process_element(value, ctx))

    def on_timer(self, timestamp, ctx):
        yield from self._recorded(super().on_timer(timestamp, ctx))

    def _recorded(self, outputs):
        for output in outputs or ():
            if isinstance(output, AgentOutput):
                self.recorder.output(self.attempt, output)
            yield output

    def snapshot_state(self, checkpoint_id: int, timestamp_ms: int):
        marker = super().snapshot_state(checkpoint_id, timestamp_ms)
        self.recorder.snapshot(self.attempt, checkpoint_id)
        return marker

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        super().notify_checkpoint_complete(checkpoint_id)
        self.recorder.completed(self.attempt, checkpoint_id)
        if self.after_checkpoint is not None:
            self.after_checkpoint(self.attempt, checkpoint_id)


def connect_observed_agent(keyed_stream, agent: Agent, config: AgentConfig | Mapping[str, Any], recorder: JobRecorder,
                           after_checkpoint: Callable[[int, int], None] | None = None):
    """:func:`~flink_agents_replay.flink.pipeline.connect_to_agent` with an :class:`ObservedOperator`.

    Goes through the pipeline's private ``_connect_to_agent`` (the public function has no operator hook): the
    same checks, uid and checkpoint bridge as a user's job, only the operator instance is the recording one.
    """
    from flink_agents_replay.flink.pipeline import _connect_to_agent

    def observed(agent: Agent, resolved: AgentConfig, key_type: str) -> ObservedOperator:
        return ObservedOperator(agent, resolved, key_type, recorder, after_checkpoint)

    return _connect_to_agent(keyed_stream, agent, config, check_journal=True, make_operator=observed)


def run_lane_job(bootstrap_servers: str, input_topic: str, agent: Agent, config: Mapping[str, Any],
                 recorder: JobRecorder, control: UpstreamControl, *, until_outputs: int, timeout_s: float = 120.0,
                 checkpoint_interval_ms: int = 200, checkpoint_min_pause_ms: int = 500, restart_attempts: int = 3,
                 after_checkpoint: Callable[[int, int], None] | None = None) -> list[tuple]:
    """Run the two-upstream job on a MiniCluster until ``until_outputs`` outputs were committed; return them.

    Outputs are ``(key, seq, output as sorted JSON)``, collected with ``execute_and_collect`` (exactly once
    across failovers). The input is unbounded. Raises ``AssertionError`` when the outputs do not arrive
    within ``timeout_s`` (the job is cancelled then). The pause after each checkpoint
    (``checkpoint_min_pause_ms``) leaves stretches in which no agent snapshot holds the task thread, so paced
    inputs reach the agent in their emission order.
    """
    from pyflink.common import Types, WatermarkStrategy
    from pyflink.common.serialization import SimpleStringSchema
    from pyflink.datastream.connectors.kafka import KafkaOffsetsInitializer, KafkaSource

    from flink_agents_replay.flink.env import create_environment
    from flink_agents_replay.local.jars import kafka_connector_jar

    env = create_environment(parallelism=1, checkpoint_interval_ms=checkpoint_interval_ms,
                             restart_attempts=restart_attempts, jars=[kafka_connector_jar()],
                             config={"execution.checkpointing.min-pause": f"{checkpoint_min_pause_ms} ms"})
    env.set_buffer_timeout(0)  # every record leaves its upstream instance at once: arrival order = emission order
    source = (KafkaSource.builder().set_bootstrap_servers(bootstrap_servers).set_topics(input_topic)
              .set_group_id(f"lanes-{uuid.uuid4().hex[:8]}")
              .set_starting_offsets(KafkaOffsetsInitializer.earliest())
              .set_value_only_deserializer(SimpleStringSchema()).build())
    lanes = env.from_source(source, WatermarkStrategy.no_watermarks(), "lanes").uid("lanes").set_parallelism(LANES)
    paced = lanes.flat_map(LanePacer(control, recorder), output_type=Types.PICKLED_BYTE_ARRAY())
    paced = paced.uid("lane-pacer").set_parallelism(LANES)
    keyed = paced.key_by(lambda record: record["key"], key_type=Types.STRING())
    outputs = connect_observed_agent(keyed, agent, config, recorder, after_checkpoint)
    rows = outputs.map(canonical_output, output_type=Types.PICKLED_BYTE_ARRAY())
    with rows.execute_and_collect(f"agent {agent.name} behind two upstream instances") as results:
        return collect_outputs(results, until_outputs, timeout_s)


# -- the agent and its faults ----------------------------------------------------------------------
class Remembered(Event):
    """The first action's result: the input's number and the key's history including it."""


def history_agent(counter: InvocationCounter, *, name: str = "history", call_delay_s: float = 0.0,
                  fault: Callable[[str, int], None] | None = None) -> Agent:
    """A stateful agent: memory holds the key's inputs in the order they ran; every output reports them.

    ``remember`` calls ``lookup(key, n)``, then ``fault(key, n)`` if given (it may raise), appends ``n`` to
    the history in memory and sends it on; ``respond`` calls ``writer(key, n, history)`` (an ``external``
    tool: its argument depends on the preceding inputs) and emits ``{"n", "history", "text"}``. Each real
    tool invocation counts ``call:<tool>:<key>:<n>`` in ``counter``: one logical call per input and tool.
    """

    def tool(tool_name: str):
        def invoke(key: str, n: int, *context: Any) -> str:
            counter.increment(f"call:{tool_name}:{key}:{n}")
            if call_delay_s:
                time.sleep(call_delay_s)
            return f"{tool_name}({key}:{n}{'|' if context else ''}{','.join(map(str, context))})"
        invoke.__qualname__ = tool_name
        return invoke

    class HistoryAgent(Agent):
        @action(InputEvent)
        def remember(event, ctx):
            n = event.input["n"]
            seen = ctx.call("lookup", ctx.key, n)
            if fault is not None:
                fault(ctx.key, n)
            history = [*ctx.memory.get("history", []), n]
            ctx.memory.set("history", history)
            ctx.send_event(Remembered(n=n, history=history, seen=seen))

        @action(Remembered)
        def respond(event, ctx):
            text = ctx.call("writer", ctx.key, event.n, event.history)
            ctx.send_event(OutputEvent(output={"n": event.n, "history": event.history, "text": text}))

    return HistoryAgent(name=name, resources={"lookup": Tool(tool("lookup"), side_effects="none"),
                                              "writer": Tool(tool("writer"), side_effects="external")})


@dataclass
class FailOnceAfterCheckpoint:
    """The agent's fault: raise :class:`InjectedFailure` once, when a restore would replay work of every key.

    Fires in the run of an input once :meth:`JobRecord.ready_for_failure` holds (a checkpoint completed and
    ``keys`` keys finished a round of both instances' inputs after the latest snapshot). Claimed atomically in
    ``counter`` (``fault_claims``/``fault_fired``): once per counter file, whatever runs race. Just before
    raising it applies ``control_changes`` and, with ``swap_delays``, swaps the upstream instances' delays
    (the restored attempt sees the other interleaving); with ``drop_input`` the upstream skips this run's
    input from now on, so a recorded input never comes back; given ``last_n`` (the largest ``n`` of a key), it
    fires only at an input its lane sends another of after (``n + 2 <= last_n``), so that a later input of the
    key arrives after the restore and waits for the dropped one (at a key's last input nothing would wait).
    """

    counter: InvocationCounter
    recorder: JobRecorder
    control: UpstreamControl
    keys: int
    swap_delays: bool = True
    drop_input: bool = False
    control_changes: dict = field(default_factory=dict)
    last_n: int | None = None

    def __call__(self, key: str, n: int) -> None:
        if self.last_n is not None and n + 2 > self.last_n:
            return
        if self.counter.count("fault_fired") or not self.recorder.read().ready_for_failure(key, n, self.keys):
            return
        if self.counter.increment("fault_claims") != 1:
            return
        self.counter.increment("fault_fired")
        if self.swap_delays:
            self.control.swap_delays()
        changes = dict(self.control_changes)
        if self.drop_input:
            changes["drop"] = [*self.control.read().get("drop", []), [key, n]]
        if changes:
            self.control.update(**changes)
        self.recorder.fault("first", {"key": key, "n": n})
        raise InjectedFailure(f"injected failure in the run of {key} n={n}")


@dataclass
class FailOnceWhileWaiting:
    """A second fault, after the first: fail once a checkpoint completed while a key waited for a predecessor.

    Runs as the observed operator's ``after_checkpoint``: when the completed checkpoint's snapshot held a
    replayed input whose recorded predecessor had not arrived again (:meth:`JobRecord.waiting_at`), it
    applies ``control_changes`` and raises :class:`InjectedFailure` (claimed once, ``second_fault_*``).
    """

    counter: InvocationCounter
    recorder: JobRecorder
    control: UpstreamControl
    control_changes: dict = field(default_factory=dict)

    def __call__(self, attempt: int, checkpoint_id: int) -> None:
        if not self.counter.count("fault_fired") or self.counter.count("second_fault_fired"):
            return
        waiting = self.recorder.read().waiting_at(attempt, checkpoint_id)
        if not waiting or self.counter.increment("second_fault_claims") != 1:
            return
        self.counter.increment("second_fault_fired")
        if self.control_changes:
            self.control.update(**self.control_changes)
        self.recorder.fault("second", {"checkpoint": checkpoint_id, "waiting": waiting})
        raise InjectedFailure(f"injected failure after checkpoint {checkpoint_id}; waiting keys: {sorted(waiting)}")
