"""The testing environment behind :mod:`flink_agents_replay.testing`: an agent on a MiniCluster over a real broker.

One :meth:`AgentTestEnvironment.run` is one Flink job on PyFlink's embedded MiniCluster, in this process,
shaped like a production job: the inputs are written to a fresh one-partition Kafka topic and read back by a
bounded ``KafkaSource`` (replayed from its checkpointed offsets after a failure), keyed by the caller's key
function, run through :func:`~flink_agents_replay.flink.pipeline.connect_to_agent` with a fresh journal topic, and
the outputs leave through Flink's exactly-once ``KafkaSink``. The result's outputs are read from that topic
with ``isolation.level=read_committed`` — what a downstream consumer sees, so an output written twice after a
failure would show up twice.

**Injecting a failure.** ``fail_over=FailOver(after_outputs=N)`` puts a pass-through map behind the agent
that raises once, when the N-th output reaches it. Flink then restarts the job inside the MiniCluster (no
TaskManager process is killed): it restores the latest completed checkpoint — or, before the first one,
starts the job again — and replays the inputs since then. The agent's journaled actions are reused, not run
again; the result says whether the failure fired (``failed_over``). "Fired once" is claimed in a SQLite file
outside the Flink worker, so the restarted job does not fire it again.

**Counting real calls.** :attr:`AgentTestEnvironment.counter` is an
:class:`~flink_agents_replay.testing.counter.InvocationCounter` (a SQLite file; it pickles as its path, so a
tool can take it into the job): let the agent's tools increment it, and the result's ``call_counts`` are what
the run really invoked, across the failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import numbers
import os
import re
import secrets
import sys
import tempfile
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from flink_agents_replay.api.agent import Agent
from flink_agents_replay.flink.config import AgentConfig
from flink_agents_replay.integrations.kafka.settings import LIBRDKAFKA_LOGGER
from flink_agents_replay.jobs.waits_topic import fold_wait_events, wait_event_json
from flink_agents_replay.testing.counter import InvocationCounter

__all__ = ["AgentRunResult", "AgentTestEnvironment", "CommittedOutput", "FailOver", "InjectedFailover"]


class InjectedFailover(RuntimeError):
    """The failure :class:`FailOver` injects: the job fails over on it (Flink restarts it), once."""


@dataclass(frozen=True, kw_only=True)
class FailOver:
    """Make the job fail over once, when the ``after_outputs``-th output of the agent leaves it."""

    after_outputs: int

    def __post_init__(self) -> None:
        if not isinstance(self.after_outputs, numbers.Integral) or isinstance(self.after_outputs, bool):
            raise TypeError(f"FailOver(after_outputs=...) must be a whole number, got {self.after_outputs!r}")
        if self.after_outputs < 1:
            raise ValueError(f"FailOver(after_outputs=...) must be at least 1, got {self.after_outputs}")


@dataclass(frozen=True)
class OpenWait:
    """A run still waiting at ``ctx.wait_for`` when the run ended: its key and seq, the wait's id, name and payload.

    :meth:`AgentTestEnvironment.run` sends no decisions (its input ends; a wait's deadline cannot pass after
    that): an agent that waits leaves its runs parked, and their outputs are not there. Test waits with a job of
    your own that reads decisions (``connect_to_agent(..., signals=...)``; README, *Waiting for people*).
    """

    key: str
    seq: int
    wait_id: str
    name: str
    payload: Any


@dataclass(frozen=True)
class CommittedOutput:
    """One output of the agent as the output topic holds it (committed): the key, the input's seq and the output."""

    key: str
    seq: int
    event_id: str
    output: Any


#: How the worker's exception appears in the Java trace in thread mode (pemja) and in process mode (Beam).
_THREAD_MODE_EXCEPTION = re.compile(r"pemja\.core\.PythonException: <class '(?:[\w.]*\.)?([\w]+)'>: (.*)")
#: An error the package's checkpoint bridge raises in Java (``slot_wait_timeout_s``, a hold that never ends).
_BRIDGE_EXCEPTION = re.compile(r"(?:[\w.]*\.)?(\w+(?:Exception|Error)): (flink-agents-replay: .*)")


def python_exception_line(trace: str) -> str | None:
    """``Type: message`` of the Python exception a job's failure (its text, with the Java trace) carries: the
    last one PyFlink's thread mode reports, else the last line of the last Python traceback, else the last
    error of the package's checkpoint bridge (Java, e.g. ``slot_wait_timeout_s``); ``None``."""
    found = _THREAD_MODE_EXCEPTION.findall(trace)
    if found:
        kind, message = found[-1]
        return f"{kind}: {message.strip()}"
    start = trace.rfind("Traceback (most recent call last):")
    if start >= 0:
        for line in trace[start:].splitlines()[1:]:
            if line.strip() and not line[:1].isspace():
                return line.strip()
    bridge = _BRIDGE_EXCEPTION.findall(trace)
    if bridge:
        kind, message = bridge[-1]
        return f"{kind}: {message.strip()}"
    return None


def _settings_given(config: AgentConfig | Mapping[str, Any] | None) -> dict[str, Any]:
    """The settings ``config`` gives: a dict's as they are (checked), an ``AgentConfig``'s other than their defaults."""
    if config is None:
        return {}
    if not isinstance(config, AgentConfig):
        AgentConfig.from_mapping(config)  # unknown names, or not a dict: a ConfigError naming them
        return dict(config)
    defaults = AgentConfig()
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(AgentConfig)
            if getattr(config, f.name) != getattr(defaults, f.name)}


def _journal_topic(agent: Agent, agent_config: Mapping[str, Any]) -> str:
    """The journal topic the job wrote (or would have, with the journal off): the environment's fresh one, the
    config's, or the uid's default, resolved as the operator resolves it."""
    return AgentConfig.from_mapping(agent_config).resolved(agent.name).journal_topic


@dataclass(frozen=True)
class AgentRunResult:
    """What one :meth:`AgentTestEnvironment.run` did.

    ``failure`` is the exception the job ended with (after its restarts; ``None``: it finished), carried
    rather than raised, like Temporal's replay results: a test can assert on it and still read the outputs
    committed before it. ``failure_message`` is it as a person reads it: the Python exception that ended the job
    (``"ValueError: ..."``, without its module), found in the Java trace PyFlink wraps it in, else the
    failure's first line.
    """

    outputs: tuple[CommittedOutput, ...]
    call_counts: Mapping[str, int]
    failed_over: bool
    failure: BaseException | None
    input_topic: str
    output_topic: str
    journal_topic: str
    failure_message: str | None = None
    #: Runs parked at a wait when the run ended (:class:`OpenWait`): their outputs are missing.
    open_waits: tuple[OpenWait, ...] = ()

    def outputs_by_key(self) -> dict[str, list[Any]]:
        """Each key's outputs (their ``output`` values), in seq order."""
        grouped: dict[str, list[CommittedOutput]] = defaultdict(list)
        for output in self.outputs:
            grouped[output.key].append(output)
        return {key: [o.output for o in sorted(rows, key=lambda o: (o.seq, o.event_id))]
                for key, rows in grouped.items()}

    def duplicate_outputs(self) -> list[CommittedOutput]:
        """Outputs committed more than once (the same event id): empty when every effect left once."""
        seen = Counter(output.event_id for output in self.outputs)
        return [output for output in self.outputs if seen[output.event_id] > 1]


class _FailOnce:
    """The pass-through map of :class:`FailOver`: raises :class:`InjectedFailover` at the N-th output, once."""

    def __init__(self, claims: InvocationCounter, after_outputs: int):
        self.claims = claims
        self.after_outputs = after_outputs

    def __call__(self, output):
        # Claimed in a file outside the worker: counted across subtasks, and never fired again after the restart.
        if not self.claims.count("fired") and self.claims.increment("outputs") >= self.after_outputs:
            if self.claims.increment("claims") == 1:
                self.claims.increment("fired")
                raise InjectedFailover(f"injected fail-over at output {self.after_outputs}")
        return output


def _encode_output(output) -> str:
    return json.dumps({"key": output.key, "seq": output.seq, "event_id": output.event_id, "output": output.output},
                      sort_keys=True)


def _open_waits(events: Iterable[bytes]) -> tuple[OpenWait, ...]:
    """The waits the events (the waits topic's, :mod:`flink_agents_replay.jobs.waits_topic`) leave pending."""
    return tuple(OpenWait(w.key, w.seq, w.wait_id, w.name, w.payload)
                 for w in fold_wait_events(events).waits.values() if w.pending)


def _decode_output(value: bytes) -> CommittedOutput:
    row = json.loads(value)
    return CommittedOutput(key=row["key"], seq=row["seq"], event_id=row["event_id"], output=row["output"])


def _worker_cannot_import(module: ModuleType) -> bool:
    """Whether Flink's worker would fail to import ``module`` by name (a test module, a script run by path)."""
    from flink_agents_replay.flink.env import python_path

    if module.__name__ == "__main__":
        return False  # cloudpickle ships __main__'s objects by value anyway
    top = module.__name__.split(".")[0]
    if top in sys.stdlib_module_names:
        return False
    # The worker's python.pythonpath: site-packages and this package's parent (see flink.env.python_path).
    return not any(os.path.exists(os.path.join(p, top)) or os.path.exists(os.path.join(p, f"{top}.py"))
                   for p in python_path())


class AgentTestEnvironment:
    """Runs agents on a Flink MiniCluster against a real Kafka broker, optionally failing the job over once.

    Make one with :meth:`start_local` (a broker of its own, stopped at the end) or :meth:`from_bootstrap`
    (a broker you run); both are context managers. Runs are independent (fresh topics each time).
    """

    def __init__(self, *, bootstrap_servers: str, work_dir: str | Path):
        self.bootstrap_servers = bootstrap_servers
        self.work_dir = Path(work_dir)
        self.signing_key = secrets.token_hex(16)
        self.counter = InvocationCounter(self.work_dir / "calls.sqlite")

    @classmethod
    @contextlib.contextmanager
    def start_local(cls) -> Iterator[AgentTestEnvironment]:
        """An environment with a broker of its own: ``$KAFKA_BOOTSTRAP_SERVERS`` if set, else a throwaway one
        (testcontainers if Docker answers, else the official Kafka jars on 127.0.0.1); stopped at the end."""
        from flink_agents_replay.testing.kafka import kafka_bootstrap_servers

        with kafka_bootstrap_servers() as bootstrap, cls.from_bootstrap(bootstrap) as environment:
            yield environment

    @classmethod
    @contextlib.contextmanager
    def from_bootstrap(cls, bootstrap_servers: str) -> Iterator[AgentTestEnvironment]:
        """An environment on a broker you run (``host:port``); its temporary files are removed at the end."""
        with tempfile.TemporaryDirectory(prefix="far-testenv-") as work_dir:
            yield cls(bootstrap_servers=bootstrap_servers, work_dir=work_dir)

    def run(self, agent: Agent, *, inputs: Iterable[Any], key: Callable[[Any], str],
            fail_over: FailOver | None = None, parallelism: int = 1, checkpoint_interval_ms: int = 500,
            config: AgentConfig | Mapping[str, Any] | None = None, pickle_by_value: Sequence[ModuleType] = (),
            timeout_s: float = 60.0) -> AgentRunResult:
        """Run ``agent`` over ``inputs`` (JSON values, keyed by ``key``: a ``str`` per input) until they end.

        Args:
            agent: the agent; its outputs must be JSON values (they travel through a Kafka topic).
            inputs: the inputs, in order; each key's inputs reach the agent in this order.
            key: the key of an input (the job keys by it, ``Types.STRING()``).
            fail_over: fail the job over once (:class:`FailOver`); the job then gets three restart attempts.
                ``None``: no injected failure and no restarts, so any exception an action raises ends the run
                (reported in the result's ``failure``).
            parallelism: the agent's parallelism.
            checkpoint_interval_ms: Flink's checkpoint interval (checkpoints commit the outputs).
            config: :class:`~flink_agents_replay.flink.config.AgentConfig` settings over the environment's
                (broker, signing key, a fresh journal topic): a dict of them, or an ``AgentConfig`` (the settings
                it sets to other than their defaults).
            pickle_by_value: modules the Flink worker cannot import, shipped by value (the agent's own module
                is added when the worker could not import it, e.g. a test module).
            timeout_s: how long to read the committed outputs after the job ended.
        """
        self._ship_by_value([sys.modules[type(agent).__module__], *pickle_by_value])
        suffix = uuid.uuid4().hex[:10]
        topics = {"input": f"testenv-in-{suffix}", "output": f"testenv-out-{suffix}",
                  "journal": f"testenv-journal-{suffix}", "waits": f"testenv-waits-{suffix}"}
        self._create_topics(inputs=list(inputs), key=key, topics=topics)
        agent_config = {"kafka": {"bootstrap.servers": self.bootstrap_servers}, "signing_key": self.signing_key,
                        "journal_topic": topics["journal"], **_settings_given(config)}
        claims = InvocationCounter(self.work_dir / f"failover-{suffix}.sqlite")
        before = self.counter.counts()
        env = self._job(agent, agent_config, key=key, topics=topics, parallelism=parallelism,
                        checkpoint_interval_ms=checkpoint_interval_ms, fail_over=fail_over, claims=claims)
        failure, message = None, None
        try:
            env.execute(f"agent {agent.name} (testing)")
        except Exception as exc:  # noqa: BLE001 - carried in the result, not raised
            failure = exc
            message = python_exception_line(str(exc)) or str(exc).strip().split("\n", 1)[0]
        outputs = self._read_outputs(topics["output"], timeout_s)
        open_waits = _open_waits(self._read_topic(topics["waits"], bytes, timeout_s))
        after = self.counter.counts()
        counts = {name: n - before.get(name, 0) for name, n in after.items() if n != before.get(name, 0)}
        return AgentRunResult(outputs=tuple(outputs), call_counts=counts, failed_over=bool(claims.count("fired")),
                              failure=failure, input_topic=topics["input"], output_topic=topics["output"],
                              journal_topic=_journal_topic(agent, agent_config), failure_message=message,
                              open_waits=open_waits)

    @staticmethod
    def _ship_by_value(modules: Iterable[ModuleType]) -> None:
        import cloudpickle

        # Left registered for the rest of the process: later runs ship the same objects the same way.
        for module in modules:
            if _worker_cannot_import(module):
                cloudpickle.register_pickle_by_value(module)

    def _create_topics(self, *, inputs: list[Any], key: Callable[[Any], str], topics: Mapping[str, str]) -> None:
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "logger": LIBRDKAFKA_LOGGER})
        created = admin.create_topics([NewTopic(topics[name], 1, 1) for name in ("input", "output", "waits")],
                                      request_timeout=30)
        for future in created.values():
            future.result(timeout=60)
        producer = Producer({"bootstrap.servers": self.bootstrap_servers, "logger": LIBRDKAFKA_LOGGER,
                             "enable.idempotence": True})
        for record in inputs:
            producer.produce(topics["input"], json.dumps(record).encode(), key=_key_of(key, record).encode())
        if producer.flush(60):
            raise RuntimeError(f"the inputs were not acknowledged by {self.bootstrap_servers}")

    def _job(self, agent: Agent, agent_config: Mapping[str, Any], *, key: Callable[[Any], str],
             topics: Mapping[str, str], parallelism: int, checkpoint_interval_ms: int, fail_over: FailOver | None,
             claims: InvocationCounter):
        """The job: bounded Kafka inputs -> key_by -> agent -> (fail once) -> exactly-once Kafka outputs."""
        from pyflink.common import Types, WatermarkStrategy
        from pyflink.common.serialization import SimpleStringSchema
        from pyflink.datastream.connectors.kafka import KafkaOffsetsInitializer, KafkaSource

        from flink_agents_replay.flink.env import create_environment
        from flink_agents_replay.flink.pipeline import connect_to_agent, wait_events
        from flink_agents_replay.jobs.connector import require_kafka_connector
        from flink_agents_replay.testing.jobs import connector_jars, exactly_once_string_sink

        env = create_environment(parallelism=parallelism, checkpoint_interval_ms=checkpoint_interval_ms,
                                 restart_attempts=3 if fail_over else 0)
        require_kafka_connector(env, connector_jars())
        source = (KafkaSource.builder().set_bootstrap_servers(self.bootstrap_servers).set_topics(topics["input"])
                  .set_group_id(f"testenv-{uuid.uuid4().hex[:8]}")
                  .set_starting_offsets(KafkaOffsetsInitializer.earliest())
                  .set_bounded(KafkaOffsetsInitializer.latest())
                  .set_value_only_deserializer(SimpleStringSchema()).build())
        # Source and parsing at parallelism 1: one upstream instance, so each key's order survives a restore.
        records = env.from_source(source, WatermarkStrategy.no_watermarks(), "inputs").uid("inputs").set_parallelism(1)
        parsed = records.map(json.loads, output_type=Types.PICKLED_BYTE_ARRAY()).uid("parse").set_parallelism(1)
        outputs = connect_to_agent(parsed.key_by(key, key_type=Types.STRING()), agent, agent_config)
        if fail_over is not None:
            outputs = outputs.map(_FailOnce(claims, fail_over.after_outputs),
                                  output_type=Types.PICKLED_BYTE_ARRAY()).uid("fail-over")
        sink = exactly_once_string_sink(self.bootstrap_servers, topics["output"], f"testenv-{uuid.uuid4().hex[:8]}")
        outputs.map(_encode_output, output_type=Types.STRING()).uid("encode").sink_to(sink).uid("outputs")
        waits = exactly_once_string_sink(self.bootstrap_servers, topics["waits"], f"testenv-{uuid.uuid4().hex[:8]}")
        wait_events(outputs).map(wait_event_json, output_type=Types.STRING()).uid("encode-waits").sink_to(
            waits).uid("waits")
        return env

    def _read_outputs(self, topic: str, timeout_s: float) -> list[CommittedOutput]:
        return self._read_topic(topic, _decode_output, timeout_s)

    def _read_topic(self, topic: str, decode: Callable[[bytes], Any], timeout_s: float) -> list:
        from flink_agents_replay.testing.committed import CommittedReader

        with CommittedReader(self.bootstrap_servers, topic, decode) as reader:
            return list(reader.read_to_committed_end(timeout_s))


def _key_of(key: Callable[[Any], str], record: Any) -> str:
    """An input's key, which the job keys by as a string."""
    found = key(record)
    if not isinstance(found, str):
        raise TypeError(f"run(key=...) must return a str for every input (the job keys by Types.STRING()), got "
                        f"{found!r} ({type(found).__name__}) for {record!r:.100}")
    return found
