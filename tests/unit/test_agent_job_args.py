"""The packaged main job's command line: durability modes by their current names, the old one still taken."""

import pytest

from flink_agents_replay.jobs import agent_job

COMMON = ["--bootstrap-servers", "127.0.0.1:9092"]


def test_the_help_offers_the_current_modes_and_the_old_name_still_runs_per_run(capsys, monkeypatch):
    monkeypatch.setenv("FLINK_AGENTS_REPLAY_SIGNING_KEY", "0123456789abcdef0123")
    assert agent_job.parse_args([*COMMON, "--durability", "per_bundle"]).durability == "per_run"
    assert agent_job.parse_args(COMMON).durability == "per_run"
    with pytest.raises(SystemExit):
        agent_job.parse_args([*COMMON, "--help"])
    assert "per_bundle" not in capsys.readouterr().out
    with pytest.raises(SystemExit):
        agent_job.parse_args([*COMMON, "--durability", "per_nothing"])
    assert "invalid choice: 'per_nothing'" in capsys.readouterr().err


def test_signals_and_waits_topics_are_optional(monkeypatch):
    monkeypatch.setenv("FLINK_AGENTS_REPLAY_SIGNING_KEY", "0123456789abcdef0123")
    args = agent_job.parse_args(COMMON)
    assert args.signals_topic is None and args.waits_topic is None
    args = agent_job.parse_args([*COMMON, "--signals-topic", "decisions", "--waits-topic", "waits"])
    assert (args.signals_topic, args.waits_topic) == ("decisions", "waits")
    assert agent_job.WAITS_TOPIC_CONFIG == {"cleanup.policy": "compact"}


def test_later_tickets_hold_by_default_and_may_run_while_one_waits(monkeypatch, capsys):
    monkeypatch.setenv("FLINK_AGENTS_REPLAY_SIGNING_KEY", "0123456789abcdef0123")
    assert agent_job.parse_args(COMMON).later_inputs_while_waiting == "hold"
    assert agent_job.parse_args([*COMMON, "--later-inputs-while-waiting", "run"]).later_inputs_while_waiting == "run"
    with pytest.raises(SystemExit):
        agent_job.parse_args([*COMMON, "--later-inputs-while-waiting", "skip"])
    assert "invalid choice: 'skip'" in capsys.readouterr().err
