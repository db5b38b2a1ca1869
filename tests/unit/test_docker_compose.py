"""docker-compose.yml cannot be run here (no Docker engine): check its structure and references."""

import pathlib

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


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


def test_flink_image_builds_from_files_that_exist():
    for name in ("jobmanager", "taskmanager"):
        build = COMPOSE["services"][name]["build"]
        dockerfile = ROOT / build["context"] / build["dockerfile"]
        assert dockerfile.is_file()
        text = dockerfile.read_text()
        for line in text.splitlines():
            if line.startswith("COPY "):
                for source in line.split()[1:-1]:
                    assert (ROOT / source).exists(), f"{dockerfile.name} copies missing {source}"
    entrypoint = ROOT / "conf" / "docker" / "flink-entrypoint.sh"
    assert entrypoint.is_file() and entrypoint.stat().st_mode & 0o111


def test_flink_config_runs_python_in_thread_mode_with_the_pemja_fix():
    config = yaml.safe_load((ROOT / "conf" / "docker" / "config.yaml").read_text())
    assert config["python"]["execution-mode"] == "thread"
    assert "pemja." in config["classloader"]["parent-first-patterns"]["additional"]
    assert config["jobmanager"]["rpc"]["address"] == "jobmanager"
    assert "flink-python" in (ROOT / "conf" / "docker" / "flink-entrypoint.sh").read_text()


def test_shared_volume_is_declared():
    assert "flink-data" in COMPOSE["volumes"]
    for name in ("jobmanager", "taskmanager"):
        assert "flink-data:/data/flink" in COMPOSE["services"][name]["volumes"]
