"""`flink-agents-replay local kafka ...`: a real broker started, found, reused and stopped by PID."""

import socket
import subprocess
import sys
import time

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from flink_agents_replay.local.errors import LocalServiceError
from flink_agents_replay.local.kafka_broker import LocalKafkaBroker
from flink_agents_replay.local.processes import pid_alive

pytestmark = pytest.mark.integration


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "flink_agents_replay.cli", "local", "kafka", *args],
        capture_output=True, text=True, timeout=180,
    )


def test_start_status_stop_and_restart_keeps_data(tmp_path):
    work = tmp_path / "kafka"
    started = _cli("start", "--port", "0", "--work-dir", str(work))
    assert started.returncode == 0, started.stderr
    bootstrap = started.stdout.split("KAFKA_BOOTSTRAP_SERVERS=")[1].strip()
    status = LocalKafkaBroker(work).status()
    try:
        assert status.running and status.bootstrap_servers == bootstrap
        assert _cli("status", "--work-dir", str(work)).returncode == 0
        # A second start finds the running broker instead of starting another.
        again = _cli("start", "--port", "0", "--work-dir", str(work))
        assert again.returncode == 0 and "already running" in again.stdout
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.create_topics([NewTopic("kept", 3, 1)]).values():
            future.result(timeout=30)
    finally:
        stopped = _cli("stop", "--work-dir", str(work))
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert not pid_alive(status.pid)
    not_running = _cli("status", "--work-dir", str(work))
    assert not_running.returncode == 3 and "not running" in not_running.stdout

    # Restart on the same work directory: the formatted storage and its topics are reused.
    broker = LocalKafkaBroker(work, port=0)
    restarted = broker.start()
    try:
        topics = AdminClient({"bootstrap.servers": restarted.bootstrap_servers}).list_topics(timeout=30).topics
        assert topics["kept"].partitions.keys() == {0, 1, 2}
    finally:
        assert broker.stop() is True
    assert not pid_alive(restarted.pid)
    assert _cli("stop", "--work-dir", str(work)).stdout.strip() == "was not running"

    # A broker whose data goes away is discarded: killed at once, no controlled shutdown, nothing left running.
    discarded = broker.start()
    started_at = time.monotonic()
    assert broker.discard() is True
    assert not pid_alive(discarded.pid) and not broker.status().running
    assert time.monotonic() - started_at < 5, "discard waited for a controlled shutdown"
    assert broker.discard() is False


def test_taken_port_is_a_clear_error(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(LocalServiceError, match=rf"port {port} .* already in use.*--port"):
            LocalKafkaBroker(tmp_path, port=port).start()
        result = _cli("start", "--port", str(port), "--work-dir", str(tmp_path))
    assert result.returncode == 2
    assert f"port {port}" in result.stderr and "Traceback" not in result.stderr
    assert not LocalKafkaBroker(tmp_path).status().running
