"""Secrets stay secret: the signing key and Kafka secrets appear in no repr, message or command line (#13 part 5).

Configs end up in log lines and tracebacks, so ``AgentConfig`` redacts them; the job scripts take the key from a
file (``--signing-key-file``) or the environment, and ``--signing-key`` still works but warns that ``ps`` shows it.
"""

from pathlib import Path

import pytest

from flink_agents_replay.core.errors import ConfigError
from flink_agents_replay.flink.config import SIGNING_KEY_ENV, AgentConfig
from flink_agents_replay.jobs import agent_job, replay_job

TEST_JOBS = Path(__file__).resolve().parents[1] / "jobs"
SIGNING_KEY = "s3cret-signing-key-0123456789"
SECRETS = {"sasl.password": "sasl-pa55word", "ssl.key.password": "ssl-key-pa55", "ssl.keystore.password": "ks-pa55",
           "sasl.oauthbearer.client.secret": "oauth-5ecret", "sasl.jaas.config": "jaas-with-pa55"}


def test_a_config_shows_no_secret_in_its_repr_or_str():
    config = AgentConfig(kafka={"bootstrap.servers": "kafka:9092", **SECRETS}, signing_key=SIGNING_KEY)
    for shown in (repr(config), str(config), repr(config.resolved("agent")), f"{config}", repr([config])):
        assert SIGNING_KEY not in shown
        assert not [secret for secret in SECRETS.values() if secret in shown], shown
        assert "kafka:9092" in shown and "sasl.password" in shown and "signing_key='***'" in shown


def test_a_short_key_is_refused_without_showing_it():
    with pytest.raises(ConfigError) as refused:
        AgentConfig(kafka={"bootstrap.servers": "kafka:9092"}, signing_key="short-s3cret").resolved("agent")
    assert "short-s3cret" not in str(refused.value)


def test_the_main_job_takes_the_key_from_a_file_or_the_environment(tmp_path, monkeypatch):
    key_file = tmp_path / "signing.key"
    key_file.write_text(SIGNING_KEY + "\n")
    monkeypatch.delenv(SIGNING_KEY_ENV, raising=False)
    common = ["--bootstrap-servers", "127.0.0.1:9092"]
    assert agent_job.parse_args([*common, "--signing-key-file", str(key_file)]).signing_key == SIGNING_KEY
    monkeypatch.setenv(SIGNING_KEY_ENV, SIGNING_KEY)
    assert agent_job.parse_args(common).signing_key == SIGNING_KEY
    with pytest.warns(UserWarning, match="ps"):
        assert agent_job.parse_args([*common, "--signing-key", SIGNING_KEY]).signing_key == SIGNING_KEY


@pytest.mark.parametrize("content", ["short-s3cret\n", ""])
def test_a_bad_key_file_is_a_usage_error_that_names_the_file_not_the_key(content, tmp_path, capsys):
    key_file = tmp_path / "signing.key"
    key_file.write_text(content)
    with pytest.raises(SystemExit) as exited:
        agent_job.parse_args(["--bootstrap-servers", "127.0.0.1:9092", "--signing-key-file", str(key_file)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert str(key_file) in err and "Traceback" not in err
    assert not content or content.strip() not in err


def test_a_missing_key_file_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        agent_job.parse_args(["--bootstrap-servers", "127.0.0.1:9092", "--signing-key-file", str(tmp_path / "none")])
    assert "cannot read the signing key file" in capsys.readouterr().err


@pytest.mark.parametrize("script", [agent_job.__file__, replay_job.__file__, TEST_JOBS / "embedded_agent_job.py"])
def test_every_job_offers_a_key_file(script):
    text = Path(script).read_text()
    assert "--signing-key-file" in text and "job_signing_key(" in text
