"""A real Arize Phoenix server (the development trace viewer) on 127.0.0.1, for development and tests.

Phoenix (``arize-phoenix`` from PyPI, its ``phoenix serve`` command) receives OpenTelemetry spans over OTLP and
shows them in a web UI. It is a heavy install (about 860 MB, two minutes) whose dependencies are not this
package's, so like the Chroma server it is installed once into a virtual environment of its own under the cache
(``$FLINK_AGENTS_REPLAY_HOME/phoenix/venv-<version>``), on first use. ``start`` returns once the server answers;
``stop`` ends it by the recorded PID; its data (a SQLite database) stays in the work directory.

What it offers, all on the one HTTP port: the UI at :attr:`PhoenixStatus.url`; the OTLP/HTTP receiver at
``<url>/v1/traces`` (give :attr:`PhoenixStatus.otlp_endpoint` to ``OTEL_EXPORTER_OTLP_ENDPOINT``: the SDK's HTTP
exporter appends ``/v1/traces``); the REST API that :func:`read_spans` reads. Phoenix cannot run without its OTLP
gRPC receiver, which binds every interface (``[::]``): it is put on a free port of its own, recorded with the rest.

Projects: Phoenix files each span under the project named by the OTLP resource attribute
``openinference.project.name`` of the batch that carried it (an ``x-project-name`` HTTP header on the export
request wins over it); a span without either goes to the project ``default``. A project is created by its first
span. Spans are written asynchronously, a moment after the export request was answered: read them back by polling.

A span id is unique in the whole database: a span whose span id is stored already is dropped (the first one
received is kept, whatever its trace id), see :func:`read_spans`.
"""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from flink_agents_replay.local.errors import LocalServiceError
from flink_agents_replay.local.paths import home_dir
from flink_agents_replay.local.processes import (
    RecordedProcess,
    claim_port,
    free_port,
    log_tail,
    pid_alive,
    spawn_service,
    wait_until_ready,
)
from flink_agents_replay.local.venvs import install_into_own_venv, own_environment

__all__ = ["DEFAULT_PROJECT", "PHOENIX_VERSION", "LocalPhoenixServer", "PhoenixStatus", "default_work_dir",
           "install_phoenix", "read_spans", "trace_url"]

#: The server's version. It needs Python 3.11 to 3.14 (this package runs on 3.10 too: there, installing it fails).
PHOENIX_VERSION = "20.26.1"

#: The project of spans whose resource names none (no ``openinference.project.name``).
DEFAULT_PROJECT = "default"


def default_work_dir() -> Path:
    """Work directory (data, log, PID) of the server the CLI manages."""
    return home_dir() / "phoenix" / "server"


def install_phoenix(version: str = PHOENIX_VERSION) -> Path:
    """The ``phoenix`` command of a virtual environment holding ``arize-phoenix==version``, installed on first use
    (about 140 s and 860 MB; later calls return at once) and checked complete. Safe to call from several processes
    at once."""
    return install_into_own_venv(home_dir() / "phoenix" / f"venv-{version}", f"arize-phoenix=={version}", "phoenix")


@dataclass(frozen=True)
class PhoenixStatus:
    """What a work directory says about its server."""

    running: bool
    pid: int | None
    url: str | None
    work_dir: Path
    grpc_port: int | None = None

    @property
    def otlp_endpoint(self) -> str | None:
        """The base endpoint for ``OTEL_EXPORTER_OTLP_ENDPOINT`` (OTLP/HTTP: the exporter adds ``/v1/traces``)."""
        return self.url

    def describe(self) -> str:
        """One line for people."""
        if self.running:
            return (f"running: pid {self.pid}, UI {self.url}, OTLP/HTTP {self.url}/v1/traces, "
                    f"data in {self.work_dir / 'data'}")
        return f"not running (work directory {self.work_dir})"


class LocalPhoenixServer(RecordedProcess):
    """One local Phoenix server whose data, log and state file live in ``work_dir``.

    Args:
        port: HTTP port on 127.0.0.1 (UI, OTLP/HTTP, REST); ``0`` picks a free one.
        work_dir: directory for data, the log and the state file; created if missing.
        start_timeout_s: how long ``start`` waits for the server to answer (installing it comes first).
    """

    def __init__(self, port: int = 6006, work_dir: Path | str | None = None, *, start_timeout_s: float = 90.0):
        self.work_dir = Path(work_dir) if work_dir is not None else default_work_dir()
        self.port = port
        self.start_timeout_s = start_timeout_s

    @property
    def _state_file(self) -> Path:
        return self.work_dir / "phoenix.json"

    @property
    def log_file(self) -> Path:
        """The server's stdout and stderr."""
        return self.work_dir / "phoenix.log"

    @property
    def url(self) -> str | None:
        """The UI (and the REST API's base) of the server running here, or ``None``."""
        return self.status().url

    @property
    def otlp_endpoint(self) -> str | None:
        """What to give ``OTEL_EXPORTER_OTLP_ENDPOINT`` for the server running here, or ``None``."""
        return self.status().otlp_endpoint

    def status(self) -> PhoenixStatus:
        """Read the state file and check that its PID still runs."""
        state = self._read_state()
        if state and pid_alive(state["pid"]):
            return PhoenixStatus(True, state["pid"], state["url"], self.work_dir, state.get("grpc_port"))
        return PhoenixStatus(False, None, None, self.work_dir)

    def start(self) -> PhoenixStatus:
        """Start the server (installing it first if needed), or return the one running here."""
        current = self.status()
        if current.running:
            return current
        command = install_phoenix()
        port = claim_port(self.port)
        grpc_port = free_port(exclude={port})
        for folder in ("data", "tmp"):
            (self.work_dir / folder).mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as out:
            process = spawn_service(
                [str(command), "serve"], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.work_dir, env=self._environment(port, grpc_port),  # outlives the CLI; stopped by PID
            )
        url = f"http://127.0.0.1:{port}"
        self._state_file.write_text(json.dumps({"pid": process.pid, "url": url, "grpc_port": grpc_port}))
        try:
            wait_until_ready(process, lambda: _ready(url), what="the Phoenix server", where=url,
                             timeout_s=self.start_timeout_s, log_tail=self._log_tail, interval_s=0.2)
        except BaseException:
            self.stop()
            raise
        return PhoenixStatus(True, process.pid, url, self.work_dir, grpc_port)

    def _environment(self, port: int, grpc_port: int) -> dict[str, str]:
        """The server's settings, and none of the caller's ``PHOENIX_*`` and ``OTEL_*`` ones (a database URL, a
        collector endpoint meant for an application: this server is the work directory's alone)."""
        inherited = {name: value for name, value in own_environment().items()
                     if not name.startswith(("PHOENIX_", "OTEL_"))}
        return {
            **inherited,
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": str(port),
            "PHOENIX_GRPC_PORT": str(grpc_port),
            "PHOENIX_WORKING_DIR": str(self.work_dir / "data"),  # its SQLite database: phoenix.db
            # No request to the internet of its own: no telemetry pixels (FullStory, Scarf), web fonts, downloads.
            "PHOENIX_TELEMETRY_ENABLED": "false",
            "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
            "TMPDIR": str(self.work_dir / "tmp"),  # its PID files (.arize-phoenix/pids) stay in the work directory
        }

    def _log_tail(self) -> str:
        return log_tail(self.log_file)


def _ready(url: str) -> bool:
    """The server answers and reaches its database (``/readyz``)."""
    with urllib.request.urlopen(f"{url}/readyz", timeout=2) as response:
        return response.status == 200


def read_spans(base_url: str, project: str = DEFAULT_PROJECT, *, page_size: int = 1000,
               timeout_s: float = 10.0) -> list[dict]:
    """Every span Phoenix holds for ``project``, oldest first, through its REST API
    (``GET /v1/projects/{project}/spans``, cursor paging); ``[]`` for a project that has none (yet).

    Each span is a dict: ``name``, ``trace_id``, ``span_id``, ``parent_id`` (``None`` for a root; hex ids as
    OpenTelemetry prints them), ``start_time`` and ``end_time`` (ISO 8601, UTC), ``status`` (``OK``, ``ERROR``,
    ``UNSET``), ``status_message``, ``span_kind`` (OpenInference's, ``UNKNOWN`` if the span names none),
    ``attributes`` (dotted keys as sent, except ``openinference.span.kind``, which is ``span_kind``) and ``events``.

    Spans appear a moment after their export was answered (Phoenix inserts them in batches): poll. A span whose
    span id Phoenix holds already is not stored again (``phoenix/db/insertion/span.py``: ``insert_on_conflict(...,
    unique_by=("span_id",), on_conflict=OnConflict.DO_NOTHING)``): one span per span id, the first received.
    """
    quoted = urllib.parse.quote(project, safe="")
    spans: list[dict] = []
    cursor: str | None = None
    while True:
        query = {"limit": page_size, "sort": "id", "order": "asc", **({"cursor": cursor} if cursor else {})}
        try:
            page = _get_json(f"{base_url}/v1/projects/{quoted}/spans?{urllib.parse.urlencode(query)}", timeout_s)
        except urllib.error.HTTPError as error:
            if error.code == 404 and not spans:  # no span of this project has arrived yet
                return []
            raise
        spans.extend(_plain_span(span) for span in page["data"])
        cursor = page.get("next_cursor")
        if not cursor:
            return spans


def _plain_span(span: dict) -> dict:
    return {
        "name": span["name"],
        "trace_id": span["context"]["trace_id"],
        "span_id": span["context"]["span_id"],
        "parent_id": span.get("parent_id"),
        "start_time": span["start_time"],
        "end_time": span["end_time"],
        "status": span["status_code"],
        "status_message": span.get("status_message", ""),
        "span_kind": span.get("span_kind", "UNKNOWN"),
        "attributes": span.get("attributes", {}),
        "events": span.get("events", []),
    }


def trace_url(base_url: str, project: str, trace_id: str, *, timeout_s: float = 10.0) -> str:
    """The UI page of one trace: ``<base_url>/projects/<project id>/traces/<trace id>``, where the project id is
    Phoenix's own (a GraphQL global id such as ``UHJvamVjdDox``, looked up by name here) and the trace id the
    OpenTelemetry one in hex. A ``LocalServiceError`` if Phoenix has no such project (no span of it arrived)."""
    try:
        found = _get_json(f"{base_url}/v1/projects/{urllib.parse.quote(project, safe='')}", timeout_s)
    except urllib.error.HTTPError as error:
        if error.code == 404:
            raise LocalServiceError(f"Phoenix at {base_url} has no project {project!r} (no span of it arrived)") \
                from error
        raise
    return f"{base_url}/projects/{found['data']['id']}/traces/{trace_id}"


def _get_json(url: str, timeout_s: float) -> dict:
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())
