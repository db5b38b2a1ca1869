"""``connect_to_agent``: put an agent into an existing PyFlink job with one call.

    keyed = stream.key_by(lambda ticket: ticket["customer"], key_type=Types.STRING())
    outputs = connect_to_agent(keyed, Triage(resources=...), {"kafka": {"bootstrap.servers": "kafka:9092"}})

The operator gets a stable uid (``flink-agents-replay/<agent name>`` unless configured) and a pinned max
parallelism (128 unless configured): both are what a savepoint is matched against, so they must not
change between a savepoint and its restore. The key must be declared with ``key_type=Types.STRING()``,
``Types.LONG()`` or ``Types.INT()``: the journal partition of a key is its Flink key group, and only
those types have a key group Python can compute.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from flink_agents_replay.api.agent import Agent
from flink_agents_replay.core.errors import ConfigError
from flink_agents_replay.core.keygroups import JAVA_KEY_TYPES, UnsupportedKeyTypeError
from flink_agents_replay.flink.config import AgentConfig
from flink_agents_replay.flink.operator import ActionExecutionOperator, AgentOutput
from flink_agents_replay.flink.traced_input import traced_keyed_stream

__all__ = ["AgentOutput", "check_embedded_python_path", "connect_to_agent", "key_type_of", "wait_events"]



def key_type_of(keyed_stream) -> str:
    """``"STRING"``, ``"LONG"`` or ``"INT"``: the key type a PyFlink ``KeyedStream`` was declared with."""
    from pyflink.datastream import KeyedStream

    if not isinstance(keyed_stream, KeyedStream):
        raise TypeError(f"connect_to_agent needs a KeyedStream (stream.key_by(...)), got {type(keyed_stream).__name__}")
    java_key_type = keyed_stream._j_data_stream.getKeyType()
    # PyFlink wraps the user's key in a one-field Row; its field is the declared key type.
    declared = java_key_type.getTypeAt(0).toString() if java_key_type.getArity() == 1 else java_key_type.toString()
    if declared not in JAVA_KEY_TYPES:
        shown = "no key_type (pickled keys)" if "Pickled" in declared else declared
        raise UnsupportedKeyTypeError(
            f"the agent's input is keyed with {shown}; declare the key type: "
            "stream.key_by(selector, key_type=Types.STRING()) (or Types.LONG() / Types.INT()). The journal "
            "partition of a key is its Flink key group, which only these key types let Python compute"
        )
    return JAVA_KEY_TYPES[declared]


def check_embedded_python_path(keyed_stream) -> None:
    """Fail now if the agent's embedded interpreter could not import this package in the job.

    The agent's operator runs in PyFlink's embedded (thread-mode) interpreter, also in a job whose other
    Python functions run in process mode; that interpreter does not see a virtualenv's site-packages. A
    job built from a virtualenv therefore needs ``python.pythonpath`` (``create_environment`` sets it);
    without it the job would fail on the TaskManager with ``No module named 'pemja'``.
    """
    if sys.prefix == sys.base_prefix:  # no virtualenv: the embedded interpreter sees the same packages
        return
    settings = keyed_stream._j_data_stream.getExecutionEnvironment().getConfiguration().toMap()
    if settings.get("python.pythonpath"):
        return
    raise ConfigError(
        f"the agent runs in PyFlink's embedded (thread-mode) Python interpreter, which does not see this virtualenv "
        f"({sys.prefix}): set python.pythonpath in the job's configuration, e.g. config.set_string("
        "'python.pythonpath', os.pathsep.join(flink_agents_replay.flink.env.python_path())) "
        "(flink_agents_replay.flink.env.create_environment does it)"
    )


def connect_to_agent(keyed_stream, agent: Agent, config: AgentConfig | Mapping[str, Any] | None = None, *,
                     signals=None, check_journal: bool = True):
    """Run ``agent`` on every input of ``keyed_stream``; return the DataStream of its :class:`AgentOutput` s.

    Args:
        keyed_stream: ``stream.key_by(selector, key_type=Types.STRING() | Types.LONG() | Types.INT())``. Keyed
            records of ``records_from_kafka`` bring the W3C ``traceparent`` header of their Kafka record, if any, to
            their run (its trace links to it; the capture keeps it).
        agent: the agent instance (its actions and resources are shipped with the job).
        config: an :class:`AgentConfig` or a dict of its fields (``{"kafka": {...}, ...}``).
        signals: the decisions for runs waiting at ``ctx.wait_for``, keyed like ``keyed_stream`` (the same
            key type; a decision goes to the key of the run that waits), each a mapping or its JSON
            (:mod:`flink_agents_replay.flink.signals`). Without it a run that waits can only time out. What
            happens to waits leaves on the side output :func:`wait_events`.
        check_journal: reach the journal topic now (creating or validating it), so a wrong topic or an
            unreachable broker fails here with a clear error instead of inside the running job.
    """
    return _connect_to_agent(keyed_stream, agent, config, signals=signals, check_journal=check_journal,
                             make_operator=ActionExecutionOperator)


def wait_events(outputs):
    """The :class:`~flink_agents_replay.flink.waits.WaitEvent` s of the agent whose outputs are ``outputs`` (what
    :func:`connect_to_agent` returned): a wait opened (what it asks, for whom to decide), resumed, closed, and
    decisions early, ignored, unmatched or rejected."""
    from pyflink.common import Types
    from pyflink.datastream import OutputTag

    from flink_agents_replay.flink.operator import WAIT_EVENTS

    return outputs.get_side_output(OutputTag(WAIT_EVENTS, Types.PICKLED_BYTE_ARRAY()))


def _with_signals(keyed_stream, signals, key_type: str, uid: str):
    """Inputs and decisions on one stream, keyed again by the inputs' key (:mod:`.signals`)."""
    from pyflink.common import Types

    from flink_agents_replay.flink.signals import inputs_with_signals

    signals_key_type = key_type_of(signals)
    if signals_key_type != key_type:
        raise ConfigError(f"signals are keyed by {signals_key_type} and the inputs by {key_type}: key both alike, "
                          "a decision goes to the key of the run that waits")
    key_type_info = {"STRING": Types.STRING(), "LONG": Types.LONG(), "INT": Types.INT()}[key_type]
    return inputs_with_signals(keyed_stream, signals, key_type_info, uid=uid)


def _connect_to_agent(keyed_stream, agent: Agent, config: AgentConfig | Mapping[str, Any] | None, *,
                      check_journal: bool, make_operator: Callable[[Agent, AgentConfig, str], ActionExecutionOperator],
                      signals=None):
    """:func:`connect_to_agent` with the operator built by ``make_operator(agent, resolved config, key type)``.

    Not public API: the project's own test harness (``tests/harness/upstreams.py``) records what the operator
    does through an instrumented subclass. Users observe a job through its outputs and metrics.
    """
    from pyflink.common import Types

    from flink_agents_replay.flink.checkpoint_bridge import process_with_checkpoint_hooks

    if not isinstance(agent, Agent):
        raise TypeError(f"connect_to_agent needs an Agent instance, got {type(agent).__name__}")
    if config is None:
        config = AgentConfig()
    elif not isinstance(config, AgentConfig):
        config = AgentConfig.from_mapping(config)
    config = config.resolved(agent.name)
    key_type = key_type_of(keyed_stream)
    check_embedded_python_path(keyed_stream)
    # Records of the packaged Kafka input keep their traceparent header on the way to the operator
    # (flink/traced_input.py): the operator takes it off, the agent sees the record.
    keyed_stream = traced_keyed_stream(keyed_stream)
    if check_journal and config.journal_enabled:
        from flink_agents_replay.storage.journal.kafka_store import KafkaJournalStore

        KafkaJournalStore(config.kafka_settings(), config.journal_topic, config.max_parallelism,
                          create_topic=config.create_topic, replication_factor=config.replication_factor,
                          topic_config=config.topic_config, timeout_s=config.kafka_timeout_s).close()
    if signals is not None:
        keyed_stream = _with_signals(keyed_stream, signals, key_type, config.uid)
    operator = make_operator(agent, config, key_type)
    outputs = process_with_checkpoint_hooks(keyed_stream, operator, output_type=Types.PICKLED_BYTE_ARRAY(),
                                            name=f"agent {agent.name}")
    outputs = outputs.uid(config.uid).set_max_parallelism(config.max_parallelism)
    # Declared whether or not it is read: PyFlink sends an undeclared tag's (tag, event) pairs down the main
    # output, among the AgentOutputs. (The outputs are not fused downstream either way: other max parallelism.)
    wait_events(outputs)
    return outputs
