"""Where the checkpoint bridge jar comes from: the wheel, or (editable installs) a compile on first use.

A wheel carries the jar, compiled when the wheel was built (``setup.py``'s build hook) and named after the
digest of its Java sources, the PyFlink version and the compiler release: nothing is compiled or written at
run time, so a JRE and a read-only file system do. Where no jar of the current digest ships (an editable
install, or changed sources), :func:`bridge_jar` compiles one with ``javac`` into
``<home>/bridge/<digest>/`` outside the repository, once; a JDK is then needed on first use. The jar file
appears atomically, so concurrent builders and interrupted builds never leave a half-written jar behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from flink_agents_replay.core.errors import FlinkAgentsReplayError
from flink_agents_replay.core.home import home_dir
from flink_agents_replay.flink.checkpoint_bridge import compile_jar
from flink_agents_replay.flink.checkpoint_bridge.compile_jar import JAVA_RELEASE, JarBuildError

__all__ = ["JAR_NAME", "JAVA_RELEASE", "BridgeBuildError", "bridge_jar", "compile_classpath", "java_sources",
           "source_digest"]

JAR_NAME = "flink-agents-replay-checkpoint-bridge.jar"
JAVA_ROOT = compile_jar.JAVA_ROOT
PACKAGE_DIR = Path(__file__).resolve().parent


class BridgeBuildError(FlinkAgentsReplayError, RuntimeError):
    """The checkpoint bridge jar could not be built (no JDK, a PyFlink without its jars, javac failed).

    The message says what to install or fix. The bridge's own error, not the local services' one: the product
    does not depend on ``flink_agents_replay.local``.
    """


@contextmanager
def _as_bridge_error() -> Iterator[None]:
    """The compile module's errors (it imports nothing of the package) as this package's own."""
    try:
        yield
    except JarBuildError as exc:
        raise BridgeBuildError(str(exc)) from None


def _pyflink_version() -> str:
    with _as_bridge_error():
        return compile_jar.flink_version()


def java_sources() -> list[Path]:
    """The bridge's Java sources, in a stable order."""
    with _as_bridge_error():
        return compile_jar.java_sources(JAVA_ROOT)


def compile_classpath() -> list[Path]:
    """``flink-dist`` and ``flink-python`` of the installed PyFlink: what the bridge compiles against."""
    with _as_bridge_error():
        return compile_jar.compile_classpath()


def source_digest() -> str:
    """Digest of the Java sources, the PyFlink version and the compiler release: names the jar."""
    with _as_bridge_error():
        return compile_jar.source_digest(JAVA_ROOT, _pyflink_version())


def bridge_jar() -> Path:
    """Path of the checkpoint bridge jar: the wheel's, else compiled into the cache on first use."""
    digest = source_digest()
    shipped = PACKAGE_DIR / f"{compile_jar.JAR_PREFIX}{digest}.jar"
    if shipped.is_file():
        return shipped
    target = home_dir() / "bridge" / digest / JAR_NAME
    if not target.is_file():
        with _as_bridge_error():
            compile_jar.compile_jar(target, JAVA_ROOT)
    return target
