"""The testing API names a wrong argument where it is given, not deep inside Kafka or Flink."""

import pytest

from flink_agents_replay.testing import FailOver
from flink_agents_replay.testing._environment import _key_of


def test_a_key_that_is_not_a_string_is_named_with_the_input():
    with pytest.raises(TypeError, match=r"run\(key=\.\.\.\) must return a str .* got 7 \(int\) for \{'n': 7\}"):
        _key_of(lambda record: record["n"], {"n": 7})
    assert _key_of(lambda record: record["c"], {"c": "ada"}) == "ada"


@pytest.mark.parametrize("after", ["3", 2.5, True])
def test_a_fail_over_point_that_is_not_a_whole_number_is_refused(after):
    with pytest.raises(TypeError, match="must be a whole number"):
        FailOver(after_outputs=after)


def test_config_takes_a_dict_or_an_agent_config_whose_settings_other_than_defaults_apply():
    from flink_agents_replay import AgentConfig
    from flink_agents_replay.core.errors import ConfigError
    from flink_agents_replay.testing._environment import _settings_given

    assert _settings_given(None) == {}
    assert _settings_given({"max_concurrent_runs": 4}) == {"max_concurrent_runs": 4}
    given = _settings_given(AgentConfig(max_concurrent_runs=4, later_inputs_while_waiting="run"))
    assert given == {"max_concurrent_runs": 4, "later_inputs_while_waiting": "run"}  # broker, key: the environment's
    with pytest.raises(ConfigError, match="unknown agent config setting"):
        _settings_given({"max_concurrent_run": 4})
