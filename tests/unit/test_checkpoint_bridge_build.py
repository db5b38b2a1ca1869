"""The checkpoint bridge jar: the wheel's, else built from source into the cache outside the repo, once per digest.

(That a built wheel carries the jar, and that the same JDK rebuilds it byte for byte, is checked on a real wheel
by tests/integration/test_installed_wheel.py.)"""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from flink_agents_replay.flink.checkpoint_bridge import build, compile_jar
from flink_agents_replay.flink.checkpoint_bridge.build import BridgeBuildError

REPO = Path(__file__).resolve().parents[2]
OPERATOR_CLASS = "io/github/flinkagentsreplay/bridge/CheckpointBridgeOperator.class"

needs_javac = pytest.mark.skipif(shutil.which("javac") is None, reason="needs a JDK (javac)")


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("FLINK_AGENTS_REPLAY_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@needs_javac
def test_builds_java_11_classes_into_the_cache_and_reuses_them(home, monkeypatch):
    jar = build.bridge_jar()

    assert jar == home / "bridge" / build.source_digest() / build.JAR_NAME
    with zipfile.ZipFile(jar) as archive:
        names = archive.namelist()
        header = archive.read(OPERATOR_CLASS)[:8]
    assert OPERATOR_CLASS in names
    assert not [n for n in names if n.startswith("org/apache/flink/")], "the bridge must not be in org.apache.flink"
    assert int.from_bytes(header[6:8], "big") == 55, "class files must target Java 11 (major version 55)"
    assert [p.name for p in jar.parent.iterdir()] == [build.JAR_NAME], "no temporary build files left behind"

    def no_compiler(*args, **kwargs):
        raise AssertionError("the cached jar should have been reused")

    monkeypatch.setattr(subprocess, "run", no_compiler)
    assert build.bridge_jar() == jar


def test_digest_covers_sources_and_pyflink_version(tmp_path, monkeypatch):
    original = build.source_digest()
    assert original == build.source_digest()

    monkeypatch.setattr(build, "_pyflink_version", lambda: "9.9.9")
    assert build.source_digest() != original
    monkeypatch.undo()

    copy = tmp_path / "java"
    shutil.copytree(build.JAVA_ROOT, copy)
    monkeypatch.setattr(build, "JAVA_ROOT", copy)
    assert build.source_digest() == original
    source = next(copy.rglob("CheckpointBridgeOperator.java"))
    source.write_text(source.read_text() + "\n// changed\n")
    assert build.source_digest() != original


def test_missing_javac_names_the_fix(home, tmp_path, monkeypatch):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("JAVA_HOME", raising=False)

    with pytest.raises(BridgeBuildError, match=r"'javac' is not on PATH.*JDK 11 or later"):
        build.bridge_jar()
    assert not list(home.rglob("*.jar"))


@needs_javac
def test_compile_error_reports_javac_output_and_leaves_no_jar(home, tmp_path, monkeypatch):
    copy = tmp_path / "java"
    shutil.copytree(build.JAVA_ROOT, copy)
    source = next(copy.rglob("CheckpointBridgeOperator.java"))
    source.write_text(source.read_text().replace("public void open()", "public void open( BROKEN"))
    monkeypatch.setattr(build, "JAVA_ROOT", copy)

    with pytest.raises(BridgeBuildError, match="javac could not compile the checkpoint bridge"):
        build.bridge_jar()
    assert not list(home.rglob("*.jar"))
    assert not [p for p in (home / "bridge").rglob("*") if p.is_file()], "a failed build leaves nothing behind"


def test_the_jar_a_wheel_ships_is_used_without_compiling_or_writing_anything(home, tmp_path, monkeypatch):
    package = tmp_path / "site-packages" / "checkpoint_bridge"
    package.mkdir(parents=True)
    shipped = package / f"checkpoint-bridge-{build.source_digest()}.jar"
    shipped.write_bytes(b"PK the wheel's jar")
    stale = package / "checkpoint-bridge-0000000000000000.jar"
    stale.write_bytes(b"PK a jar of other sources")
    monkeypatch.setattr(build, "PACKAGE_DIR", package)

    def no_compiler(*args, **kwargs):
        raise AssertionError("a shipped jar of the current sources must not be compiled again")

    monkeypatch.setattr(subprocess, "run", no_compiler)
    assert build.bridge_jar() == shipped
    assert not home.exists(), "nothing is written to the cache: it may be read-only"


@needs_javac
def test_the_same_jdk_gives_the_same_jar_bytes(tmp_path):
    first = compile_jar.compile_jar(tmp_path / "a" / "bridge.jar")
    second = compile_jar.compile_jar(tmp_path / "b" / "bridge.jar")
    assert first.read_bytes() == second.read_bytes()
    with zipfile.ZipFile(first) as jar:
        names = jar.namelist()
    assert names[0] == "META-INF/MANIFEST.MF" and names[1:] == sorted(names[1:])
    assert any(name.endswith("PositionedKafkaRecords.class") for name in names)


def test_compile_classpath_is_the_installed_pyflink():
    dist, python = build.compile_classpath()
    assert dist.name.startswith("flink-dist-") and dist.parent.name == "lib"
    assert python.name.startswith("flink-python-") and python.parent.name == "opt"


def test_no_built_artifacts_inside_the_repository():
    package = REPO / "flink_agents_replay" / "flink" / "checkpoint_bridge"
    assert not [p for p in package.rglob("*") if p.suffix in {".jar", ".class"}]


def test_the_bridge_and_the_python_errors_share_the_no_restart_marker():
    """The bridge recognises failures not to restart by this text in their message: both sides must agree."""
    from flink_agents_replay.core.errors import NO_RESTART_MARKER

    source = "\n".join(path.read_text() for path in build.java_sources())
    assert f'NO_RESTART_MARKER = "{NO_RESTART_MARKER}";' in source
