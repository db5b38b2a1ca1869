"""Remake ``flink_agents_replay/local/jars.lock`` from the poms here (one folder, one bundle): a developer's tool.

Maven resolves each pom's runtime class path; each jar's SHA-256 is taken from the file Maven downloaded. Run it
after changing a pom (needs Maven and a JDK; the lock's users need neither)::

    python conf/maven/lock_jars.py
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOCK = HERE.parent.parent / "flink_agents_replay" / "local" / "jars.lock"
HEADER = """\
# The jars the development tools use, fetched from Maven Central (or $FLINK_AGENTS_REPLAY_MAVEN_URL) and each
# checked against its SHA-256 before use: a jar in the cache that does not match is refused.
# Made by conf/maven/lock_jars.py from the poms under conf/maven/ (one pom per bundle): run it after changing a pom.
# bundle, coordinates (group:artifact:version), SHA-256 of the jar
"""
_RESOLVED = re.compile(r"^\s*([^:\s]+):([^:\s]+):jar:([^:\s]+):\w+:(\S+\.jar)")


def resolve(pom: Path) -> list[tuple[str, str]]:
    """(group:artifact:version, SHA-256) of each runtime jar of ``pom``."""
    with tempfile.NamedTemporaryFile(suffix=".txt") as listing:
        subprocess.run(["mvn", "-q", "-B", "-f", str(pom), "dependency:list", "-DincludeScope=runtime",
                        "-DoutputAbsoluteArtifactFilename=true", f"-DoutputFile={listing.name}"], check=True)
        rows = []
        for line in Path(listing.name).read_text().splitlines():
            match = _RESOLVED.match(line)
            if match:
                group, artifact, version, path = match.groups()
                rows.append((f"{group}:{artifact}:{version}", hashlib.sha256(Path(path).read_bytes()).hexdigest()))
        return rows


def main() -> int:
    rows = sorted((pom.parent.name, coordinates, sha256) for pom in HERE.glob("*/pom.xml")
                  for coordinates, sha256 in resolve(pom))
    width = [max(len(row[i]) for row in rows) for i in (0, 1)]
    LOCK.write_text(HEADER + "".join(f"{b:<{width[0]}}  {c:<{width[1]}}  {s}\n" for b, c, s in rows))
    print(f"{LOCK}: {len(rows)} jars")
    return 0


if __name__ == "__main__":
    sys.exit(main())
