"""Agent config settings of the wrong type are refused by name when the config is resolved, before any job."""

import pytest

from flink_agents_replay.core.errors import ConfigError
from flink_agents_replay.flink.config import AgentConfig

BASE = {"kafka": {"bootstrap.servers": "127.0.0.1:9092"}, "signing_key": "a-signing-key-of-20ch"}


@pytest.mark.parametrize(("setting", "message"), [
    ({"max_concurrent_runs": "eight"}, "max_concurrent_runs must be a whole number, got 'eight' (str)"),
    ({"max_concurrent_runs": True}, "max_concurrent_runs must be a whole number, got True (bool)"),
    ({"max_parallelism": 1.5}, "max_parallelism must be a whole number, got 1.5 (float)"),
    ({"max_waiting_inputs": "64"}, "max_waiting_inputs must be a whole number or None, got '64' (str)"),
    ({"ack_timeout_s": "60"}, "ack_timeout_s must be a finite number of seconds, got '60' (str)"),
    ({"capture": "yes"}, "capture must be True or False, got 'yes' (str)"),
    ({"journal_topic": 7}, "journal_topic must be a string or None, got 7 (int)"),
    ({"kafka": "127.0.0.1:9092"}, "kafka must be a dict, got '127.0.0.1:9092' (str)"),
    ({"output_topics": "replies"}, "output_topics must be a list of topic names (a list, not one string), got "
                                   "'replies' (str)"),
    ({"close_timeout_s": float("nan")}, "close_timeout_s must be a finite number of seconds, got nan (float)"),
    ({"accept_moved_journal_from": [7]}, "accept_moved_journal_from must be a topic id, a list of them, or None"),
])
def test_a_setting_of_the_wrong_type_is_named_with_what_it_must_be(setting, message):
    with pytest.raises(ConfigError) as raised:
        AgentConfig.from_mapping({**BASE, **setting}).resolved("agent")
    assert str(raised.value).startswith(message)


def test_settings_of_the_right_types_resolve():
    config = AgentConfig.from_mapping({**BASE, "max_concurrent_runs": 4, "ack_timeout_s": 5, "close_timeout_s": 2.5,
                                       "max_waiting_inputs": None, "capture": True}).resolved("agent")
    assert (config.max_concurrent_runs, config.ack_timeout_s, config.capture) == (4, 5, True)


def test_numpy_values_that_say_the_same_are_taken_as_plain_python():
    import numpy as np

    config = AgentConfig.from_mapping({**BASE, "max_concurrent_runs": np.int64(4), "ack_timeout_s": np.float32(5),
                                       "capture": np.bool_(True), "output_topics": ["replies"]}).resolved("agent")
    values = (config.max_concurrent_runs, config.ack_timeout_s, config.capture, config.output_topics)
    assert values == (4, 5.0, True, ("replies",)) and [type(v) for v in values] == [int, float, bool, tuple]


@pytest.mark.parametrize(("setting", "message"), [
    ({"max_parallelism": 0}, "max_parallelism must be between 1 and 32768, got 0"),
    ({"max_parallelism": 40000}, "max_parallelism must be between 1 and 32768, got 40000"),
    ({"max_concurrent_runs": 0}, "max_concurrent_runs must be at least 1, got 0"),
    ({"ack_timeout_s": 0}, "ack_timeout_s must be positive, got 0"),
    ({"close_timeout_s": -1.5}, "close_timeout_s must be positive, got -1.5"),
])
def test_a_setting_out_of_its_limits_is_named_with_its_limits(setting, message):
    with pytest.raises(ConfigError) as raised:
        AgentConfig.from_mapping({**BASE, **setting}).resolved("agent")
    assert str(raised.value) == message


@pytest.mark.parametrize(("setting", "message"), [
    # Each passed the checks before and then failed inside the running job (an int32 of milliseconds, int(inf)).
    ({"slot_wait_timeout_s": float("inf")}, "slot_wait_timeout_s must be a finite number of seconds, got inf (float)"),
    ({"ack_timeout_s": 1e12}, "ack_timeout_s must be at most 2147483, got 1000000000000.0"),
    ({"fallback_check_ms": 2**70}, f"fallback_check_ms must be between 1 and 2147483647, got {2**70}"),
    ({"signing_key": 1234567890123456789}, "signing_key must be a string or bytes, or None, got 1234567890123456789"),
    ({"verification_keys": None}, "verification_keys must be a list of keys (strings or bytes), got None"),
])
def test_a_value_a_running_job_could_not_take_is_refused_up_front(setting, message):
    with pytest.raises(ConfigError) as raised:
        AgentConfig.from_mapping({**BASE, **setting}).resolved("agent")
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize("config", ["bootstrap.servers=x", [], None])
def test_a_config_that_is_not_a_mapping_is_named_as_such(config):
    with pytest.raises(ConfigError, match="^the agent config must be an AgentConfig or a dict of its settings"):
        AgentConfig.from_mapping(config)


def test_a_set_of_topics_is_refused_and_any_mapping_is_taken():
    import types

    with pytest.raises(ConfigError, match=r"^output_topics must be a list of topic names .* \(set\)"):
        AgentConfig.from_mapping({**BASE, "output_topics": {"replies"}}).resolved("agent")  # its order varies
    config = AgentConfig.from_mapping({**BASE, "topic_config": types.MappingProxyType({"retention.ms": "1"})})
    assert config.resolved("agent").topic_config == {"retention.ms": "1"}


def test_a_wrong_type_is_named_before_a_value_out_of_its_limits():
    with pytest.raises(ConfigError, match="^capture must be True or False"):
        AgentConfig.from_mapping({**BASE, "max_concurrent_runs": 0, "capture": "yes"}).resolved("agent")


def test_a_history_may_never_expire_and_wait_for_months():
    for expiry in (float("inf"), 90 * 24 * 3600.0):
        resolved = AgentConfig.from_mapping({**BASE, "recovered_history_expiry_s": expiry}).resolved("agent")
        assert resolved.recovered_history_expiry_s == expiry
    config = AgentConfig.from_mapping(BASE)
    assert AgentConfig.from_mapping(config) is config
    assert AgentConfig.from_mapping({**BASE, "signing_key": bytearray(b"k" * 20)}).resolved("a").signing_key_bytes \
        == b"k" * 20
