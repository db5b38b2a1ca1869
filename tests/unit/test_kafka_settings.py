"""The user's Kafka settings reach every client the package builds (issue #12: SASL/SSL were lost)."""

from __future__ import annotations

import pytest

from flink_agents_replay.integrations.kafka.admin import ensure_topics

SECURE = {
    "bootstrap.servers": "kafka.example:9093",
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "PLAIN",
    "sasl.username": "alice",
    "sasl.password": "alice-secret",
}


class _Topics:
    def __init__(self, names):
        self.topics = dict.fromkeys(names)


class _Done:
    def result(self, timeout=None):
        return None


class _RecordingAdminClient:
    """Stands in for confluent-kafka's AdminClient: records the settings it was built with."""

    built: list[dict] = []

    def __init__(self, config):
        self.built.append(dict(config))
        self.created: list[str] = []

    def list_topics(self, topic=None, timeout=-1):
        return _Topics(["exists"])

    def poll(self, timeout=-1):
        return 0

    def create_topics(self, new_topics, request_timeout=-1, **_):
        return {t.topic: _Done() for t in new_topics}


def _without_logger(config: dict) -> dict:
    """A client configuration without the ``logger`` every client gets (tested on its own below)."""
    return {name: value for name, value in config.items() if name != "logger"}


@pytest.fixture
def admin_clients(monkeypatch):
    import confluent_kafka.admin

    built: list[dict] = []
    monkeypatch.setattr(_RecordingAdminClient, "built", built)
    monkeypatch.setattr(confluent_kafka.admin, "AdminClient", _RecordingAdminClient)
    return built


def test_ensure_topics_builds_its_admin_client_with_the_users_security_settings(admin_clients):
    created = ensure_topics(SECURE, ["exists", "replies"], 2)
    assert created == ["replies"]
    assert admin_clients and all(_without_logger(config) == SECURE for config in admin_clients)


def test_ensure_topics_still_takes_a_bare_bootstrap_string(admin_clients):
    assert ensure_topics("127.0.0.1:9092", ["exists"], 1) == []
    assert [_without_logger(config) for config in admin_clients] == [{"bootstrap.servers": "127.0.0.1:9092"}]


# -- KafkaSettings: built once, every client configuration derived from it ------------------------------------------
def test_settings_come_from_a_mapping_a_bootstrap_string_or_settings():
    from flink_agents_replay.integrations.kafka import KafkaSettings

    settings = KafkaSettings.of(SECURE)
    assert settings.client == SECURE and settings.bootstrap_servers == "kafka.example:9093"
    assert KafkaSettings.of(settings) is settings
    assert KafkaSettings.of("host:9092").client == {"bootstrap.servers": "host:9092"}


def test_settings_do_not_change_when_the_users_dict_does():
    from flink_agents_replay.integrations.kafka import KafkaSettings

    given = dict(SECURE)
    settings = KafkaSettings.of(given)
    given["sasl.password"] = "changed"
    settings.client["sasl.username"] = "mallory"
    assert settings.client == SECURE


@pytest.mark.parametrize("given", [{}, {"bootstrap.servers": ""}, {"security.protocol": "SSL"}])
def test_settings_without_bootstrap_servers_are_a_config_error(given):
    from flink_agents_replay.core.errors import ConfigError
    from flink_agents_replay.integrations.kafka import KafkaSettings

    with pytest.raises(ConfigError, match="bootstrap.servers"):
        KafkaSettings.of(given)


def test_every_client_configuration_carries_the_users_settings():
    from flink_agents_replay.integrations.kafka import KafkaSettings

    settings = KafkaSettings.of(SECURE)
    assert _without_logger(settings.admin_config()) == SECURE
    assert _without_logger(settings.producer_config(durable=False)) == SECURE
    assert _without_logger(settings.producer_config(durable=True)) == {**SECURE, "enable.idempotence": True,
                                                                       "acks": "all"}
    reader = settings.reader_config(purpose="recovery")
    assert {k: reader[k] for k in SECURE} == SECURE
    assert reader["enable.auto.commit"] is False and reader["auto.offset.reset"] == "error"
    assert reader["group.id"] != settings.reader_config(purpose="recovery")["group.id"]  # never shared


@pytest.mark.parametrize("setting", [{"acks": "1"}, {"enable.idempotence": False}])
def test_a_durable_producer_refuses_settings_that_contradict_it_naming_what_needs_it(setting):
    from flink_agents_replay.core.errors import ConfigError
    from flink_agents_replay.integrations.kafka import KafkaSettings

    settings = KafkaSettings.of({**SECURE, **setting})
    assert _without_logger(settings.producer_config(durable=False)) == {**SECURE, **setting}
    with pytest.raises(ConfigError, match=f"the capture topic needs Kafka setting {next(iter(setting))}=.*remove"):
        settings.producer_config(durable=True, what="capture topic")


def test_agreeing_durable_settings_are_accepted():
    from flink_agents_replay.integrations.kafka import KafkaSettings

    settings = KafkaSettings.of({**SECURE, "acks": "all", "enable.idempotence": "true"})
    assert settings.producer_config(durable=True)["acks"] == "all"


def test_an_ordered_producer_keeps_one_request_in_flight_and_refuses_more():
    from flink_agents_replay.core.errors import ConfigError
    from flink_agents_replay.integrations.kafka import KafkaSettings

    ordered = KafkaSettings.of(SECURE).producer_config(durable=True, ordered=True)
    assert _without_logger(ordered) == {**SECURE, "enable.idempotence": True, "acks": "all",
                                        "max.in.flight.requests.per.connection": 1}
    settings = KafkaSettings.of({**SECURE, "max.in.flight.requests.per.connection": 5})
    assert settings.producer_config(durable=True)["max.in.flight.requests.per.connection"] == 5
    with pytest.raises(ConfigError, match="the topic load needs Kafka setting max.in.flight.requests.per.connection=1"):
        settings.producer_config(durable=True, ordered=True, what="topic load")


def test_a_committed_only_reader_reads_committed_and_refuses_read_uncommitted():
    from flink_agents_replay.core.errors import ConfigError
    from flink_agents_replay.integrations.kafka import KafkaSettings

    reader = KafkaSettings.of(SECURE).reader_config(purpose="dump", committed_only=True)
    assert reader["isolation.level"] == "read_committed" and reader["group.id"].startswith("flink-agents-replay-dump-")
    assert {k: reader[k] for k in SECURE} == SECURE
    assert "isolation.level" not in KafkaSettings.of(SECURE).reader_config(purpose="dump")
    uncommitted = KafkaSettings.of({**SECURE, "isolation.level": "read_uncommitted"})
    with pytest.raises(ConfigError, match="the dump reader needs Kafka setting isolation.level=read_committed"):
        uncommitted.reader_config(purpose="dump", committed_only=True)


def test_repr_hides_secrets_and_pickling_keeps_everything():
    import pickle

    from flink_agents_replay.integrations.kafka import KafkaSettings

    settings = KafkaSettings.of({**SECURE, "ssl.key.password": "k3y"})
    assert "alice-secret" not in repr(settings) and "k3y" not in repr(settings) and "alice" in repr(settings)
    assert pickle.loads(pickle.dumps(settings)) == settings


def test_agent_config_hands_out_its_kafka_settings():
    from flink_agents_replay.flink.config import AgentConfig

    assert AgentConfig(kafka=SECURE).kafka_settings().client == SECURE


# -- topic roles: errors name what the topic is --------------------------------------------------------------------
@pytest.mark.parametrize(("role_name", "label"), [("JOURNAL", "journal topic"), ("CAPTURE", "capture topic")])
def test_a_compacting_topic_config_is_refused_naming_the_topics_role(role_name, label):
    from flink_agents_replay.core.errors import ConfigError
    from flink_agents_replay.integrations.kafka import topics

    with pytest.raises(ConfigError, match=rf"topic_config for {label} 't' sets cleanup.policy=compact.*remove"):
        topics.created_topic_config("t", getattr(topics, role_name), {"cleanup.policy": "compact"}, False)
    assert topics.created_topic_config("t", getattr(topics, role_name), {}, False) == {"cleanup.policy": "delete"}


def test_the_manifest_role_is_compacted_on_purpose():
    from flink_agents_replay.integrations.kafka import topics

    assert topics.MANIFEST.compacted and not topics.CAPTURE.compacted and not topics.JOURNAL.compacted
    assert topics.created_topic_config("m", topics.MANIFEST, {"cleanup.policy": "compact"}, True) == {
        "cleanup.policy": "compact"}


def test_partition_rules_say_why_the_count_matters():
    from flink_agents_replay.integrations.kafka import topics

    assert topics.JOURNAL.partition_rule(128) == "the job's max parallelism is 128 (one partition per key group)"
    assert topics.MANIFEST.partition_rule(1) == "it must have 1"


def test_ensure_topics_accepts_a_topic_created_meanwhile(monkeypatch, admin_clients):
    from confluent_kafka import KafkaError, KafkaException

    class _AlreadyThere:
        def result(self, timeout=None):
            raise KafkaException(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS))

    monkeypatch.setattr(_RecordingAdminClient, "create_topics",
                        lambda self, new_topics, request_timeout=-1: {t.topic: _AlreadyThere() for t in new_topics})
    assert ensure_topics(SECURE, ["raced"], 1) == ["raced"]


def test_ensure_topics_names_the_topic_it_could_not_create(monkeypatch, admin_clients):
    from confluent_kafka import KafkaError, KafkaException

    from flink_agents_replay.core.errors import JournalError

    class _Refused:
        def result(self, timeout=None):
            raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))

    monkeypatch.setattr(_RecordingAdminClient, "create_topics",
                        lambda self, new_topics, request_timeout=-1: {t.topic: _Refused() for t in new_topics})
    with pytest.raises(JournalError, match="could not create topic 'replies'"):
        ensure_topics(SECURE, ["replies"], 1)


def test_the_command_line_takes_kafka_client_settings_with_x():
    from flink_agents_replay.cli import _kafka_settings, build_parser
    from flink_agents_replay.core.errors import ReplayError

    args = build_parser().parse_args(["inspect", "--bootstrap-servers", "kafka.example:9093", "--topic", "t",
                                      "-X", "security.protocol=SASL_SSL", "-X", "sasl.jaas.config=a=b"])
    assert _kafka_settings(args).client == {"bootstrap.servers": "kafka.example:9093",
                                            "security.protocol": "SASL_SSL", "sasl.jaas.config": "a=b"}
    args = build_parser().parse_args(["diff", "--replay", "r", "-X", "no-value"])
    with pytest.raises(ReplayError, match="NAME=VALUE"):
        _kafka_settings(args)
