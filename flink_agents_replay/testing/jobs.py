"""A small agent job for integration tests and benchmarks: Kafka input topic -> agent -> collected outputs.

Inputs are JSON records ``{"key": ..., "n": ...}`` in a one-partition topic (one upstream instance, so a
key's inputs come back in the same order after a restore). The job reads them with a bounded
``KafkaSource`` (replayed from the checkpointed offsets after a failure), keys them by ``key`` and runs
the agent. Outputs are collected with ``execute_and_collect``.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from flink_agents_replay.api.agent import Agent
from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.operator import AgentOutput
from flink_agents_replay.integrations.kafka.settings import LIBRDKAFKA_LOGGER
from flink_agents_replay.jobs.connector import connector_jars_from_environment

__all__ = [
    "canonical_output",
    "connector_jars",
    "collect_outputs",
    "exactly_once_string_sink",
    "failure_free_outputs",
    "job_ended",
    "job_script",
    "keyed_json_inputs",
    "make_inputs",
    "produce_inputs",
    "reference_outputs",
    "run_agent_job",
    "running_job",
    "stop_with_savepoint",
    "trigger_savepoint",
    "wait_until",
]


def connector_jars() -> list[str]:
    """Flink's Kafka connector for test jobs: ``$FLINK_AGENTS_REPLAY_KAFKA_CONNECTOR`` (paths separated by ``;``)
    if set, else the development tools' copy (fetched from Maven Central and checked against ``jars.lock``)."""
    given = connector_jars_from_environment()
    if given:
        return given
    from flink_agents_replay.local.jars import kafka_connector_jar

    return [str(kafka_connector_jar())]


def make_inputs(keys: int, per_key: int) -> list[dict]:
    """``keys * per_key`` inputs, interleaved across keys."""
    return [{"key": f"key-{k:03d}", "n": i} for i in range(per_key) for k in range(keys)]


def produce_inputs(bootstrap_servers: str, records: Iterable[dict], topic: str | None = None) -> str:
    """Create a one-partition topic and write ``records`` to it as JSON; return the topic."""
    topic = topic or f"agent-input-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "logger": LIBRDKAFKA_LOGGER})
    for future in admin.create_topics([NewTopic(topic, 1, 1)], request_timeout=30).values():
        future.result(timeout=60)
    produce_json(bootstrap_servers, topic, records)
    return topic


def produce_json(bootstrap_servers: str, topic: str, records: Iterable[dict]) -> None:
    """Write ``records`` to the existing ``topic`` as JSON, keyed by their ``"key"``; wait for the acks."""
    producer = Producer({"bootstrap.servers": bootstrap_servers, "logger": LIBRDKAFKA_LOGGER,
                         "enable.idempotence": True})
    for record in records:
        producer.produce(topic, json.dumps(record).encode(), key=record["key"].encode())
    if producer.flush(60):
        raise RuntimeError("input records were not acknowledged")


def canonical_output(output: AgentOutput) -> tuple:
    """(key, seq, output as sorted JSON): comparable across runs."""
    return (output.key, output.seq, json.dumps(output.output, sort_keys=True))


@contextmanager
def job_script(path: str | Path) -> Iterator[Any]:
    """Import a job script (``jobs/X.py``) as a module for the length of the block.

    Under ``flink run -py`` a job is ``__main__`` and its functions ship to Flink by value; imported, they
    would be pickled by reference to a module the worker cannot import, so it is registered by value.
    """
    import importlib.util
    import sys

    import cloudpickle

    path = Path(path)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        cloudpickle.register_pickle_by_value(module)
        try:
            yield module
        finally:
            cloudpickle.unregister_pickle_by_value(module)
    finally:
        del sys.modules[spec.name]


def failure_free_outputs(agent: Agent, inputs: Iterable[Any], key_of: Callable[[Any], str] = lambda r: r["key"],
                         max_parallelism: int = 128) -> list[AgentOutput]:
    """What a job without failures outputs: ``agent`` run in this process, input by input, each key's inputs
    in the given order (its seqs), with no journal. The reference tests compare a failed-over job with."""
    from flink_agents_replay.core.keygroups import key_group
    from flink_agents_replay.engine import RunInput, execute_run

    memory: dict[Any, dict] = {}
    seqs: dict[Any, int] = {}
    outputs = []
    for record in inputs:
        key = key_of(record)
        seqs[key] = seqs.get(key, 0) + 1
        result = execute_run(agent, RunInput(key, key_group(key, "STRING", max_parallelism), seqs[key], record),
                             memory.get(key, {}))
        memory[key] = result.memory
        outputs += [AgentOutput(key, seqs[key], output.id, output.output) for output in result.outputs]
    return outputs


def reference_outputs(agent: Agent, inputs: Iterable[Any], **options: Any) -> Counter:
    """The failure-free outputs of ``agent`` on ``inputs`` (:func:`failure_free_outputs`) as a Counter of
    :func:`canonical_output` s: what a failed-over job's collected outputs must equal, each exactly once."""
    return Counter(canonical_output(output) for output in failure_free_outputs(agent, inputs, **options))


def exactly_once_string_sink(bootstrap_servers: str, topic: str, transactional_id_prefix: str,
                             transaction_timeout_ms: int = 60_000):
    """Flink's ``KafkaSink`` writing strings to ``topic`` in transactions committed at checkpoints (read them
    with ``isolation.level=read_committed``); tests' jobs abort theirs sooner than production's."""
    from flink_agents_replay.jobs.kafka_output import exactly_once_string_sink as sink

    return sink(bootstrap_servers, topic, transactional_id_prefix, transaction_timeout_ms=transaction_timeout_ms)


def keyed_json_inputs(env, bootstrap_servers: str, topic: str, *, bounded: bool = False,
                      source_uid: str = "inputs", parse_uid: str = "parse"):
    """The inputs of ``topic`` (JSON records ``{"key": ...}``), from its earliest offset, keyed by ``key``.

    The source and the parsing run at parallelism 1, so the agent has one upstream instance and a key's
    inputs keep their order after a restore (a rebalance before keyBy would reorder them, docs/design.md §8). Both
    have uids: generated ids depend on chaining, which changes with parallelism.
    """
    from pyflink.common import Types, WatermarkStrategy
    from pyflink.common.serialization import SimpleStringSchema
    from pyflink.datastream.connectors.kafka import KafkaOffsetsInitializer, KafkaSource

    builder = (
        KafkaSource.builder().set_bootstrap_servers(bootstrap_servers).set_topics(topic)
        .set_group_id(f"agent-inputs-{uuid.uuid4().hex[:8]}")
        .set_starting_offsets(KafkaOffsetsInitializer.earliest())
        .set_value_only_deserializer(SimpleStringSchema())
    )
    if bounded:
        builder = builder.set_bounded(KafkaOffsetsInitializer.latest())
    records = env.from_source(builder.build(), WatermarkStrategy.no_watermarks(), "inputs")
    records = records.uid(source_uid).set_parallelism(1)
    parsed = records.map(json.loads, output_type=Types.PICKLED_BYTE_ARRAY()).uid(parse_uid).set_parallelism(1)
    return parsed.key_by(lambda record: record["key"], key_type=Types.STRING())


def run_agent_job(bootstrap_servers: str, input_topic: str, agent: Agent, config: Mapping[str, Any], *,
                  parallelism: int = 1, checkpoint_interval_ms: int = 500, restart_attempts: int = 0,
                  flink_config: Mapping[str, str] | None = None, until_outputs: int | None = None,
                  timeout_s: float | None = None) -> list[tuple]:
    """Run the job on a MiniCluster; return the outputs as :func:`canonical_output` s.

    By default the input is bounded and the job ends with it. With ``until_outputs=N`` the input is
    unbounded and the job is cancelled once N outputs arrived: runs then stay in flight across ordinary
    checkpoints (at the end of a bounded input the operator drains every remaining run inside the final
    watermark, during which no checkpoint is taken). With ``timeout_s`` as well, fewer than N outputs by then
    cancel the job and raise ``AssertionError``.
    """
    from pyflink.common import Types

    from flink_agents_replay.flink.pipeline import connect_to_agent

    env = create_environment(parallelism=parallelism, checkpoint_interval_ms=checkpoint_interval_ms,
                             restart_attempts=restart_attempts, jars=connector_jars(), config=flink_config)
    keyed = keyed_json_inputs(env, bootstrap_servers, input_topic, bounded=until_outputs is None)
    outputs = connect_to_agent(keyed, agent, config)
    rows = outputs.map(canonical_output, output_type=Types.PICKLED_BYTE_ARRAY())
    with rows.execute_and_collect(f"agent {agent.name}") as results:
        if until_outputs is None:
            return list(results)
        return collect_outputs(results, until_outputs, timeout_s)


def collect_outputs(results, count: int, timeout_s: float | None) -> list:
    """The first ``count`` of a job's collected ``results`` (``execute_and_collect``). With ``timeout_s``, fewer by
    then close the results, which cancels the job, and raise ``AssertionError``."""
    if timeout_s is None:
        return list(itertools.islice(results, count))
    collected: list = []
    timed_out = threading.Event()

    def give_up() -> None:
        timed_out.set()
        results.close()  # cancels the job; the islice below ends

    timer = threading.Timer(timeout_s, give_up)
    timer.daemon = True
    timer.start()
    try:
        collected.extend(itertools.islice(results, count))
    except Exception:
        if not timed_out.is_set():
            raise
    finally:
        timer.cancel()
    if len(collected) < count:
        raise AssertionError(f"only {len(collected)} of {count} outputs within {timeout_s:.0f} s")
    return collected


@contextmanager
def running_job(env, name: str) -> Iterator[Any]:
    """Submit the job (``execute_async``); cancel it on the way out unless it ended; always wait for its end."""
    client = env.execute_async(name)
    try:
        yield client
    finally:
        if not job_ended(client):
            client.cancel().result()
        try:
            client.get_job_execution_result().result()
        except Exception:  # noqa: BLE001 - a cancelled job reports its cancellation as an exception
            pass


def job_ended(client) -> bool:
    """Whether the job reached a globally terminal state (or its per-job MiniCluster is gone)."""
    try:
        return client.get_job_status().result().is_globally_terminal_state()
    except Exception:  # noqa: BLE001 - the per-job MiniCluster is gone once the job ended
        return True


def wait_until(client, condition: Callable[[], bool], what: str, timeout_s: float = 90.0,
               between: Callable[[], None] | None = None) -> None:
    """Poll ``condition`` until it holds; fail at once if the job ends first, or after ``timeout_s``.

    ``between`` runs between polls (default: a 50 ms pause).
    """
    deadline = time.monotonic() + timeout_s
    while not condition():
        if job_ended(client):
            if condition():
                return
            client.get_job_execution_result().result()  # raises the job's failure, if any
            raise AssertionError(f"the job ended before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        if between is not None:
            between()
        else:
            time.sleep(0.05)


def _canonical_format():
    from pyflink.java_gateway import get_gateway

    return get_gateway().jvm.org.apache.flink.core.execution.SavepointFormatType.CANONICAL


def stop_with_savepoint(client, directory: str | Path) -> str:
    """Stop the job with a savepoint; return its path.

    PyFlink 2.3's ``JobClient.stop_with_savepoint`` calls a Java overload that no longer exists.
    """
    return client._j_job_client.stopWithSavepoint(False, str(directory), _canonical_format()).get()


def trigger_savepoint(client, directory: str | Path) -> str:
    """Take a savepoint of the running job (it keeps running); return its path."""
    return client._j_job_client.triggerSavepoint(str(directory), _canonical_format()).get()
