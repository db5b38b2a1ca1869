"""Jars the development tools use, fetched from Maven Central and checked against a lock file.

``jars.lock`` (package data beside this module) lists each *bundle*'s jars by Maven coordinates with the
SHA-256 of the jar. :func:`fetch_jars` downloads what is missing into ``<home>/jars/<bundle>-<digest>/`` (the
digest covers the bundle's lock lines, so a changed lock fetches afresh) and checks every jar, cached or new,
against its sum: a jar that does not match is refused, never used. Nothing here needs Maven or a JDK; the
download's base URL is ``$FLINK_AGENTS_REPLAY_MAVEN_URL`` (a mirror or repository manager), else Maven Central.
Each jar appears atomically (downloaded beside it, checked, then renamed), so an interrupted fetch leaves
nothing half-written.

Bundles: ``kafka-broker`` (the local broker's class path), ``flink-connectors`` (Flink's Kafka connector, for
the demo and the testing API), ``flink-kubernetes-operator-api`` (the operator's CRDs, for the manifest checks).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from flink_agents_replay.local.errors import LocalServiceError
from flink_agents_replay.local.paths import home_dir

__all__ = ["FLINK_CONNECTORS", "K8S_OPERATOR_API", "KAFKA_BROKER", "MAVEN_URL_ENV", "LockedJar", "bundle_jars",
           "bundles", "fetch_jars", "kafka_connector_jar", "locked_jars", "require_command"]

KAFKA_BROKER = "kafka-broker"
FLINK_CONNECTORS = "flink-connectors"
K8S_OPERATOR_API = "flink-kubernetes-operator-api"
MAVEN_URL_ENV = "FLINK_AGENTS_REPLAY_MAVEN_URL"
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
LOCK_FILE = Path(__file__).resolve().parent / "jars.lock"

_DOWNLOAD_TIMEOUT_S = 120


@dataclass(frozen=True)
class LockedJar:
    """One jar of the lock file: its bundle, Maven coordinates and SHA-256."""

    bundle: str
    group: str
    artifact: str
    version: str
    sha256: str

    @property
    def coordinates(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}"

    @property
    def file_name(self) -> str:
        return f"{self.artifact}-{self.version}.jar"

    def url(self, base: str) -> str:
        return f"{base.rstrip('/')}/{self.group.replace('.', '/')}/{self.artifact}/{self.version}/{self.file_name}"


def require_command(name: str, what: str) -> str:
    """Return the path of executable ``name`` or raise naming ``what`` to install."""
    path = shutil.which(name)
    if path is None:
        raise LocalServiceError(f"'{name}' is not on PATH: install {what} and try again")
    return path


def locked_jars(lock_file: Path | None = None) -> list[LockedJar]:
    """Every jar the lock file (default ``jars.lock`` beside this module) lists, in its order."""
    lock_file = lock_file or LOCK_FILE
    jars = []
    for number, line in enumerate(lock_file.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            bundle, coordinates, sha256 = line.split()
            group, artifact, version = coordinates.split(":")
        except ValueError:
            raise LocalServiceError(f"{lock_file}:{number}: expected 'bundle group:artifact:version sha256'") from None
        jars.append(LockedJar(bundle, group, artifact, version, sha256.lower()))
    return jars


def bundles() -> list[str]:
    """The bundles the lock file names."""
    return sorted({jar.bundle for jar in locked_jars()})


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download(jar: LockedJar, target: Path) -> None:
    """Download ``jar`` to ``target``, atomically and only if its SHA-256 is the lock's."""
    base = os.environ.get(MAVEN_URL_ENV) or MAVEN_CENTRAL
    if not base.startswith(("https://", "http://", "file:")):
        raise LocalServiceError(f"${MAVEN_URL_ENV} must be an http(s):// or file: URL of a Maven repository, "
                                f"got {base!r}")
    url = jar.url(base)
    partial = Path(tempfile.mkstemp(dir=target.parent, prefix=".download-")[1])
    try:
        try:
            with urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT_S) as response, partial.open("wb") as out:
                shutil.copyfileobj(response, out)
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
            raise LocalServiceError(f"could not download {jar.coordinates} from {url}: {exc}; is the repository "
                                    f"reachable? (${MAVEN_URL_ENV} sets another one)") from exc
        actual = _sha256(partial)
        if actual != jar.sha256:
            raise LocalServiceError(f"{url} has SHA-256 {actual}, the lock file says {jar.sha256}: refused (the "
                                    f"repository serves other bytes than Maven Central's)")
        partial.chmod(0o644)  # readable by a Flink that runs as another user
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


def _check(jar: LockedJar, path: Path) -> None:
    actual = _sha256(path)
    if actual != jar.sha256:
        raise LocalServiceError(f"{path} has SHA-256 {actual}, but {jar.coordinates} must be {jar.sha256}: refused. "
                                "The cached jar was changed or is stale; delete it and fetch again "
                                "(flink-agents-replay local jars fetch)")


def fetch_jars(bundle: str) -> Path:
    """The folder holding ``bundle``'s jars, each checked against the lock; missing ones are downloaded first."""
    jars = [jar for jar in locked_jars() if jar.bundle == bundle]
    if not jars:
        raise LocalServiceError(f"no jar bundle {bundle!r} in {LOCK_FILE} (there are: {', '.join(bundles())})")
    digest = hashlib.sha256("".join(f"{j.coordinates} {j.sha256}\n" for j in jars).encode()).hexdigest()[:12]
    folder = home_dir() / "jars" / f"{bundle}-{digest}"
    for jar in jars:
        path = folder / jar.file_name
        if path.is_file():
            _check(jar, path)
        else:
            folder.mkdir(parents=True, exist_ok=True)
            _download(jar, path)
    return folder


def bundle_jars(bundle: str) -> list[Path]:
    """The jars of ``bundle``, each checked against the lock, and nothing else: a class path of exactly these
    (a stray jar put into the cache folder is not on it)."""
    folder = fetch_jars(bundle)
    return [folder / jar.file_name for jar in locked_jars() if jar.bundle == bundle]


def kafka_connector_jar() -> Path:
    """Path of Flink's Kafka SQL connector jar, checked against the lock (fetched if missing)."""
    return next(jar for jar in bundle_jars(FLINK_CONNECTORS) if jar.name.startswith("flink-sql-connector-kafka-"))
