"""Fetch jars from Maven Central with Maven, from the small poms under ``conf/maven/``.

Each *bundle* is one pom (``conf/maven/<bundle>/pom.xml``); its runtime dependencies are copied into
``<home>/jars/<bundle>-<digest of the pom>/``. The digest makes a changed pom fetch afresh, and a
``.complete`` marker makes an interrupted fetch start over instead of leaving half a classpath.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from flink_agents_replay.local.errors import LocalServiceError
from flink_agents_replay.local.paths import conf_dir, home_dir

__all__ = ["KAFKA_BROKER", "FLINK_CONNECTORS", "fetch_jars", "kafka_connector_jar", "require_command"]

KAFKA_BROKER = "kafka-broker"
FLINK_CONNECTORS = "flink-connectors"

_MAVEN_TIMEOUT_S = 900


def require_command(name: str, what: str) -> str:
    """Return the path of executable ``name`` or raise naming ``what`` to install."""
    path = shutil.which(name)
    if path is None:
        raise LocalServiceError(f"'{name}' is not on PATH: install {what} and try again")
    return path


def fetch_jars(bundle: str, *, quiet: bool = True) -> Path:
    """Return the directory holding ``bundle``'s jars, fetching them with Maven if not cached."""
    pom = conf_dir() / "maven" / bundle / "pom.xml"
    if not pom.is_file():
        raise LocalServiceError(f"no pom for jar bundle '{bundle}' at {pom}")
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:12]
    target = home_dir() / "jars" / f"{bundle}-{digest}"
    marker = target / ".complete"
    if marker.is_file():
        return target
    mvn = require_command("mvn", "Apache Maven 3.6 or later (Debian: apt-get install maven)")
    require_command("java", "a Java 17 JDK (Debian: apt-get install openjdk-17-jdk-headless)")
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    command = [
        mvn, "-B", "-f", str(pom), "dependency:copy-dependencies",
        "-DincludeScope=runtime", f"-DoutputDirectory={target}",
    ]
    if quiet:
        command.insert(2, "-q")
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=_MAVEN_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise LocalServiceError(
            f"Maven did not finish fetching '{bundle}' within {_MAVEN_TIMEOUT_S} s: is Maven Central reachable?"
        ) from exc
    if result.returncode != 0 or not any(target.glob("*.jar")):
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise LocalServiceError(
            f"Maven could not fetch the '{bundle}' jars (exit {result.returncode}); check that Maven Central "
            f"is reachable and ~/.m2/settings.xml is sane. Maven said:\n{tail}"
        )
    marker.write_text(digest + "\n")
    return target


def kafka_connector_jar() -> Path:
    """Path of Flink's Kafka SQL connector jar (for jobs that read or write Kafka topics)."""
    jars = sorted(fetch_jars(FLINK_CONNECTORS).glob("flink-sql-connector-kafka-*.jar"))
    if not jars:
        raise LocalServiceError("the flink-connectors bundle holds no flink-sql-connector-kafka jar")
    return jars[-1]
