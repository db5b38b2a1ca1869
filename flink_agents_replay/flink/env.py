"""Build a PyFlink ``StreamExecutionEnvironment`` set up the way this package needs it.

The operator must run in PyFlink's *thread* execution mode (docs/design.md §12): its checkpoint bridge lives in
the embedded interpreter, and switching modes across a savepoint silently loses keyed state. This
helper therefore always sets ``python.execution-mode: thread``; everything else is an argument.
``env.execute()`` on the result runs a local MiniCluster; under ``flink run`` it runs on the cluster.
"""

from __future__ import annotations

import os
import site
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = ["create_environment", "fresh_process_environment", "python_path"]

#: Variables Flink and PyFlink set in a process for that process only; a new Flink client or job process started
#: from it must not inherit them (with PYFLINK_GATEWAY_DISABLED a new PyFlink driver refuses to start its gateway).
_PER_PROCESS_VARIABLES = ("PYFLINK_GATEWAY_DISABLED", "_FLINK_HOME_DETERMINED")


def fresh_process_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) without the variables Flink set for this process only,
    for starting a new Flink or PyFlink process."""
    source = os.environ if base is None else base
    return {name: value for name, value in source.items() if name not in _PER_PROCESS_VARIABLES}


def python_path() -> list[str]:
    """Directories the Flink Python worker needs: this environment's site-packages and this package."""
    package_parent = str(Path(__file__).resolve().parents[2])  # flink_agents_replay/flink/env.py
    paths = [*site.getsitepackages(), package_parent]
    return list(dict.fromkeys(p for p in paths if os.path.isdir(p)))


def create_environment(
    *,
    parallelism: int = 1,
    max_parallelism: int | None = None,
    checkpoint_interval_ms: int | None = None,
    restart_attempts: int = 0,
    restart_delay_ms: int = 200,
    jars: Iterable[str | Path] = (),
    config: Mapping[str, str] | None = None,
):
    """Return a thread-mode ``StreamExecutionEnvironment``.

    Args:
        parallelism: default parallelism of the job's operators.
        max_parallelism: pinned max parallelism (number of key groups), or Flink's default.
        checkpoint_interval_ms: enables checkpointing at this interval when given.
        restart_attempts: fixed-delay restarts Flink makes after a failure (0: fail the job at once).
        restart_delay_ms: pause between restarts.
        jars: connector jars to ship with the job (``pipeline.jars``).
        config: further Flink options, applied last, passed through as given.
    """
    from pyflink.common import Configuration
    from pyflink.datastream import StreamExecutionEnvironment

    settings: dict[str, str] = {
        "python.execution-mode": "thread",
        # The Python side of the job is this interpreter's environment.
        "python.executable": sys.executable,
        "python.client.executable": sys.executable,
        # The embedded (thread-mode) interpreter does not see a virtualenv's site-packages by itself.
        "python.pythonpath": os.pathsep.join(python_path()),
    }
    if restart_attempts > 0:
        settings.update({
            "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.attempts": str(restart_attempts),
            "restart-strategy.fixed-delay.delay": f"{restart_delay_ms} ms",
        })
    else:
        settings["restart-strategy.type"] = "none"
    jar_urls = [Path(j).resolve().as_uri() for j in jars]
    if jar_urls:
        settings["pipeline.jars"] = ";".join(jar_urls)
    settings.update(config or {})

    configuration = Configuration()
    for key, value in settings.items():
        configuration.set_string(key, value)
    env = StreamExecutionEnvironment.get_execution_environment(configuration)
    env.set_parallelism(parallelism)
    if max_parallelism is not None:
        env.set_max_parallelism(max_parallelism)
    if checkpoint_interval_ms is not None:
        env.enable_checkpointing(checkpoint_interval_ms)
    return env
