"""Compile the bridge's Java sources into a jar: shared by the wheel's build hook and editable installs.

Standard library only, and it imports nothing of this package: ``setup.py`` loads this file by its path while
the wheel is built, before the package (or PyFlink's Python code) is importable. It compiles with
``javac --release 11`` against the two jars of the pinned PyFlink that hold the classes the bridge extends,
found through the ``apache-flink-libraries`` distribution's file list (installed with ``apache-flink``, and the
one build requirement of the wheel). The jar is reproducible: entries sorted, fixed timestamps, fixed
compression, so the same JDK gives the same bytes.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

JAVA_RELEASE = "11"
JAVA_ROOT = Path(__file__).resolve().parent / "java"
FLINK_LIBRARIES = "apache-flink-libraries"
#: The wheel carries the jar beside this module, named after :func:`source_digest`.
JAR_PREFIX = "checkpoint-bridge-"

_JAVAC_TIMEOUT_S = 300
_ZIP_DATE = (2020, 1, 1, 0, 0, 0)
_CLASSPATH_JARS = ("lib/flink-dist-", "opt/flink-python-")


class JarBuildError(RuntimeError):
    """The jar could not be built; the message says what to install or fix."""


def java_sources(root: Path = JAVA_ROOT) -> list[Path]:
    """The bridge's Java sources, in a stable order."""
    sources = sorted(root.rglob("*.java"))
    if not sources:
        raise JarBuildError(f"no Java sources for the checkpoint bridge under {root}: reinstall the package")
    return sources


def flink_version() -> str:
    """The installed PyFlink's version (of its jars' distribution)."""
    try:
        return importlib.metadata.version(FLINK_LIBRARIES)
    except importlib.metadata.PackageNotFoundError:
        pass
    try:  # a PyFlink without its distribution's metadata (vendored): its own version module
        from pyflink.version import __version__
    except ImportError:
        raise JarBuildError(f"{FLINK_LIBRARIES} is not installed: install apache-flink (pip install "
                            "apache-flink)") from None
    return __version__


def compile_classpath() -> list[Path]:
    """``flink-dist`` and ``flink-python`` of the installed PyFlink: what the bridge compiles against."""
    files = importlib.metadata.files(FLINK_LIBRARIES) or []
    found = []
    for prefix in _CLASSPATH_JARS:
        jars = sorted(f for f in files if f.suffix == ".jar" and f.as_posix().startswith(f"pyflink/{prefix}"))
        if not jars:
            raise JarBuildError(f"{FLINK_LIBRARIES} has no pyflink/{prefix}*.jar: reinstall apache-flink")
        found.append(Path(jars[-1].locate()).resolve())
    return found


def source_digest(root: Path = JAVA_ROOT, version: str | None = None) -> str:
    """Digest of the Java sources, the PyFlink version and the compiler release: names the jar."""
    digest = hashlib.sha256()
    digest.update(f"pyflink={version or flink_version()}\nrelease={JAVA_RELEASE}\n".encode())
    for source in java_sources(root):
        digest.update(source.relative_to(root).as_posix().encode() + b"\0")
        digest.update(source.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def find_javac() -> str:
    """``$JAVA_HOME/bin/javac``, else ``javac`` on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "javac"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("javac")
    if found is None:
        raise JarBuildError(
            "'javac' is not on PATH (nor in $JAVA_HOME/bin): the checkpoint bridge is compiled from source and "
            "needs a JDK 11 or later; install one (Debian: apt-get install openjdk-17-jdk-headless) and try again"
        )
    return found


def _write_jar(classes: Path, jar_path: Path) -> None:
    with zipfile.ZipFile(jar_path, "w", compression=zipfile.ZIP_DEFLATED) as jar:
        manifest = zipfile.ZipInfo("META-INF/MANIFEST.MF", date_time=_ZIP_DATE)
        jar.writestr(manifest, "Manifest-Version: 1.0\r\nCreated-By: flink-agents-replay\r\n\r\n",
                     compress_type=zipfile.ZIP_DEFLATED)
        for path in sorted(classes.rglob("*.class")):
            entry = zipfile.ZipInfo(path.relative_to(classes).as_posix(), date_time=_ZIP_DATE)
            entry.external_attr = 0o644 << 16
            jar.writestr(entry, path.read_bytes(), compress_type=zipfile.ZIP_DEFLATED)


def compile_jar(target: Path, root: Path = JAVA_ROOT) -> Path:
    """Compile the sources under ``root`` and write the jar to ``target`` atomically; return ``target``."""
    javac = find_javac()
    classpath = os.pathsep.join(str(jar) for jar in compile_classpath())
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=target.parent) as work:
        classes = Path(work) / "classes"
        classes.mkdir()
        command = [javac, "--release", JAVA_RELEASE, "-encoding", "UTF-8", "-nowarn", "-cp", classpath,
                   "-d", str(classes), *(str(s) for s in java_sources(root))]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=_JAVAC_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise JarBuildError(f"javac did not finish within {_JAVAC_TIMEOUT_S} s") from exc
        if result.returncode != 0:
            raise JarBuildError(
                f"javac could not compile the checkpoint bridge (exit {result.returncode}) against "
                f"PyFlink {flink_version()}; javac said:\n{(result.stdout + result.stderr).strip()}"
            )
        partial = Path(work) / target.name
        _write_jar(classes, partial)
        os.replace(partial, target)
    return target


def packaged_jar_name(root: Path = JAVA_ROOT) -> str:
    """File name of the jar a wheel ships beside this module."""
    return f"{JAR_PREFIX}{source_digest(root)}.jar"
