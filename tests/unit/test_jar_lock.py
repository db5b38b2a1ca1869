"""The development tools' jars: downloaded without Maven or a JDK, each checked against the lock's SHA-256.

A small repository is served over HTTP on 127.0.0.1 (``$FLINK_AGENTS_REPLAY_MAVEN_URL``), with a lock file of
its own, so the test needs no network and can serve wrong bytes on purpose.
"""

from __future__ import annotations

import hashlib
import http.server
import threading
from pathlib import Path

import pytest

from flink_agents_replay.local import jars
from flink_agents_replay.local.errors import LocalServiceError

GOOD = b"PK\x03\x04 a jar's bytes"


@pytest.fixture
def repository(tmp_path, monkeypatch):
    """A Maven layout served on 127.0.0.1 holding ``org.example:thing:1.0``; a lock naming it; PATH empty."""
    root = tmp_path / "repo"
    jar = root / "org" / "example" / "thing" / "1.0" / "thing-1.0.jar"
    jar.parent.mkdir(parents=True)
    jar.write_bytes(GOOD)
    lock = tmp_path / "jars.lock"
    lock.write_text(f"# a comment\nthings  org.example:thing:1.0  {hashlib.sha256(GOOD).hexdigest()}\n")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no mvn, no java, no javac
    monkeypatch.setenv(jars.MAVEN_URL_ENV, f"http://127.0.0.1:{server.server_address[1]}/")
    monkeypatch.setenv("FLINK_AGENTS_REPLAY_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(jars, "LOCK_FILE", lock)
    yield jar
    server.shutdown()
    server.server_close()


def test_a_bundle_is_downloaded_without_maven_and_reused(repository):
    folder = jars.fetch_jars("things")

    assert (folder / "thing-1.0.jar").read_bytes() == GOOD
    assert [p.name for p in folder.iterdir()] == ["thing-1.0.jar"], "no partial downloads left behind"
    assert (folder / "thing-1.0.jar").stat().st_mode & 0o777 == 0o644
    repository.unlink()  # the cached jar is used: nothing is downloaded again
    assert jars.fetch_jars("things") == folder


def test_a_tampered_jar_in_the_cache_is_refused_by_its_sha256(repository):
    cached = jars.fetch_jars("things") / "thing-1.0.jar"
    cached.write_bytes(GOOD + b" and a backdoor")

    with pytest.raises(LocalServiceError, match=r"thing-1\.0\.jar has SHA-256 [0-9a-f]{64}, but "
                                                 r"org\.example:thing:1\.0 must be [0-9a-f]{64}: refused"):
        jars.fetch_jars("things")


def test_a_repository_serving_other_bytes_is_refused_and_nothing_is_cached(repository):
    repository.write_bytes(b"PK\x03\x04 another jar")

    with pytest.raises(LocalServiceError, match=r"thing-1\.0\.jar has SHA-256 .* the lock file says .*: refused"):
        jars.fetch_jars("things")
    assert not list(Path(jars.home_dir()).rglob("*.jar")), "a jar that failed its check must not be kept"


def test_an_unknown_bundle_is_named_with_the_ones_there_are(repository):
    with pytest.raises(LocalServiceError, match=r"no jar bundle 'nope' in .*jars\.lock \(there are: things\)"):
        jars.fetch_jars("nope")


def test_the_lock_names_every_bundle_the_tools_use_with_a_sha256_each():
    locked = jars.locked_jars()
    assert {jars.KAFKA_BROKER, jars.FLINK_CONNECTORS, jars.K8S_OPERATOR_API} <= {jar.bundle for jar in locked}
    assert all(len(jar.sha256) == 64 and int(jar.sha256, 16) >= 0 for jar in locked)
    coordinates = [(jar.bundle, jar.coordinates) for jar in locked]
    assert len(coordinates) == len(set(coordinates))


def test_a_class_path_holds_exactly_the_locked_jars_not_a_stray_one_in_the_folder(repository):
    folder = jars.fetch_jars("things")
    (folder / "aaa-unlisted-1.0.jar").write_bytes(b"PK someone else's classes")

    assert jars.bundle_jars("things") == [folder / "thing-1.0.jar"]


@pytest.mark.parametrize("url", ["not a url", "ftp://mirror.example/maven2", "127.0.0.1:8000/maven2"])
def test_a_malformed_mirror_url_is_named_and_leaves_nothing_behind(repository, monkeypatch, url):
    monkeypatch.setenv(jars.MAVEN_URL_ENV, url)

    with pytest.raises(LocalServiceError, match=r"\$FLINK_AGENTS_REPLAY_MAVEN_URL must be an http\(s\):// or file"):
        jars.fetch_jars("things")
    assert not [p for p in Path(jars.home_dir()).rglob("*") if p.is_file()]
