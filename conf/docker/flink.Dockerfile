# A Flink session-cluster image whose Flink *is* PyFlink's: the pinned apache-flink wheel ships Flink's
# jars and bin/ scripts, so the cluster and the jobs' Python side are the same version by construction.
FROM python:3.11-slim-bookworm

RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jdk-headless maven procps \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/flink-agents-replay
COPY pyproject.toml README.md ./
COPY flink_agents_replay ./flink_agents_replay
COPY jobs ./jobs
COPY conf ./conf
RUN pip install --no-cache-dir .

ENV FLINK_AGENTS_REPLAY_CONF=/opt/flink-agents-replay/conf \
    FLINK_AGENTS_REPLAY_HOME=/opt/flink-agents-replay-cache
# The Kafka connector jar that jobs ship (fetched from Maven Central at build time, never committed).
RUN flink-agents-replay local jars fetch flink-connectors
ENTRYPOINT ["/opt/flink-agents-replay/conf/docker/flink-entrypoint.sh"]
