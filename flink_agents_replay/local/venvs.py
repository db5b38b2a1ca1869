"""Servers installed from PyPI into a virtual environment of their own under the cache, on first use.

Chroma's server and Phoenix are heavy installs whose dependencies clash with PyFlink's, so neither goes into the
package's own environment: each gets ``$FLINK_AGENTS_REPLAY_HOME/<name>/venv-<version>``, installed once, checked
complete with ``pip check`` and then marked, under a file lock so that several processes can ask at once.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

from flink_agents_replay.local.errors import LocalServiceError

__all__ = ["install_into_own_venv", "own_environment"]


def install_into_own_venv(venv: Path, requirement: str, command: str) -> Path:
    """The ``command`` of the virtual environment ``venv`` holding ``requirement`` (``name==version``), installed
    on first use and checked complete; later calls return at once. Safe to call from several processes at once.
    An environment whose marker says only the version (written before the check existed) is checked now, and
    installed again if it lacks something."""
    executable = venv / "bin" / command
    marker = venv / ".installed"
    version = requirement.partition("==")[2]
    if _marked_complete(marker, version):
        return executable
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".install-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be installing it right now
        if _marked_complete(marker, version):
            return executable
        if not (marker.is_file() and _complete(venv)):
            _install(venv, requirement)
            if not executable.is_file():
                raise LocalServiceError(f"{requirement} installed no '{command}' command in {venv}")
            if not _complete(venv):
                raise LocalServiceError(f"{requirement} installed into {venv} misses some of its requirements "
                                        f"('pip check' there says which)")
        marker.write_text(f"{version} {_CHECKED}")
    return executable


#: What a marker says once ``pip check`` found the environment complete (0.5.1 on; earlier markers say only the
#: version: such an environment may have been installed while PyFlink's process mode had left a PYTHONPATH).
_CHECKED = "checked"


def _marked_complete(marker: Path, version: str) -> bool:
    try:
        return marker.read_text().split() == [version, _CHECKED]
    except OSError:
        return False


def _install(venv: Path, requirement: str) -> None:
    _run([sys.executable, "-m", "venv", "--clear", str(venv)], f"create the environment {venv}")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _run([*pip, requirement], f"install {requirement} from PyPI into {venv}")


def _complete(venv: Path) -> bool:
    """Whether every requirement of what the environment holds is installed in it (``pip check``)."""
    result = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "check", "--disable-pip-version-check"],
                            capture_output=True, text=True, timeout=300, env=own_environment())
    return result.returncode == 0


def own_environment() -> dict[str, str]:
    """This process's environment without what would let another Python see this one's packages: a
    ``PYTHONPATH`` (PyFlink's process mode run in this process, as its tests and jobs do, leaves the job's in
    ``os.environ``), ``PYTHONHOME``, a ``VIRTUAL_ENV``. Pip in a server's own environment would otherwise take
    this environment's packages as installed there, and the server would need them at run time."""
    return {name: value for name, value in os.environ.items() if name not in _FOREIGN_PYTHON_SETTINGS}


_FOREIGN_PYTHON_SETTINGS = frozenset({"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV"})


def _run(command: list[str], what: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, env=own_environment())
    if result.returncode != 0:
        raise LocalServiceError(f"could not {what} (exit {result.returncode}):\n{result.stdout[-2000:]}"
                                f"{result.stderr[-2000:]}")
