"""A new Flink or PyFlink process started from one that ran Flink must not inherit that process's own variables."""

from flink_agents_replay.flink.env import fresh_process_environment


def test_per_process_flink_variables_are_dropped_and_the_rest_kept():
    base = {"PYFLINK_GATEWAY_DISABLED": "true", "_FLINK_HOME_DETERMINED": "1", "PATH": "/bin", "KAFKA": "x"}
    assert fresh_process_environment(base) == {"PATH": "/bin", "KAFKA": "x"}
