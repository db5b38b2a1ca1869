"""Where the test broker comes from: environment first, then Docker, then the local jars."""

import pytest

from flink_agents_replay.testing.kafka import KafkaSource, docker_engine_answers, select_kafka_source


def _docker(answer):
    calls = []

    def ask():
        calls.append(1)
        return answer

    return ask, calls


def test_environment_wins_and_docker_is_not_asked():
    ask, calls = _docker(True)
    assert select_kafka_source({"KAFKA_BOOTSTRAP_SERVERS": "broker:9092"}, ask) is KafkaSource.ENVIRONMENT
    assert calls == []


@pytest.mark.parametrize("value", ["", "   "])
def test_blank_environment_value_is_ignored(value):
    ask, _ = _docker(False)
    assert select_kafka_source({"KAFKA_BOOTSTRAP_SERVERS": value}, ask) is KafkaSource.LOCAL


def test_docker_engine_means_testcontainers():
    ask, calls = _docker(True)
    assert select_kafka_source({}, ask) is KafkaSource.TESTCONTAINERS
    assert calls == [1]


def test_no_docker_means_local_broker():
    ask, _ = _docker(False)
    assert select_kafka_source({}, ask) is KafkaSource.LOCAL


def test_docker_probe_says_no_without_an_engine(monkeypatch, tmp_path):
    # Point the client at a socket that does not exist: the probe must answer False, quickly.
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    assert docker_engine_answers(timeout_s=1) is False
