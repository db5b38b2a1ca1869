"""Local services for development, tests and the demo: a real Kafka broker, connector jars, Flink.

Nothing here is needed in production, where Kafka and Flink are run by whoever runs them. Locally,
everything is started from jars fetched from Maven Central (checked against ``jars.lock``) into a cache
directory outside the repository (``$FLINK_AGENTS_REPLAY_HOME``, by default ``~/.cache/flink-agents-replay``),
with configuration files shipped in the package, so a machine with a Java 17 runtime and pip needs nothing else.
"""

from flink_agents_replay.local.errors import LocalServiceError

__all__ = ["LocalServiceError"]
