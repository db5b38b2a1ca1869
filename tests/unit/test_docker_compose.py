"""docker-compose.yml and the image recipe cannot be run here (no Docker engine): check their structure and
references."""

import fnmatch
import pathlib
import re

import yaml

from flink_agents_replay.local.jars import locked_jars

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
DOCKERFILE = ROOT / "deploy" / "image" / "Dockerfile"
RECIPE = DOCKERFILE.read_text()
PINNED_FLINK = re.search(r'"apache-flink==([0-9.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)


def _instructions(text: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    return [line.strip() for line in joined.splitlines() if line.strip()]


def _flink_properties(service: str) -> dict[str, str]:
    """The FLINK_PROPERTIES the official image's entrypoint writes into conf/config.yaml."""
    text = COMPOSE["services"][service]["environment"]["FLINK_PROPERTIES"]
    pairs = [line.split(":", 1) for line in text.splitlines() if line.strip()]
    return {key.strip(): value.strip() for key, value in pairs}


def test_services_are_kafka_and_a_flink_session_cluster():
    assert set(COMPOSE["services"]) == {"kafka", "jobmanager", "taskmanager"}
    assert COMPOSE["services"]["jobmanager"]["command"] == "jobmanager"
    assert COMPOSE["services"]["taskmanager"]["command"] == "taskmanager"


def test_kafka_runs_kraft_with_a_host_listener():
    env = COMPOSE["services"]["kafka"]["environment"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert "EXTERNAL://localhost:29092" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert "29092:29092" in COMPOSE["services"]["kafka"]["ports"]
    assert COMPOSE["services"]["kafka"]["image"].startswith("apache/kafka:4.")


def test_flink_services_build_the_deployment_image_from_the_wheel_alone():
    for name in ("jobmanager", "taskmanager"):
        build = COMPOSE["services"][name]["build"]
        assert (ROOT / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    copies = [line.split()[1:-1] for line in _instructions(RECIPE) if line.startswith("COPY ")]
    assert copies == [["dist/flink_agents_replay-*.whl"]]
    # BuildKit sends only what the Dockerfile's own ignore file lets through: the wheel, not .venv/ or .git/.
    ignore = [line for line in (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert ignore == ["*", "!dist/flink_agents_replay-*.whl"]
    assert fnmatch.fnmatch("flink_agents_replay-0.5.1-py3-none-any.whl", "flink_agents_replay-*.whl")
    for documented in (RECIPE, (ROOT / "docker-compose.yml").read_text()):
        assert "python -m build --wheel" in documented


def test_image_is_the_official_flink_of_the_pinned_version_with_a_jre_only():
    instructions = _instructions(RECIPE)
    froms = [line for line in instructions if line.startswith("FROM ")]
    assert froms == [f"FROM flink:{PINNED_FLINK}-scala_2.12-java17"]
    assert f"ARG FLINK_VERSION={PINNED_FLINK}" in instructions
    installs = " ".join(line for line in instructions if "apt-get install" in line)
    assert {"python3", "python3-pip", "python3-dev", "python-is-python3"} <= set(re.split(r"[\s;]+", installs))
    assert not re.search(r"jdk|maven|javac", installs, re.IGNORECASE)
    assert instructions[-1].startswith("RUN /opt/flink/bin/config-parser-utils.sh")
    users = [line for line in instructions if line.startswith("USER ")]
    assert users[-1] == "USER flink"


def test_kafka_connector_is_the_locked_jar_checked_by_its_sha256():
    connector = next(jar for jar in locked_jars() if jar.artifact == "flink-sql-connector-kafka")
    adds = [line.split() for line in _instructions(RECIPE) if line.startswith("ADD ")]
    assert len(adds) == 1
    add = adds[0]
    assert f"--checksum=sha256:{connector.sha256}" in add
    assert add[-2] == connector.url("https://repo1.maven.org/maven2")
    assert add[-1] == "/opt/flink/lib/"


def test_thread_mode_and_the_s3_plugin_are_set_up():
    assert "cp /opt/flink/opt/flink-python-${FLINK_VERSION}.jar /opt/flink/lib/" in RECIPE
    assert "cp /opt/flink/opt/flink-s3-fs-presto-${FLINK_VERSION}.jar /opt/flink/plugins/s3-fs-presto/" in RECIPE
    settings = dict(re.findall(r"-D([\w.-]+)=(\S+)", RECIPE))
    assert settings["python.execution-mode"] == "thread"
    assert settings["classloader.parent-first-patterns.additional"] == "pemja."


def test_session_cluster_configuration():
    for name in ("jobmanager", "taskmanager"):
        properties = _flink_properties(name)
        assert properties["jobmanager.rpc.address"] == "jobmanager"
        assert properties["execution.checkpointing.dir"].startswith("file:///data/flink/")
        assert properties["execution.checkpointing.savepoint-dir"].startswith("file:///data/flink/")
        # The image's entrypoint strips every space of a line: a value with spaces would be mangled.
        assert all(" " not in value for value in properties.values())


def test_shared_volume_is_declared():
    assert "flink-data" in COMPOSE["volumes"]
    for name in ("jobmanager", "taskmanager"):
        assert "flink-data:/data/flink" in COMPOSE["services"][name]["volumes"]
    assert "chown -R flink:flink /opt/flink/lib /opt/flink/plugins /data/flink" in RECIPE
