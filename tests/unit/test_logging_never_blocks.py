"""The package's log lines never block a task thread (found by the adversarial check of issue 35).

PyFlink starts a local MiniCluster's JVM with its stderr on a pipe that it reads only if the JVM fails to start
(``pyflink_gateway_server.launch_gateway_server_process``): Python logging in thread mode writes there, and after
64 KB the write blocks for ever, holding the handler's lock: a burst of a few hundred refused decisions, each
logged, wedged the agent's task and every Python operator of the TaskManager.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from flink_agents_replay.flink.logs import LOG_FILE_ENV

SCRIPT = textwrap.dedent("""
    import logging, os, time
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)  # stderr: a pipe nobody reads, as PyFlink's gateway leaves it
    from flink_agents_replay.flink.logs import configure_logging, dropped_log_records
    configure_logging()
    log = logging.getLogger("flink_agents_replay.operator")
    began = time.monotonic()
    for n in range(15000):
        log.warning("a decision was refused (%d): %s", n, "x" * 200)
    print(f"{time.monotonic() - began:.2f} {dropped_log_records()}", flush=True)
""")


def test_a_flood_of_log_lines_to_an_unread_pipe_does_not_block_the_caller():
    env = {name: value for name, value in os.environ.items() if name != LOG_FILE_ENV}  # to stderr, the default
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=30, env=env)
    assert done.returncode == 0, done.stderr
    seconds, dropped = done.stdout.split()
    assert float(seconds) < 10  # 15,000 lines, 3.6 MB: far past the pipe's 64 KB
    assert int(dropped) > 0  # those the blocked writer could not take were dropped, and counted
