"""The checkpoint bridge on a real MiniCluster: Python checkpoint hooks, restore, rescale, fusion, failures.

This is also the bridge's upgrade guard: it relies on PyFlink internals, so a PyFlink upgrade that breaks
it must turn these tests red. Every hook call is appended, from inside the Flink worker, to a JSON-lines
file in the test's temp directory; the tests wait for conditions in that file (never for time) and then
assert on the recorded calls.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from pyflink.common import Types, WatermarkStrategy
from pyflink.datastream import KeyedProcessFunction, MapFunction
from pyflink.datastream.connectors.number_seq import NumberSequenceSource

from flink_agents_replay.flink.checkpoint_bridge import CheckpointHooks, process_with_checkpoint_hooks
from flink_agents_replay.flink.checkpoint_bridge.wiring import BRIDGE_OPERATOR_CLASS, DEFAULT_OPERATOR_NAME
from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.runtime_info import subtask_info
from flink_agents_replay.testing.jobs import running_job, stop_with_savepoint, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

CHECKPOINT_MS = 200
JOB_TIMEOUT_S = 90
UNBOUNDED = 2**62


class EventLog:
    """Append-only JSON-lines file shared by the test and the Flink worker (pickles as its path)."""

    def __init__(self, path: Path):
        self.path = str(path)

    def record(self, event: str, **fields) -> None:
        line = json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one short O_APPEND write: lines from parallel subtasks never interleave
        finally:
            os.close(fd)

    def events(self, **match) -> list[dict]:
        if not os.path.exists(self.path):
            return []
        with open(self.path, encoding="utf-8") as handle:
            rows = [json.loads(line) for line in handle if line.endswith("\n")]
        return [row for row in rows if all(row.get(k) == v for k, v in match.items())]


class Recording(CheckpointHooks, KeyedProcessFunction):
    """Records open, every hook, the first element and close; snapshots 'subtask:checkpoint:count'."""

    def __init__(self, log: EventLog, run: str = "run", emit_below: int = 0):
        self.log = log
        self.run = run
        self.emit_below = emit_below

    def open(self, runtime_context):
        info = subtask_info(runtime_context)
        self.subtask, self.attempt = info.index, info.attempt
        self.count = 0
        self.record("open")

    def record(self, event: str, **fields) -> None:
        self.log.record(event, run=self.run, subtask=self.subtask, attempt=self.attempt, **fields)

    def restored_checkpoint(self, checkpoint_id):
        self.record("restored_checkpoint", checkpoint_id=checkpoint_id)

    def initialize_state(self, values):
        types = sorted({type(v).__name__ for v in values})
        self.record("initialize", values=sorted(v.decode() for v in values), types=types)

    def process_element(self, value, ctx):
        if self.count == 0:
            self.record("first_element")
        self.count += 1
        if value < self.emit_below:
            yield value

    def snapshot_state(self, checkpoint_id, timestamp_ms):
        value = f"{self.subtask}:{checkpoint_id}:{self.count}"
        self.record("snapshot", checkpoint_id=checkpoint_id, value=value, timestamp_ms=timestamp_ms, now=time.time())
        return value.encode()

    def notify_checkpoint_complete(self, checkpoint_id):
        self.record("complete", checkpoint_id=checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id):
        self.record("aborted", checkpoint_id=checkpoint_id)

    def close(self):
        self.record("close", count=self.count)


class FailOnceAfterCheckpoint(Recording):
    """Subtask 0 of the first attempt raises on its first element after its second completed checkpoint.

    It also takes the task-stop signal: a thread of its own (as an agent run's) watches it, and ``close`` records
    whether it saw the task being failed (subtask 0) or cancelled (subtask 1, by the failover) before the close."""

    def open(self, runtime_context):
        super().open(runtime_context)
        self.completed: list[int] = []
        self.task_stop = None

    def attach_task_stop(self, signal):
        import threading

        from flink_agents_replay.flink.checkpoint_bridge.task_stop import TaskStop

        self.record("task_stop", execution_state=bool(signal.watchesExecutionState()))
        self.task_stop, self.stop_seen = TaskStop(signal), threading.Event()

        def watch():
            while not self.task_stop.stopping():
                time.sleep(0.001)
            self.stop_seen.set()

        threading.Thread(target=watch, daemon=True).start()

    def close(self):
        seen = self.task_stop is not None and self.stop_seen.wait(5)
        self.record("close", count=self.count, task_stop_seen=seen)
        if self.task_stop is not None:
            self.task_stop.close()

    def notify_checkpoint_complete(self, checkpoint_id):
        super().notify_checkpoint_complete(checkpoint_id)
        self.completed.append(checkpoint_id)

    def process_element(self, value, ctx):
        if self.attempt == 0 and self.subtask == 0 and len(self.completed) >= 2:
            self.record("planned_failure", after_checkpoint=self.completed[-1])
            raise RuntimeError(f"planned failure after checkpoint {self.completed[-1]}")
        yield from super().process_element(value, ctx)


class FailingHook(Recording):
    """Raises a ValueError with a recognisable message from the hook named ``failing``."""

    def __init__(self, log: EventLog, failing: str):
        super().__init__(log)
        self.failing = failing

    def explode(self, hook: str, argument) -> None:
        if hook == self.failing:
            raise ValueError(f"{hook} exploded at {argument!r} (marker 7f3a)")

    def initialize_state(self, values):
        self.explode("initialize_state", values)

    def snapshot_state(self, checkpoint_id, timestamp_ms):
        self.explode("snapshot_state", checkpoint_id)
        return super().snapshot_state(checkpoint_id, timestamp_ms)

    def notify_checkpoint_complete(self, checkpoint_id):
        self.explode("notify_checkpoint_complete", checkpoint_id)


class OnlySomeHooks(KeyedProcessFunction):
    """No CheckpointHooks base and no initialize_state: the missing hooks are simply not called."""

    def __init__(self, log: EventLog):
        self.log = log

    def open(self, runtime_context):
        self.seen = 0

    def process_element(self, value, ctx):
        self.seen += 1
        return []

    def snapshot_state(self, checkpoint_id, timestamp_ms):
        self.log.record("snapshot", checkpoint_id=checkpoint_id, seen=self.seen)
        return None

    def notify_checkpoint_complete(self, checkpoint_id):
        self.log.record("complete", checkpoint_id=checkpoint_id)

    def close(self):
        self.log.record("close", seen=self.seen)


class CountingMap(MapFunction):
    def __init__(self, log: EventLog):
        self.log = log

    def open(self, runtime_context):
        self.mapped = 0

    def map(self, value):
        self.mapped += 1
        return value * 2

    def close(self):
        self.log.record("map_close", mapped=self.mapped)


# --- helpers -----------------------------------------------------------------------------------------------


def unbounded_numbers(env):
    source = NumberSequenceSource(0, UNBOUNDED)
    return env.from_source(source, WatermarkStrategy.no_watermarks(), "numbers").uid("numbers")


def keyed(stream):
    return stream.key_by(lambda x: x % 16, key_type=Types.LONG())


def by_subtask(events: list[dict]) -> dict[int, list[dict]]:
    grouped: dict[int, list[dict]] = {}
    for event in events:
        grouped.setdefault(event["subtask"], []).append(event)
    return grouped


def completes_per_subtask(log: EventLog, run: str, parallelism: int, at_least: int, attempt: int = 0):
    def condition() -> bool:
        counts = by_subtask(log.events(run=run, event="complete", attempt=attempt))
        return len(counts) == parallelism and all(len(c) >= at_least for c in counts.values())

    return condition













def jvm_pid() -> int:
    from pyflink.java_gateway import get_gateway

    return get_gateway().jvm.ProcessHandle.current().pid()


def stream_nodes(env) -> list:
    graph = env._generate_stream_graph(False)
    return list(graph.getStreamNodes().toArray())


def operator_class(node) -> str:
    """Class of the node's operator (of its factory when the factory is not a SimpleOperatorFactory)."""
    factory = node.getOperatorFactory()
    if factory.getClass().getName().endswith(".SimpleOperatorFactory"):
        return factory.getOperator().getClass().getName()
    return factory.getClass().getName()


# --- tests ---------------------------------------------------------------------------------------------------


def test_smoke_hooks_are_called_in_order(tmp_path):
    """Upgrade guard: initialize once before the first element, snapshots and completions with matching ids."""
    log = EventLog(tmp_path / "events.jsonl")
    env = create_environment(parallelism=2, checkpoint_interval_ms=CHECKPOINT_MS)
    process_with_checkpoint_hooks(keyed(unbounded_numbers(env)), Recording(log), Types.LONG()).print()

    with running_job(env, "bridge smoke") as client:
        wait_until(client, completes_per_subtask(log, "run", 2, at_least=3), "3 completed checkpoints per subtask")

    events = log.events(run="run")
    assert {e["attempt"] for e in events} == {0}
    grouped = by_subtask(events)
    assert sorted(grouped) == [0, 1]
    snapshot_ids = {}
    for subtask, rows in grouped.items():
        names = [e["event"] for e in rows]
        initializes = [e for e in rows if e["event"] == "initialize"]
        assert len(initializes) == 1, f"subtask {subtask}: initialize_state called {len(initializes)} times"
        assert initializes[0]["values"] == []
        assert names.index("open") < names.index("initialize") < names.index("first_element"), names[:5]
        snapshots = [e["checkpoint_id"] for e in rows if e["event"] == "snapshot"]
        assert snapshots == sorted(set(snapshots)), f"subtask {subtask}: snapshot ids {snapshots}"
        snapshot_ids[subtask] = set(snapshots)
        completes = 0
        for position, event in enumerate(rows):
            if event["event"] == "complete":
                completes += 1
                # Completion is notified after this subtask's own snapshot of the same checkpoint.
                assert any(
                    e["event"] == "snapshot" and e["checkpoint_id"] == event["checkpoint_id"] for e in rows[:position]
                ), f"subtask {subtask}: complete({event['checkpoint_id']}) without an earlier snapshot"
        assert completes >= 3
    # Each checkpoint has one trigger time, the same in every subtask, later for a later checkpoint, and past.
    times = {(e["checkpoint_id"], e["timestamp_ms"]) for e in log.events(run="run", event="snapshot")}
    assert len(times) == len({checkpoint for checkpoint, _ in times}), times
    assert [t for _, t in sorted(times)] == sorted(t for _, t in times)
    assert all(e["timestamp_ms"] / 1000 <= e["now"] for e in log.events(run="run", event="snapshot"))
    # A completed checkpoint holds the snapshots of every subtask.
    for event in log.events(run="run", event="complete"):
        assert all(event["checkpoint_id"] in ids for ids in snapshot_ids.values()), event
    # The hooks run embedded, in the JVM of the MiniCluster (thread mode), not in this client process.
    assert {e["pid"] for e in events} == {jvm_pid()}


def test_restore_after_failure_gets_last_completed_snapshot(tmp_path):
    log = EventLog(tmp_path / "events.jsonl")
    env = create_environment(
        parallelism=2,
        checkpoint_interval_ms=CHECKPOINT_MS,
        restart_attempts=1,
        # A pause after each checkpoint: the planned failure always lands before the next checkpoint starts.
        config={"execution.checkpointing.min-pause": "300 ms"},
    )
    process_with_checkpoint_hooks(keyed(unbounded_numbers(env)), FailOnceAfterCheckpoint(log), Types.LONG()).print()

    def restarted() -> bool:
        return len(log.events(event="initialize", attempt=1)) == 2

    with running_job(env, "bridge restore") as client:
        wait_until(client, restarted, "both subtasks re-initialized after the restart")

    failures = log.events(event="planned_failure")
    assert len(failures) == 1
    checkpoint_id = failures[0]["after_checkpoint"]
    expected = sorted(
        e["value"] for e in log.events(event="snapshot", attempt=0) if e["checkpoint_id"] == checkpoint_id
    )
    assert len(expected) == 2, f"both subtasks snapshot checkpoint {checkpoint_id}"
    first_attempt = log.events(event="initialize", attempt=0)
    assert [e["values"] for e in first_attempt] == [[], []]
    for event in log.events(event="initialize", attempt=1):
        assert event["values"] == expected, f"subtask {event['subtask']} restored {event['values']}"
        assert event["types"] == ["bytes"]
    # Both subtasks of the failed attempt learnt from the task-stop signal that their task was being failed or
    # cancelled (the StreamTask's flags, set before the close), from a thread that is not the task thread.
    assert [e["task_stop_seen"] for e in log.events(event="close", attempt=0)] == [True, True]
    # It reads the TaskManager task's execution state too (a private field of Flink's runtime environment: this is the
    # upgrade guard for it), which turns CANCELING or FAILED before the StreamTask's flags.
    assert [e["execution_state"] for e in log.events(event="task_stop")] == [True] * 4
    # The restored checkpoint's id comes first, only in the attempt that restored.
    assert not log.events(event="restored_checkpoint", attempt=0)
    restored = log.events(event="restored_checkpoint", attempt=1)
    assert [e["checkpoint_id"] for e in restored] == [checkpoint_id] * 2
    for subtask, rows in by_subtask(log.events(attempt=1)).items():
        names = [e["event"] for e in rows]
        assert names.index("open") < names.index("restored_checkpoint") < names.index("initialize"), (subtask, names)


def test_rescale_through_savepoint_delivers_union_state(tmp_path):
    log = EventLog(tmp_path / "events.jsonl")
    savepoints = tmp_path / "savepoints"

    def build(parallelism: int, run: str, config: dict | None = None):
        env = create_environment(
            parallelism=parallelism, max_parallelism=128, checkpoint_interval_ms=CHECKPOINT_MS, config=config
        )
        process_with_checkpoint_hooks(
            keyed(unbounded_numbers(env)), Recording(log, run=run), Types.LONG()
        ).uid("bridged").print()
        return env

    old = build(2, "old")
    with running_job(old, "bridge rescale p=2") as client:
        wait_until(client, completes_per_subtask(log, "old", 2, at_least=1), "a completed checkpoint")
        savepoint = stop_with_savepoint(client, savepoints)
    old_snapshots = by_subtask(log.events(run="old", event="snapshot"))
    # The savepoint is the last snapshot each old subtask took.
    written = sorted(rows[-1]["value"] for rows in old_snapshots.values())
    assert len(written) == 2 and len({v.split(":")[1] for v in written}) == 1, written

    new = build(3, "new", {"execution.savepoint.path": savepoint})
    with running_job(new, "bridge rescale p=3") as client:
        wait_until(client, lambda: len(log.events(run="new", event="initialize")) == 3, "3 subtasks initialized")

    initialized = log.events(run="new", event="initialize")
    assert sorted(e["subtask"] for e in initialized) == [0, 1, 2]
    for event in initialized:
        assert event["values"] == written, f"new subtask {event['subtask']} got {event['values']}"
    # A savepoint's checkpoint id reaches every new subtask, as a checkpoint's does.
    restored = log.events(run="new", event="restored_checkpoint")
    assert [e["checkpoint_id"] for e in restored] == [int(written[0].split(":")[1])] * 3


def _fused_pipeline(env, log: EventLog):
    numbers = env.from_collection(list(range(3000)), type_info=Types.LONG())
    hooked = process_with_checkpoint_hooks(keyed(numbers), Recording(log, emit_below=6), Types.LONG()).uid("hooked")
    hooked.map(CountingMap(log), output_type=Types.LONG()).print()


def test_fused_downstream_map_keeps_the_hooks(tmp_path):
    log = EventLog(tmp_path / "events.jsonl")
    # The graph: PyFlink's optimizer fuses the map into the bridge operator via copy(); the bridge survives.
    plan_env = create_environment(parallelism=2, checkpoint_interval_ms=CHECKPOINT_MS)
    _fused_pipeline(plan_env, log)
    nodes = stream_nodes(plan_env)
    bridged = [n for n in nodes if operator_class(n) == BRIDGE_OPERATOR_CLASS]
    assert len(bridged) == 1, [operator_class(n) for n in nodes]
    assert bridged[0].getOperatorName() == f"{DEFAULT_OPERATOR_NAME}, Map", "the map was not fused"
    assert not [n for n in nodes if n.getOperatorName() == "Map"], "the map was not fused"
    assert bridged[0].getTransformationUID() == "hooked"

    env = create_environment(parallelism=2, checkpoint_interval_ms=CHECKPOINT_MS)
    _fused_pipeline(env, log)
    env.execute("bridge fusion")

    events = log.events(run="run")
    assert sum(e["count"] for e in events if e["event"] == "close") == 3000
    assert sum(e["mapped"] for e in log.events(event="map_close")) == 6
    for subtask, rows in by_subtask(events).items():
        names = [e["event"] for e in rows]
        assert names[:2] == ["open", "initialize"], names[:3]
        assert "snapshot" in names and "complete" in names, f"subtask {subtask}: {names}"
        # End of a bounded input: the final checkpoint reaches the live function; close() comes last.
        assert names[-1] == "close", names[-4:]
        last_snapshot = max(i for i, n in enumerate(names) if n == "snapshot")
        assert rows[last_snapshot]["value"].endswith(f":{rows[-1]['count']}"), "final snapshot saw every element"


def test_uid_name_and_max_parallelism_reach_the_bridge_node(tmp_path):
    connector = tmp_path / "some-connector.jar"
    connector.write_bytes(b"")
    env = create_environment(parallelism=2, jars=[connector])
    hooked = process_with_checkpoint_hooks(keyed(unbounded_numbers(env)), Recording(EventLog(tmp_path / "e")))
    hooked.uid("x").set_max_parallelism(300).name("hooked operator")
    hooked.print()

    [node] = [n for n in stream_nodes(env) if operator_class(n) == BRIDGE_OPERATOR_CLASS]
    assert node.getTransformationUID() == "x"
    assert node.getMaxParallelism() == 300
    assert node.getOperatorName() == "hooked operator"
    # The bridge jar is appended to pipeline.jars; a jar configured before stays.
    from pyflink.java_gateway import get_gateway
    from pyflink.util.java_utils import get_j_env_configuration

    jars_option = get_gateway().jvm.org.apache.flink.configuration.PipelineOptions.JARS
    jars = list(get_j_env_configuration(env._j_stream_execution_environment).get(jars_option))
    assert len(jars) == 2 and Path(jars[0].removeprefix("file:")).name == "some-connector.jar", jars
    assert jars[1].endswith("flink-agents-replay-checkpoint-bridge.jar")


@pytest.mark.parametrize("hook", ["snapshot_state", "initialize_state", "notify_checkpoint_complete"])
def test_exception_in_a_hook_fails_the_job_with_the_python_message(tmp_path, hook):
    log = EventLog(tmp_path / "events.jsonl")
    env = create_environment(parallelism=1, checkpoint_interval_ms=CHECKPOINT_MS)
    process_with_checkpoint_hooks(keyed(unbounded_numbers(env)), FailingHook(log, hook), Types.LONG()).print()

    with pytest.raises(Exception) as failure:
        env.execute(f"bridge failing {hook}")
    text = str(failure.value)
    assert f"Python {hook}(" in text, text[-3000:]
    assert f"ValueError: {hook} exploded at" in text and "(marker 7f3a)" in text, text[-3000:]
    assert "Traceback (most recent call last)" in text, "the Python traceback is part of the failure"


def test_process_mode_job_still_runs_the_function_embedded(tmp_path):
    log = EventLog(tmp_path / "events.jsonl")
    env = create_environment(
        parallelism=1, checkpoint_interval_ms=CHECKPOINT_MS, config={"python.execution-mode": "process"}
    )
    numbers = env.from_collection(list(range(500)), type_info=Types.LONG())
    upstream = numbers.map(CountingMap(log), output_type=Types.LONG())  # a plain Python operator: process mode
    process_with_checkpoint_hooks(keyed(upstream), OnlySomeHooks(log), Types.LONG()).print()
    env.execute("bridge in a process-mode job")

    [upstream_close] = log.events(event="map_close")
    assert upstream_close["mapped"] == 500
    assert upstream_close["pid"] != jvm_pid(), "the job's own Python operators did not run in process mode"
    events = [e for e in log.events() if e["event"] != "map_close"]
    assert events[-1] == {"event": "close", "pid": events[-1]["pid"], "seen": 500}
    snapshots = [e for e in events if e["event"] == "snapshot"]
    assert snapshots and snapshots[-1]["seen"] == 500
    assert any(e["event"] == "complete" for e in events)
    assert {e["pid"] for e in events} == {jvm_pid()}, "the hooked function did not run inside the JVM (embedded)"
