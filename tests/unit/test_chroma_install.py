"""The Chroma server's environment is installed and checked without the caller's PYTHONPATH, and an environment
an earlier version marked installed without checking is checked, and installed again if it lacks something.

PyFlink's process mode, run in the caller's process (its tests, a job started in-process), leaves the job's
PYTHONPATH in ``os.environ``; pip in the Chroma environment then took the caller's packages as installed there
(found when ``./run demo`` after ``./run tests`` could not start Chroma: no ``typing_extensions``). The commands
are recorded here instead of run: installing takes a minute and the network.
"""

from __future__ import annotations

import subprocess

import pytest

from flink_agents_replay.local import chroma_server


class _Commands:
    """Stands in for ``subprocess.run``: records each command and its environment; ``pip check`` answers
    ``complete``; ``pip install`` makes the ``chroma`` command."""

    def __init__(self, complete: bool = True):
        self.complete, self.seen = complete, []

    def __call__(self, command, **options):
        self.seen.append((command, options.get("env")))
        if command[-1].startswith("chromadb=="):
            venv = chroma_server.home_dir() / "chroma" / f"venv-{chroma_server.CHROMA_VERSION}"
            (venv / "bin").mkdir(parents=True, exist_ok=True)
            (venv / "bin" / "chroma").write_text("#!/bin/sh\n")
        passed = not (command[-2:] == ["check", "--disable-pip-version-check"] and not self.complete)
        return subprocess.CompletedProcess(command, 0 if passed else 1, "", "")

    def steps(self) -> list[str]:
        return [" ".join(part for part in command[1:4] if not part.startswith("/")) for command, _ in self.seen]


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("FLINK_AGENTS_REPLAY_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else/site-packages")  # as PyFlink's process mode leaves it
    return tmp_path / "home"


def _marker(home):
    return home / "chroma" / f"venv-{chroma_server.CHROMA_VERSION}" / ".installed"


def test_a_first_install_runs_without_the_callers_pythonpath_and_is_checked(home, monkeypatch):
    commands = _Commands()
    monkeypatch.setattr(chroma_server.subprocess, "run", commands)
    chroma_server.install_chroma()
    assert commands.steps() == ["-m venv --clear", "-m pip install", "-m pip check"]
    assert all(env is not None and "PYTHONPATH" not in env for _, env in commands.seen)
    assert _marker(home).read_text() == f"{chroma_server.CHROMA_VERSION} checked"
    commands.seen.clear()
    chroma_server.install_chroma()
    assert commands.seen == []  # checked once, then taken as it is


def test_an_incomplete_install_is_refused_saying_so(home, monkeypatch):
    monkeypatch.setattr(chroma_server.subprocess, "run", _Commands(complete=False))
    with pytest.raises(chroma_server.LocalServiceError, match="misses some of its requirements"):
        chroma_server.install_chroma()
    assert not _marker(home).exists()


@pytest.mark.parametrize(("complete", "steps"), [
    (True, ["-m pip check"]),
    (False, ["-m pip check", "-m venv --clear", "-m pip install", "-m pip check"]),
])
def test_an_environment_an_earlier_version_marked_is_checked_and_installed_again_if_incomplete(
        home, monkeypatch, complete, steps):
    _marker(home).parent.mkdir(parents=True)
    _marker(home).write_text(chroma_server.CHROMA_VERSION)  # 0.5.0's marker: the version only
    commands = _Commands(complete=complete)
    if not complete:  # complete once installed again
        original = commands.__call__

        def check_fails_once(command, **options):
            result = original(command, **options)
            if command[-1].startswith("chromadb=="):
                commands.complete = True
            return result
        monkeypatch.setattr(chroma_server.subprocess, "run", check_fails_once)
    else:
        monkeypatch.setattr(chroma_server.subprocess, "run", commands)
    chroma_server.install_chroma()
    assert commands.steps() == steps
    assert _marker(home).read_text() == f"{chroma_server.CHROMA_VERSION} checked"
