"""Flink's Kafka connector for the packaged jobs: taken the way Flink users give it, checked at submission.

The connector is not part of Flink's distribution. A job finds it, in this order:

1. ``connector_jars`` given to :func:`require_kafka_connector` (the jobs' ``--connector-jar``), or
   ``$FLINK_AGENTS_REPLAY_KAFKA_CONNECTOR`` (paths or URLs, separated by ``;``): added to ``pipeline.jars``;
2. what the job's class path already has: a jar in Flink's ``lib/`` (a Flink image), ``flink run --jarfile``,
   or ``pipeline.jars`` in Flink's configuration.

If none of these has it, the job fails before it is submitted, with the Maven coordinates to add
(:data:`KAFKA_CONNECTOR_COORDINATES`), not with a py4j error from deep inside PyFlink.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlparse

from flink_agents_replay.core.errors import ConfigError

__all__ = ["CONNECTOR_ENV", "KAFKA_CONNECTOR_COORDINATES", "connector_jars_from_environment",
           "kafka_connector_loadable", "require_kafka_connector"]

CONNECTOR_ENV = "FLINK_AGENTS_REPLAY_KAFKA_CONNECTOR"
#: The connector the package is tested with (built for Flink 2.x); the thin flink-connector-kafka works too.
KAFKA_CONNECTOR_COORDINATES = "org.apache.flink:flink-sql-connector-kafka:5.0.0-2.2"
_PROBE_CLASS = "org.apache.flink.connector.kafka.source.KafkaSource"


def _jar_url(jar: str) -> str:
    """A local jar's ``file:`` URL: what py4j's class loader and Flink's job submission both take."""
    scheme = urlparse(jar).scheme
    if scheme == "file":
        return jar
    if len(scheme) > 1:  # a one-letter scheme is a Windows drive
        raise ConfigError(f"Kafka connector jar {jar!r}: give a local path or a file: URL (a {scheme}: URL is not "
                          "loaded by the job's client; put such a jar into Flink's lib/ or pipeline.jars instead)")
    path = Path(jar).expanduser()
    if not path.is_file():
        raise ConfigError(f"Kafka connector jar {jar!r} does not exist (from --connector-jar or ${CONNECTOR_ENV})")
    return path.resolve().as_uri()


def _configured_jars(j_env) -> list[str]:
    from pyflink.util.java_utils import get_j_env_configuration

    value = get_j_env_configuration(j_env).toMap().get("pipeline.jars") or ""
    return [jar for jar in value.replace(",", ";").split(";") if jar.strip()]


def kafka_connector_loadable() -> bool:
    """Whether the job's class loader (py4j's, in this process) has Flink's Kafka connector."""
    from pyflink.java_gateway import get_gateway

    loader = get_gateway().jvm.Thread.currentThread().getContextClassLoader()
    try:
        loader.loadClass(_PROBE_CLASS)
    except Exception:  # py4j raises Py4JJavaError (ClassNotFoundException) or Py4JError
        return False
    return True


def connector_jars_from_environment() -> list[str]:
    """The jars ``$FLINK_AGENTS_REPLAY_KAFKA_CONNECTOR`` names (separated by ``;``), if any."""
    return [jar.strip() for jar in os.environ.get(CONNECTOR_ENV, "").split(";") if jar.strip()]


def require_kafka_connector(env, connector_jars: Sequence[str] = ()) -> None:
    """Give the job of ``env`` Flink's Kafka connector, or raise :class:`ConfigError` saying how to add it."""
    from pyflink.util.java_utils import add_jars_to_context_class_loader

    given = list(connector_jars) or connector_jars_from_environment()
    urls = [_jar_url(jar.strip()) for jar in given]
    if urls:
        env.add_jars(*urls)  # pipeline.jars, and py4j's class loader
    local = [jar for jar in _configured_jars(env._j_stream_execution_environment) if jar.startswith("file:")]
    if local:
        add_jars_to_context_class_loader(local)
    if not kafka_connector_loadable():
        raise ConfigError(
            f"Flink's Kafka connector is not on the job's class path. Add {KAFKA_CONNECTOR_COORDINATES} (Maven "
            f"Central) to Flink's lib/ folder, pass it with `flink run --jarfile`, list it in pipeline.jars, or "
            f"give its path with --connector-jar or ${CONNECTOR_ENV}")
