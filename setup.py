"""The wheel's build hook: the checkpoint bridge jar is compiled here and shipped in the wheel.

``build_py`` runs as usual, then compiles the bridge's Java sources against the pinned PyFlink's jars (the
backend in ``build_support/`` adds them to the build requirements) into the package beside its sources, named
after their digest (``flink_agents_replay/flink/checkpoint_bridge/compile_jar.py``, loaded by path: the package
itself is not importable while it is being built). Building a wheel therefore needs a JDK 11 or later
(``javac`` on PATH or in ``$JAVA_HOME``); running it does not. Editable installs compile on first use instead.
"""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

COMPILE_JAR = Path(__file__).resolve().parent / "flink_agents_replay" / "flink" / "checkpoint_bridge" / "compile_jar.py"


def _compile_jar_module():
    spec = importlib.util.spec_from_file_location("_flink_agents_replay_compile_jar", COMPILE_JAR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithBridgeJar(build_py):
    """``build_py`` that adds the compiled checkpoint bridge jar to the built package."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        compile_jar = _compile_jar_module()
        package = Path(self.build_lib) / "flink_agents_replay" / "flink" / "checkpoint_bridge"
        for stale in package.glob(f"{compile_jar.JAR_PREFIX}*.jar"):  # an earlier build's, of other sources
            stale.unlink()
        jar = compile_jar.compile_jar(package / compile_jar.packaged_jar_name())
        print(f"compiled the checkpoint bridge: {jar}")


setup(cmdclass={"build_py": BuildPyWithBridgeJar})
