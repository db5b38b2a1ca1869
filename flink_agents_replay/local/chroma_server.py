"""A real Chroma server (the vector store of long-term memory) on 127.0.0.1, for development, tests and the demo.

The server (``chromadb`` from PyPI, its ``chroma run`` command) is a heavy install: a Rust server with many
Python dependencies, some of which clash with PyFlink's. So it is installed once into a virtual environment
of its own under the cache (``$FLINK_AGENTS_REPLAY_HOME/chroma/venv-<version>``), on first use, and this
package itself only needs the light HTTP client (``chromadb-client``). ``start`` returns once the server
answers its heartbeat; ``stop`` ends it by the recorded PID; its data stays in the work directory.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from flink_agents_replay.local.errors import LocalServiceError  # noqa: F401 - what install_chroma raises
from flink_agents_replay.local.paths import home_dir
from flink_agents_replay.local.processes import (
    RecordedProcess,
    claim_port,
    log_tail,
    pid_alive,
    spawn_service,
    wait_until_ready,
)
from flink_agents_replay.local.venvs import install_into_own_venv, own_environment

__all__ = ["CHROMA_VERSION", "ChromaStatus", "LocalChromaServer", "default_work_dir", "install_chroma",
           "own_environment"]

#: The server's version: the client in ``pyproject.toml`` is pinned to the same one.
CHROMA_VERSION = "1.5.9"


def default_work_dir() -> Path:
    """Work directory (data, log, PID) of the server the CLI manages."""
    return home_dir() / "chroma" / "server"


def install_chroma(version: str = CHROMA_VERSION) -> Path:
    """The ``chroma`` command of a virtual environment holding ``chromadb==version``, installed on first use
    (about 35 s and 500 MB; later calls return at once) and checked complete. Safe to call from several processes
    at once. An environment installed by an earlier version without that check is checked now, and installed
    again if it lacks something."""
    return install_into_own_venv(home_dir() / "chroma" / f"venv-{version}", f"chromadb=={version}", "chroma")


@dataclass(frozen=True)
class ChromaStatus:
    """What a work directory says about its server."""

    running: bool
    pid: int | None
    url: str | None
    work_dir: Path

    def describe(self) -> str:
        """One line for people."""
        if self.running:
            return f"running: pid {self.pid}, {self.url}, data in {self.work_dir / 'data'}"
        return f"not running (work directory {self.work_dir})"


class LocalChromaServer(RecordedProcess):
    """One local Chroma server whose data, log and state file live in ``work_dir``.

    Args:
        work_dir: directory for data, the log and the state file; created if missing.
        port: port on 127.0.0.1; ``0`` picks a free one.
        start_timeout_s: how long ``start`` waits for the server to answer (installing it comes first).
    """

    def __init__(self, work_dir: Path | str | None = None, *, port: int = 8100, start_timeout_s: float = 60.0):
        self.work_dir = Path(work_dir) if work_dir is not None else default_work_dir()
        self.port = port
        self.start_timeout_s = start_timeout_s

    @property
    def _state_file(self) -> Path:
        return self.work_dir / "chroma.json"

    @property
    def log_file(self) -> Path:
        """The server's stdout and stderr."""
        return self.work_dir / "chroma.log"

    def status(self) -> ChromaStatus:
        """Read the state file and check that its PID still runs."""
        state = self._read_state()
        if state and pid_alive(state["pid"]):
            return ChromaStatus(True, state["pid"], state["url"], self.work_dir)
        return ChromaStatus(False, None, None, self.work_dir)

    def start(self) -> ChromaStatus:
        """Start the server (installing it first if needed), or return the one running here."""
        current = self.status()
        if current.running:
            return current
        command = install_chroma()
        port = claim_port(self.port)
        (self.work_dir / "data").mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as out:
            process = spawn_service(
                [str(command), "run", "--path", str(self.work_dir / "data"), "--host", "127.0.0.1",
                 "--port", str(port)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.work_dir,
                env=own_environment(),  # outlives the CLI; stopped by PID
            )
        url = f"http://127.0.0.1:{port}"
        self._state_file.write_text(json.dumps({"pid": process.pid, "url": url}))
        try:
            wait_until_ready(process, lambda: _heartbeat(url), what="the Chroma server", where=url,
                             timeout_s=self.start_timeout_s, log_tail=self._log_tail, interval_s=0.2)
        except BaseException:
            self.stop()
            raise
        return ChromaStatus(True, process.pid, url, self.work_dir)

    def _log_tail(self) -> str:
        return log_tail(self.log_file)


def _heartbeat(url: str) -> bool:
    with urllib.request.urlopen(f"{url}/api/v2/heartbeat", timeout=2) as response:
        return response.status == 200

