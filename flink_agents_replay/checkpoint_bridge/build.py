"""Build the checkpoint bridge jar from its Java sources, once per source/PyFlink combination.

The jar is compiled with ``javac --release 11`` against the two jars of the installed PyFlink that hold
the classes it extends (``pyflink/lib/flink-dist-*.jar`` and ``pyflink/opt/flink-python-*.jar``); no
Maven, nothing downloaded. It is written to ``<home>/bridge/<digest>/`` outside the repository, where
the digest covers every Java source, the PyFlink version and the compiler flags: a changed source or
an upgraded PyFlink builds afresh, anything else reuses the cached jar. The jar file appears
atomically (compiled in a temporary directory beside it, then renamed), so concurrent builders and
interrupted builds never leave a half-written jar behind.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from flink_agents_replay.errors import FlinkAgentsReplayError
from flink_agents_replay.home import home_dir

__all__ = ["JAR_NAME", "JAVA_RELEASE", "BridgeBuildError", "bridge_jar", "compile_classpath", "java_sources",
           "source_digest"]

JAR_NAME = "flink-agents-replay-checkpoint-bridge.jar"
JAVA_RELEASE = "11"
JAVA_ROOT = Path(__file__).resolve().parent / "java"

_JAVAC_TIMEOUT_S = 300
# Fixed entry timestamps: the same sources give the same jar bytes.
_ZIP_DATE = (2020, 1, 1, 0, 0, 0)


class BridgeBuildError(FlinkAgentsReplayError, RuntimeError):
    """The checkpoint bridge jar could not be built (no JDK, a PyFlink without its jars, javac failed).

    The message says what to install or fix. The bridge's own error, not the local services' one: the product
    does not depend on ``flink_agents_replay.local``.
    """


def java_sources() -> list[Path]:
    """The bridge's Java sources, in a stable order."""
    sources = sorted(JAVA_ROOT.rglob("*.java"))
    if not sources:
        raise BridgeBuildError(f"no Java sources for the checkpoint bridge under {JAVA_ROOT}: reinstall the package")
    return sources


def _pyflink_dir() -> Path:
    import pyflink

    return Path(pyflink.__file__).resolve().parent


def _pyflink_version() -> str:
    from pyflink.version import __version__

    return __version__


def compile_classpath() -> list[Path]:
    """``flink-dist`` and ``flink-python`` of the installed PyFlink: what the bridge compiles against."""
    root = _pyflink_dir()
    found = []
    for folder, pattern in (("lib", "flink-dist-*.jar"), ("opt", "flink-python-*.jar")):
        jars = sorted((root / folder).glob(pattern))
        if not jars:
            raise BridgeBuildError(
                f"PyFlink at {root} has no {folder}/{pattern}: reinstall apache-flink (pip install apache-flink)"
            )
        found.append(jars[-1])
    return found


def source_digest() -> str:
    """Digest of the Java sources, the PyFlink version and the compiler release: names the cache folder."""
    digest = hashlib.sha256()
    digest.update(f"pyflink={_pyflink_version()}\nrelease={JAVA_RELEASE}\n".encode())
    for source in java_sources():
        digest.update(source.relative_to(JAVA_ROOT).as_posix().encode() + b"\0")
        digest.update(source.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _javac() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "javac"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("javac")
    if found is None:
        raise BridgeBuildError(
            "'javac' is not on PATH (nor in $JAVA_HOME/bin): the checkpoint bridge is compiled from source and "
            "needs a JDK 11 or later; install one (Debian: apt-get install openjdk-17-jdk-headless) and try again"
        )
    return found


def _compile(target: Path) -> None:
    """Compile the sources and write the jar to ``target`` atomically."""
    javac = _javac()
    classpath = os.pathsep.join(str(jar) for jar in compile_classpath())
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=target.parent) as work:
        classes = Path(work) / "classes"
        classes.mkdir()
        command = [
            javac, "--release", JAVA_RELEASE, "-encoding", "UTF-8", "-nowarn",
            "-cp", classpath, "-d", str(classes), *(str(s) for s in java_sources()),
        ]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=_JAVAC_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise BridgeBuildError(f"javac did not finish within {_JAVAC_TIMEOUT_S} s") from exc
        if result.returncode != 0:
            raise BridgeBuildError(
                f"javac could not compile the checkpoint bridge (exit {result.returncode}) against "
                f"PyFlink {_pyflink_version()}; javac said:\n{(result.stdout + result.stderr).strip()}"
            )
        partial = Path(work) / JAR_NAME
        with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as jar:
            manifest = zipfile.ZipInfo("META-INF/MANIFEST.MF", date_time=_ZIP_DATE)
            jar.writestr(manifest, "Manifest-Version: 1.0\r\nCreated-By: flink-agents-replay\r\n\r\n")
            for path in sorted(classes.rglob("*.class")):
                entry = zipfile.ZipInfo(path.relative_to(classes).as_posix(), date_time=_ZIP_DATE)
                jar.writestr(entry, path.read_bytes(), compress_type=zipfile.ZIP_DEFLATED)
        os.replace(partial, target)


def bridge_jar() -> Path:
    """Path of the checkpoint bridge jar, compiling it first if this source/PyFlink combination is new."""
    target = home_dir() / "bridge" / source_digest() / JAR_NAME
    if not target.is_file():
        _compile(target)
    return target
