"""Process and port helpers of the local services: ports no two processes hand out at once, services reaped."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import warnings

from flink_agents_replay.local.processes import _claim_on_this_host, pid_alive, spawn_service, stop_process


def test_a_port_another_process_handed_out_is_not_handed_out_here():
    # Parallel test workers choose ports in separate processes and bind them seconds later.
    chosen = subprocess.run([sys.executable, "-c", "from flink_agents_replay.local.processes import free_port; "
                             "print(free_port())"], capture_output=True, text=True, check=True, timeout=60)
    port = int(chosen.stdout)
    assert not _claim_on_this_host(port)


def _service() -> subprocess.Popen:
    return spawn_service([sys.executable, "-c", "import time; time.sleep(60)"], stdin=subprocess.DEVNULL)


def test_a_service_stopped_here_is_waited_for_and_warns_nothing_when_dropped():
    process = _service()
    pid = process.pid
    assert stop_process(pid, timeout_s=5) and not pid_alive(pid)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        del process  # a Popen dropped before it was waited for warns "subprocess ... is still running"
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


def test_a_service_killed_by_another_process_is_reaped_when_stopped_here():
    process = _service()
    os.kill(process.pid, signal.SIGKILL)  # as a CLI `stop` from another process, or a crash
    os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)  # dead (a zombie), not yet reaped
    assert not stop_process(process.pid)
    assert process.returncode == -signal.SIGKILL  # waited for: no zombie left, no warning when dropped


def test_the_local_jvm_options_reach_the_flink_configuration(tmp_path, monkeypatch):
    import yaml

    from flink_agents_replay.local.flink_cluster import LocalFlinkCluster
    from flink_agents_replay.local.processes import LOCAL_JVM_OPTIONS_ENV

    for options in ("", "-XX:TieredStopAtLevel=1 -Xss2m"):
        monkeypatch.setenv(LOCAL_JVM_OPTIONS_ENV, options)
        cluster = LocalFlinkCluster(tmp_path / f"cluster{len(options)}")
        cluster._write_configuration(rest_port=18081, rpc_port=16123)
        config = yaml.safe_load((cluster.conf_dir / "config.yaml").read_text())
        # None when unset: an empty setting reaches `java` as an empty argument ("main class ''").
        assert config.get("env.java.opts.all") == (options or None) and config["rest.port"] == 18081
