"""Where tests get a Kafka broker from, in order of preference.

1. ``KAFKA_BOOTSTRAP_SERVERS`` is set: use that broker as it is (a team's own cluster, CI services).
2. A Docker engine answers: testcontainers' Kafka module starts a throwaway broker.
3. Otherwise: :class:`~flink_agents_replay.local.kafka_broker.LocalKafkaBroker` runs the official
   Kafka jars on 127.0.0.1, in a temporary work directory, stopped when the tests end.
"""

from __future__ import annotations

import contextlib
import enum
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping

__all__ = ["KafkaSource", "docker_engine_answers", "kafka_bootstrap_servers", "select_kafka_source"]

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"


class KafkaSource(enum.Enum):
    """Where a test run's broker comes from."""

    ENVIRONMENT = "environment"
    TESTCONTAINERS = "testcontainers"
    LOCAL = "local"


def docker_engine_answers(timeout_s: float = 3.0) -> bool:
    """Whether a Docker engine answers a ping (the client alone is not enough)."""
    if not _docker_socket_may_answer(os.environ.get("DOCKER_HOST", "")):
        return False  # also spares docker's client a socket it leaves open when the connect fails
    try:
        import docker

        client = docker.from_env(timeout=timeout_s)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - no socket, no permission, no engine: all mean "no"
        return False


def _docker_socket_may_answer(docker_host: str) -> bool:
    """False when the engine's address is a Unix socket that does not exist (the client's default, unset)."""
    docker_host = docker_host or "unix:///var/run/docker.sock"
    return not docker_host.startswith("unix://") or os.path.exists(docker_host.removeprefix("unix://"))


def select_kafka_source(
    environ: Mapping[str, str] | None = None,
    docker_available: Callable[[], bool] = docker_engine_answers,
) -> KafkaSource:
    """Decide where the broker comes from (Docker is only asked when the environment names none)."""
    environ = os.environ if environ is None else environ
    if environ.get(BOOTSTRAP_ENV, "").strip():
        return KafkaSource.ENVIRONMENT
    if docker_available():
        return KafkaSource.TESTCONTAINERS
    return KafkaSource.LOCAL


@contextlib.contextmanager
def kafka_bootstrap_servers(source: KafkaSource | None = None) -> Iterator[str]:
    """Yield a bootstrap address for a broker from ``source`` (chosen if not given); clean up after."""
    source = source or select_kafka_source()
    if source is KafkaSource.ENVIRONMENT:
        yield os.environ[BOOTSTRAP_ENV].strip()
    elif source is KafkaSource.TESTCONTAINERS:
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as container:
            yield container.get_bootstrap_server()
    else:
        from flink_agents_replay.local.kafka_broker import LocalKafkaBroker

        with tempfile.TemporaryDirectory(prefix="far-kafka-") as work_dir:
            broker = LocalKafkaBroker(work_dir, port=0)
            status = broker.start()
            try:
                yield status.bootstrap_servers
            finally:
                broker.discard()  # its data goes with the temporary directory
