#!/usr/bin/env bash
# Runs a JobManager or TaskManager (argument 1) in the foreground from the pyflink package's bin/.
set -euo pipefail
role=${1:?usage: flink-entrypoint.sh jobmanager|taskmanager}
FLINK_HOME=$(python -c 'import os, pyflink; print(os.path.dirname(pyflink.__file__))')
export FLINK_HOME
export FLINK_CONF_DIR=/opt/flink-agents-replay/conf/docker
# Thread mode on a standalone cluster needs flink-python (pemja) on the cluster classpath (DESIGN §7).
export FLINK_LIB_DIR=/opt/flink-lib
mkdir -p "$FLINK_LIB_DIR" /data/flink/checkpoints /data/flink/savepoints
ln -sf "$FLINK_HOME"/lib/*.jar "$FLINK_HOME"/opt/flink-python-*.jar "$FLINK_LIB_DIR"/
export PATH="$FLINK_HOME/bin:$PATH"
exec "$FLINK_HOME/bin/$role.sh" start-foreground
