"""Missing Java: a clear message naming what to install, never a stack trace (jars need no Maven: test_jar_lock)."""

import subprocess
import sys

import pytest

from flink_agents_replay.local.errors import LocalServiceError
from flink_agents_replay.local.kafka_broker import LocalKafkaBroker


@pytest.fixture
def empty_path(monkeypatch, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("FLINK_AGENTS_REPLAY_HOME", str(tmp_path / "home"))
    return bin_dir


def test_missing_java_is_named(empty_path, tmp_path):
    with pytest.raises(LocalServiceError, match=r"'java' is not on PATH: install a Java 17 runtime"):
        LocalKafkaBroker(tmp_path / "kafka").start()


def test_cli_prints_the_message_not_a_traceback(empty_path, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "flink_agents_replay.cli", "local", "kafka", "start", "--work-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert "'java' is not on PATH" in result.stderr
    assert "Traceback" not in result.stderr


def test_status_of_a_never_started_broker(tmp_path):
    status = LocalKafkaBroker(tmp_path).status()
    assert not status.running and "not running" in status.describe()


def test_cluster_ids_never_start_with_a_dash():
    # A leading '-' made the storage tool read the id as an option (seen once in ~64 starts).
    from flink_agents_replay.local.kafka_broker import _cluster_id

    ids = [_cluster_id() for _ in range(3000)]
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)


def test_a_port_number_out_of_range_is_one_line_naming_the_range():
    from flink_agents_replay.local.processes import claim_port

    with pytest.raises(LocalServiceError, match=r"^port 70000 is not a TCP port: give --port N with N from 1 to 65535"):
        claim_port(70000)
