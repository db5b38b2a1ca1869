"""A local standalone Flink *session* cluster, run from the installed pyflink package's ``bin/`` scripts.

PyFlink ships Flink's ``bin/`` (``jobmanager.sh``, ``taskmanager.sh``, ``stop-cluster.sh``, ``flink``) and
``lib/`` inside the package (docs/design.md §12). :class:`LocalFlinkCluster` runs them with ``FLINK_CONF_DIR``
pointing at a configuration generated from the package's ``local/conf/flink/`` into a work directory outside the package
(default ``$FLINK_AGENTS_REPLAY_HOME/flink``), which also holds the logs, the PID files, the temporary
files and the checkpoint and savepoint directories::

    <work dir>/conf/          config.yaml, log4j properties, workers (FLINK_CONF_DIR)
    <work dir>/lib/           links to pyflink/lib/*.jar and pyflink/opt/flink-python-*.jar (FLINK_LIB_DIR)
    <work dir>/log/ pid/ tmp/ checkpoints/ savepoints/
    <work dir>/cluster.json   ports and PIDs of the processes this object started

The thread-mode fixes of docs/design.md §12 are built in: ``flink-python`` is in the cluster's own lib dir and
``pemja.`` is loaded parent-first, so several thread-mode jobs can run one after another on a
TaskManager. Every TaskManager gets a resource id of its own (``tm-1``, ``tm-2`` ...) that the REST API
shows, so a test can find the PID of the TaskManager running a job's tasks and kill it. Flink does not
restart a killed TaskManager of a standalone cluster: :meth:`LocalFlinkCluster.start_taskmanager` does.

``start-cluster.sh`` is not used to start: it cannot give each TaskManager its own resource id. It is
``jobmanager.sh start`` plus one ``taskmanager.sh start`` per line of ``conf/workers``, which is what
:meth:`LocalFlinkCluster.start` runs (all at once). :meth:`LocalFlinkCluster.stop` signals the recorded
PIDs as ``stop-cluster.sh`` would, all at once (``use_scripts=True`` runs ``stop-cluster.sh`` first).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal as signals
import string
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flink_agents_replay.flink.env import fresh_process_environment
from flink_agents_replay.local.errors import LocalServiceError
from flink_agents_replay.local.jars import require_command
from flink_agents_replay.local.paths import conf_dir, home_dir
from flink_agents_replay.local.processes import (
    claim_port,
    local_jvm_options,
    pid_alive,
    read_state_file,
    stop_process,
)

__all__ = [
    "SLOTS_PER_TASKMANAGER",
    "ClusterStatus",
    "LocalFlinkCluster",
    "TaskManagerProcess",
    "default_work_dir",
    "pyflink_home",
]

SLOTS_PER_TASKMANAGER = 4
#: FLINK_IDENT_STRING: part of the daemons' PID and log file names (instead of $USER, which may be unset).
_IDENT = "far"
_JOBMANAGER_PID_FILE = f"flink-{_IDENT}-standalonesession.pid"
_TASKMANAGER_PID_FILE = f"flink-{_IDENT}-taskexecutor.pid"
_LOG4J_FILES = ("log4j.properties", "log4j-cli.properties")
_JAVA_HINT = "a Java 17 runtime (Debian: apt-get install openjdk-17-jre-headless)"
_JOB_ID = re.compile(r"JobID\s+([0-9a-f]{32})")
#: Job states a job does not leave (a standalone session cluster without HA).
_ENDED = frozenset({"CANCELED", "FINISHED", "FAILED"})


def default_work_dir() -> Path:
    """Work directory of the cluster the CLI manages."""
    return home_dir() / "flink"


def pyflink_home() -> Path:
    """The installed pyflink package: Flink's ``bin/``, ``lib/`` and ``opt/`` live in it."""
    import pyflink

    return Path(pyflink.__file__).resolve().parent


@dataclass(frozen=True)
class TaskManagerProcess:
    """A TaskManager this cluster started: its resource id (as the REST API shows it) and its PID."""

    resource_id: str
    pid: int


@dataclass(frozen=True)
class ClusterStatus:
    """What a work directory says about its cluster, and what its REST API reports if it answers."""

    running: bool
    jobmanager_pid: int | None
    taskmanager_pids: dict[str, int]
    rest_url: str | None
    registered_taskmanagers: int | None
    slots_total: int | None
    work_dir: Path

    def describe(self) -> str:
        """One line for people."""
        if not self.running:
            return f"not running (work directory {self.work_dir})"
        processes = ", ".join(f"{rid} pid {pid}" for rid, pid in sorted(self.taskmanager_pids.items())) or "none"
        registered = ("REST API not answering" if self.registered_taskmanagers is None else
                      f"{self.registered_taskmanagers} TaskManager(s) registered, {self.slots_total} slots")
        return (f"running: JobManager pid {self.jobmanager_pid}, TaskManagers: {processes}; {registered}; "
                f"web UI and REST API {self.rest_url}; work directory {self.work_dir}")


def _replace_setting(config_text: str, name: str, value: str) -> str:
    """``config_text`` (the template's flat YAML) with the top-level setting ``name`` set to ``value``."""
    line = re.compile(rf"^{re.escape(name)}:.*$", re.MULTILINE)
    if not line.search(config_text):
        raise LocalServiceError(f"the Flink configuration template has no {name} setting to replace")
    return line.sub(f"{name}: {value}", config_text, count=1)


class LocalFlinkCluster:
    """One local standalone Flink session cluster whose state (config, logs, PIDs, checkpoints) lives in ``work_dir``.

    Args:
        work_dir: directory for config, logs, PIDs, checkpoints and savepoints; created if missing.
        rest_port: REST API and web UI port; ``0`` picks a free one.
        rpc_port: JobManager RPC port; ``0`` picks a free one.
        taskmanagers: TaskManagers ``start`` launches (each with 4 slots).
        start_timeout_s: how long ``start`` waits for the TaskManagers to register.
        heartbeat_timeout_ms: when a silent (paused) TaskManager is declared lost; the template's 30 s if
            ``None``. A test that pauses one shortens it rather than pausing for half a minute.
    """

    def __init__(self, work_dir: Path | str | None = None, *, rest_port: int = 0, rpc_port: int = 0,
                 taskmanagers: int = 1, start_timeout_s: float = 120.0, heartbeat_timeout_ms: int | None = None):
        if taskmanagers < 1:
            raise ValueError(f"taskmanagers must be at least 1, got {taskmanagers}")
        self.work_dir = Path(work_dir).resolve() if work_dir is not None else default_work_dir()
        self.rest_port = rest_port
        self.rpc_port = rpc_port
        self.taskmanagers = taskmanagers
        self.start_timeout_s = start_timeout_s
        self.heartbeat_timeout_ms = heartbeat_timeout_ms

    # -- paths -------------------------------------------------------------------------------------
    @property
    def conf_dir(self) -> Path:
        """The generated configuration (``FLINK_CONF_DIR``)."""
        return self.work_dir / "conf"

    @property
    def lib_dir(self) -> Path:
        """The cluster's class path (``FLINK_LIB_DIR``): links to pyflink's lib jars plus flink-python."""
        return self.work_dir / "lib"

    @property
    def log_dir(self) -> Path:
        """Daemon and client logs (``env.log.dir``)."""
        return self.work_dir / "log"

    @property
    def pid_dir(self) -> Path:
        """The daemons' PID files (``env.pid.dir``)."""
        return self.work_dir / "pid"

    @property
    def checkpoints_dir(self) -> Path:
        """``execution.checkpointing.dir``."""
        return self.work_dir / "checkpoints"

    @property
    def savepoints_dir(self) -> Path:
        """``state.savepoints.dir``."""
        return self.work_dir / "savepoints"

    @property
    def _state_file(self) -> Path:
        return self.work_dir / "cluster.json"

    @property
    def rest_url(self) -> str:
        """``http://127.0.0.1:<port>`` of the running cluster (or of the configured port before start)."""
        state = self._read_state()
        port = state["rest_port"] if state else self.rest_port
        if not port:
            raise LocalServiceError(f"no Flink cluster runs in {self.work_dir} (a free REST port is chosen at start)")
        return f"http://127.0.0.1:{port}"

    def environment(self) -> dict[str, str]:
        """Environment for Flink's scripts: this process's, with the cluster's conf, lib, log and PID dirs."""
        env = fresh_process_environment()
        env.update({
            "FLINK_HOME": str(pyflink_home()),
            "FLINK_CONF_DIR": str(self.conf_dir),
            "FLINK_LIB_DIR": str(self.lib_dir),
            "FLINK_LOG_DIR": str(self.log_dir),
            "FLINK_PID_DIR": str(self.pid_dir),
            "FLINK_IDENT_STRING": _IDENT,
        })
        return env

    # -- lifecycle ---------------------------------------------------------------------------------
    def status(self) -> ClusterStatus:
        """Read the state file, check that its PIDs still run, and ask the REST API if the JobManager runs."""
        state = self._read_state()
        if not state or not state["jobmanager_pid"] or not pid_alive(state["jobmanager_pid"]):
            return ClusterStatus(False, None, {}, None, None, None, self.work_dir)
        live = {rid: pid for rid, pid in state["taskmanagers"].items() if pid_alive(pid)}
        rest_url = f"http://127.0.0.1:{state['rest_port']}"
        registered = slots = None
        try:
            overview = self._get(rest_url, "/overview", timeout_s=3)
            registered, slots = overview["taskmanagers"], overview["slots-total"]
        except (OSError, ValueError, KeyError):
            pass
        return ClusterStatus(True, state["jobmanager_pid"], live, rest_url, registered, slots, self.work_dir)

    def start(self) -> ClusterStatus:
        """Start the JobManager and the TaskManagers (or return the cluster already running here).

        Returns once the REST API reports every TaskManager registered with its slots; raises
        :class:`LocalServiceError` with the end of the logs if that does not happen in time.
        """
        current = self.status()
        if current.running:
            return current
        self._clean_up_leftovers()
        self._require_java()
        rest_port = self._port(self.rest_port, "REST", "--rest-port", exclude=set())
        rpc_port = self._port(self.rpc_port, "JobManager RPC", "rpc_port=", exclude={rest_port})
        self._write_configuration(rest_port, rpc_port)
        self._link_lib_dir()
        for directory in (self.log_dir, self.pid_dir, self.work_dir / "tmp" / "web", self.checkpoints_dir,
                          self.savepoints_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self._write_state({"rest_port": rest_port, "rpc_port": rpc_port, "jobmanager_pid": None,
                           "taskmanagers": {}, "next_taskmanager": 1})
        try:
            # The scripts spend most of their time in short JVMs that read the configuration: run them at
            # once (flink-daemon.sh serialises the PID file writes); TaskManagers retry until the JobManager is up.
            jobmanager = self._spawn_script("jobmanager.sh", "start")
            taskmanagers = self._launch_taskmanagers(self.taskmanagers, also=[jobmanager])
            state = self._read_state()
            state["jobmanager_pid"] = self._last_pid(_JOBMANAGER_PID_FILE)
            if state["jobmanager_pid"] is None:
                raise LocalServiceError(f"jobmanager.sh start recorded no PID; the logs end with:\n{self._log_tail()}")
            self._write_state(state)
            self._wait_for_taskmanagers({tm.resource_id for tm in taskmanagers}, self.start_timeout_s)
            self._check_identity()
        except BaseException:
            self.stop()
            raise
        return self.status()

    def stop(self, timeout_s: float = 30.0, *, use_scripts: bool = False) -> bool:
        """Stop the cluster recorded here; return whether any of its processes was running.

        Every process this work directory recorded (the state file and Flink's PID files) gets SIGTERM at
        once, and SIGKILL if it still runs after ``timeout_s``: what ``stop-cluster.sh`` does daemon by
        daemon (``kill``, ``kill -9`` after 10 s), without the two configuration-parsing JVMs it starts per
        daemon (a 2-TaskManager cluster stops in ~3 s instead of 10-30 s). With ``use_scripts``,
        ``stop-cluster.sh`` runs first. Nothing is left running either way, also after a failed start or
        a killed TaskManager.
        """
        live = self._live_recorded_pids()
        if live and use_scripts and (self.conf_dir / "config.yaml").is_file():
            # stop-cluster.sh runs `taskmanager.sh stop` once per line of conf/workers, each ending the last
            # PID in the PID file: one line per TaskManager ever started here, killed ones included.
            started = len(self._pid_lines(_TASKMANAGER_PID_FILE))
            (self.conf_dir / "workers").write_text("localhost\n" * max(started, 1))
            try:
                self._script("stop-cluster.sh", timeout_s=60 + 15 * started, check=False)
            except LocalServiceError:
                pass  # the PIDs below are ended either way
        _terminate_all([pid for pid in live if pid_alive(pid)], timeout_s)
        for name in (_JOBMANAGER_PID_FILE, _TASKMANAGER_PID_FILE):
            (self.pid_dir / name).unlink(missing_ok=True)
        self._state_file.unlink(missing_ok=True)
        return bool(live)

    def start_taskmanager(self, *, wait: bool = True, timeout_s: float = 60.0) -> TaskManagerProcess:
        """Start one more TaskManager (``taskmanager.sh start``), e.g. to replace a killed one.

        With ``wait``, returns once the REST API lists it.
        """
        if not self.status().running:
            raise LocalServiceError(f"no Flink cluster runs in {self.work_dir}: start it first")
        [taskmanager] = self._launch_taskmanagers(1)
        if wait:
            self._wait_for_taskmanagers({taskmanager.resource_id}, timeout_s)
        return taskmanager

    def kill_taskmanager(self, signal: int = signals.SIGKILL, *, resource_id: str | None = None,
                         timeout_s: float = 30.0) -> int:
        """Send ``signal`` to a TaskManager (by default the one started last) and wait until it is gone.

        Returns the PID killed. Flink does not replace it: use :meth:`start_taskmanager` for that.
        """
        live = self.taskmanager_processes()
        if not live:
            raise LocalServiceError(f"no TaskManager of the cluster in {self.work_dir} is running")
        if resource_id is None:
            resource_id = list(live)[-1]
        if resource_id not in live:
            raise LocalServiceError(f"TaskManager {resource_id!r} is not running here; running: {sorted(live)}")
        pid = live[resource_id]
        _send(pid, signal)
        deadline = time.monotonic() + timeout_s
        while pid_alive(pid):
            if time.monotonic() > deadline:
                raise LocalServiceError(f"TaskManager {resource_id} (pid {pid}) still runs {timeout_s:.0f} s after "
                                        f"signal {signals.Signals(signal).name}")
            time.sleep(0.05)
        return pid

    def taskmanager_processes(self) -> dict[str, int]:
        """Live TaskManagers started here: resource id -> PID, in start order."""
        state = self._read_state() or {"taskmanagers": {}}
        return {rid: pid for rid, pid in state["taskmanagers"].items() if self._runs_here(pid)}

    # -- using the cluster -------------------------------------------------------------------------
    def flink_command(self, *args: str, timeout_s: float | None = 300.0, check: bool = False
                      ) -> subprocess.CompletedProcess[str]:
        """Run ``bin/flink *args`` against this cluster (its FLINK_CONF_DIR and lib dir); output as text.

        Runs in the caller's working directory, so relative paths (``-py job.py``) mean what they say.
        """
        command = [str(pyflink_home() / "bin" / "flink"), *args]
        try:
            result = subprocess.run(command, env=self.environment(), capture_output=True, text=True,
                                    timeout=timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise LocalServiceError(f"`flink {' '.join(args)}` did not finish within {timeout_s:.0f} s") from exc
        if check and result.returncode != 0:
            raise LocalServiceError(f"`flink {' '.join(args)}` failed (exit {result.returncode}):\n"
                                    f"{_explain_client_failure(result.stdout + result.stderr)}\n"
                                    f"(client log: {self.log_dir})")
        return result

    def submit_python_job(self, script: Path | str, *job_args: str, detached: bool = True,
                          timeout_s: float = 300.0) -> str:
        """``flink run [-d] -py script job_args...``; return the job id Flink printed."""
        return self._submit(["-py", str(Path(script).resolve())], job_args, detached, timeout_s)

    def submit_python_module(self, module: str, *job_args: str, jar: Path | str | None = None,
                             detached: bool = True, timeout_s: float = 300.0) -> str:
        """``flink run [-d] [--jarfile jar] -pym module job_args...``: a job of an installed package; the job id.
        (``flink run`` takes one ``--jarfile``.)"""
        jar_option = ["--jarfile", str(Path(jar).resolve())] if jar is not None else []
        return self._submit([*jar_option, "-pym", module], job_args, detached, timeout_s)

    def _submit(self, program: list[str], job_args: Sequence[str], detached: bool, timeout_s: float) -> str:
        result = self.flink_command("run", *(["-d"] if detached else []), *program, *job_args,
                                    timeout_s=timeout_s, check=True)
        match = _JOB_ID.search(result.stdout + result.stderr)
        if match is None:
            raise LocalServiceError(f"`flink run` printed no job id:\n{_tail(result.stdout + result.stderr, 30)}")
        return match.group(1)

    def rest_get(self, path: str, timeout_s: float = 5.0) -> Any:
        """GET ``path`` (e.g. ``/overview``, ``/jobs/<id>/checkpoints``) from the REST API; parsed JSON."""
        try:
            return self._get(self.rest_url, path, timeout_s)
        except (OSError, ValueError) as exc:
            raise LocalServiceError(f"the Flink REST API at {self.rest_url} did not answer GET {path}: {exc}") from exc

    def cancel_job(self, job_id: str, timeout_s: float = 60.0) -> None:
        """Cancel ``job_id`` over the REST API and wait until it is ``CANCELED`` (or ended otherwise).

        Like ``flink cancel``, without starting a client JVM (seconds each on a busy machine)."""
        self._rest_send("PATCH", f"/jobs/{job_id}?mode=cancel", None)
        self._await_job_end(job_id, timeout_s, "cancelled")

    def stop_with_savepoint(self, job_id: str, target_dir: Path | str, timeout_s: float = 300.0) -> str:
        """Stop ``job_id`` with a savepoint into ``target_dir`` (``flink stop --savepointPath``, over REST);
        wait until the job ended; the savepoint's path."""
        body = {"targetDirectory": str(Path(target_dir).resolve()), "drain": False}
        trigger = self._rest_send("POST", f"/jobs/{job_id}/stop", body)["request-id"]
        location = self._await_savepoint(job_id, trigger, timeout_s)
        self._await_job_end(job_id, timeout_s, "stopped")
        return location

    def trigger_savepoint(self, job_id: str, target_dir: Path | str, timeout_s: float = 300.0) -> str:
        """Take a savepoint of running ``job_id`` into ``target_dir`` (``flink savepoint``, over REST); its path."""
        body = {"target-directory": str(Path(target_dir).resolve()), "cancel-job": False}
        trigger = self._rest_send("POST", f"/jobs/{job_id}/savepoints", body)["request-id"]
        return self._await_savepoint(job_id, trigger, timeout_s)

    def _await_savepoint(self, job_id: str, trigger: str, timeout_s: float) -> str:
        return self._await_job(job_id, lambda: self._savepoint_location(job_id, trigger), timeout_s, 0.2,
                               f"the savepoint of job {job_id} did not complete")

    def _savepoint_location(self, job_id: str, trigger: str) -> str | None:
        """The savepoint's path once it completed; ``None`` while under way; ``LocalServiceError`` if it failed."""
        answer = self.rest_get(f"/jobs/{job_id}/savepoints/{trigger}")
        if answer["status"]["id"] != "COMPLETED":
            return None
        operation = answer.get("operation") or {}
        if "location" in operation:
            return operation["location"]
        cause = (operation.get("failure-cause") or {}).get("stack-trace", str(operation))
        raise LocalServiceError(f"the savepoint of job {job_id} failed: {_first_and_root_cause(cause)}")

    def _await_job_end(self, job_id: str, timeout_s: float, what: str) -> None:
        self._await_job(job_id, lambda: self.job_status(job_id) in _ENDED, timeout_s, 0.1,
                        f"job {job_id} was not {what}")

    def _await_job(self, job_id: str, found: Callable[[], Any], timeout_s: float, interval_s: float,
                   what: str) -> Any:
        """``found()`` once it is truthy; ``LocalServiceError`` saying ``what`` with the job's diagnostics after
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not (result := found()):
            if time.monotonic() > deadline:
                raise LocalServiceError(f"{what} within {timeout_s:.0f} s; {self.job_diagnostics(job_id)}")
            time.sleep(interval_s)
        return result

    def _rest_send(self, method: str, path: str, body: dict | None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.rest_url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - loopback
                text = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise LocalServiceError(f"the Flink REST API refused {method} {path}: HTTP {exc.code} {detail}") from exc
        except OSError as exc:
            raise LocalServiceError(f"the Flink REST API at {self.rest_url} did not answer {method} {path}: "
                                    f"{exc}") from exc
        return json.loads(text) if text.strip() else {}

    def job_status(self, job_id: str) -> str:
        """The job's status (``RUNNING``, ``RESTARTING``, ``FINISHED``, ``CANCELED``, ``FAILED`` ...)."""
        return self.rest_get(f"/jobs/{job_id}/status")["status"]

    def job_subtasks(self, job_id: str) -> list[dict[str, Any]]:
        """Every subtask of ``job_id``'s current attempt: vertex name, subtask index, status, TaskManager id.

        Built from REST resources that do not make the JobManager fetch metrics from the TaskManagers
        (``/jobs/<id>`` and vertex details do): a metric dump calls every Python gauge of a thread-mode
        job, which can crash a TaskManager whose task is being torn down at that moment.
        """
        by_data_port = {tm["dataPort"]: tm["id"] for tm in self.rest_get("/taskmanagers")["taskmanagers"]}
        subtasks = []
        for node in self.rest_get(f"/jobs/{job_id}/plan")["plan"]["nodes"]:
            times = self.rest_get(f"/jobs/{job_id}/vertices/{node['id']}/subtasktimes")
            for subtask in times["subtasks"]:
                reached = {state: at for state, at in subtask["timestamps"].items() if at > 0}
                port = int(subtask["endpoint"].rsplit(":", 1)[1]) if ":" in subtask.get("endpoint", "") else None
                subtasks.append({"vertex": times["name"], "subtask": subtask["subtask"],
                                 "status": max(reached, key=reached.get) if reached else "CREATED",
                                 "taskmanager": by_data_port.get(port)})
        return subtasks

    def job_taskmanagers(self, job_id: str) -> dict[str, int]:
        """Resource ids of the TaskManagers running subtasks of ``job_id`` -> how many subtasks each runs."""
        hosts: dict[str, int] = {}
        for subtask in self.job_subtasks(job_id):
            if subtask["taskmanager"] is not None:
                hosts[subtask["taskmanager"]] = hosts.get(subtask["taskmanager"], 0) + 1
        return hosts

    def operator_metrics(self, job_id: str, group: str, names: Sequence[str]) -> dict[str, dict[str, float]]:
        """Operator metrics ``<group>.<name>`` of ``job_id``'s running subtasks, aggregated over them by the
        REST API (``/jobs/<id>/vertices/<v>/subtasks/metrics?agg=sum,max``): ``{name: {"sum": .., "max": ..}}``.

        Only the current attempt's subtasks report: a subtask on a killed TaskManager took its metrics with it,
        and a restarted one counts from 0. Names no subtask reports (yet) are missing from the answer. Call it
        while the job runs: this makes the JobManager fetch metrics from the TaskManagers (see ``job_subtasks``).
        """
        from urllib.parse import quote

        found: dict[str, dict[str, float]] = {}
        for node in self.rest_get(f"/jobs/{job_id}/plan")["plan"]["nodes"]:
            base = f"/jobs/{job_id}/vertices/{node['id']}/subtasks/metrics"
            # Ids are "<operator name>.<group>.<name>"; the operator name is Flink's, so match on the tail.
            wanted = {m["id"]: name for m in self.rest_get(base) for name in names
                      if m["id"].endswith(f".{group}.{name}")}
            if wanted:
                query = quote(",".join(wanted), safe=",")
                for metric in self.rest_get(f"{base}?get={query}&agg=sum,max"):
                    found[wanted[metric["id"]]] = {agg: float(metric[agg]) for agg in ("sum", "max") if agg in metric}
        return found

    def job_diagnostics(self, job_id: str) -> str:
        """Job status, subtask states, checkpoint counts and the latest exceptions, for error messages.

        Uses only REST resources that make the JobManager fetch no TaskManager metrics (see ``job_subtasks``).
        """
        try:
            status = self.job_status(job_id)
            subtasks = self.job_subtasks(job_id)
            history = self.rest_get(f"/jobs/{job_id}/exceptions").get("exceptionHistory", {}).get("entries", [])
            checkpoints = self.rest_get(f"/jobs/{job_id}/checkpoints")["counts"]
        except Exception as exc:  # noqa: BLE001 - diagnostics must not hide the real failure
            return f"(REST API: {exc})"
        tasks = ", ".join(f"{t['vertex'][:30]} {t['subtask']}: {t['status']} on {t['taskmanager']}" for t in subtasks)
        errors = "\n".join(_first_and_root_cause(entry["stacktrace"]) for entry in history[:2])
        return f"job {status}; {tasks}; checkpoints {checkpoints}\n{errors}"

    # -- internals ---------------------------------------------------------------------------------
    def _port(self, port: int, what: str, option: str, exclude: set[int]) -> int:
        return claim_port(port, what=what, option=option, exclude=exclude)

    @staticmethod
    def _require_java() -> None:
        java_home = os.environ.get("JAVA_HOME")
        if java_home and Path(java_home, "bin", "java").is_file():
            return
        require_command("java", _JAVA_HINT)

    def _write_configuration(self, rest_port: int, rpc_port: int) -> None:
        source = conf_dir() / "flink"
        template = source / "config.yaml"
        if not template.is_file():
            raise LocalServiceError(f"the Flink configuration template is missing: {template}")
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        quoted = {name: json.dumps(str(value)) for name, value in {
            "log_dir": self.log_dir, "pid_dir": self.pid_dir, "tmp_dir": self.work_dir / "tmp",
            "web_tmp_dir": self.work_dir / "tmp" / "web", "checkpoints_uri": self.checkpoints_dir.as_uri(),
            "savepoints_uri": self.savepoints_dir.as_uri(), "python": sys.executable,
        }.items()}
        text = string.Template(template.read_text()).substitute(
            rest_port=rest_port, rpc_port=rpc_port, slots=SLOTS_PER_TASKMANAGER, **quoted)
        if self.heartbeat_timeout_ms is not None:
            text = _replace_setting(text, "heartbeat.timeout", str(self.heartbeat_timeout_ms))
        jvm_options = local_jvm_options()
        if jvm_options:
            text += f"env.java.opts.all: {json.dumps(' '.join(jvm_options))}\n"
        (self.conf_dir / "config.yaml").write_text(text)
        for name in _LOG4J_FILES:
            shutil.copyfile(source / name, self.conf_dir / name)
        (self.conf_dir / "workers").write_text("localhost\n" * self.taskmanagers)
        (self.conf_dir / "masters").write_text(f"127.0.0.1:{rest_port}\n")

    def _link_lib_dir(self) -> None:
        """FLINK_LIB_DIR: pyflink's lib jars plus opt/flink-python, so pemja is on the cluster class path."""
        home = pyflink_home()
        jars = sorted((home / "lib").glob("*.jar"))
        python_jars = sorted((home / "opt").glob("flink-python-*.jar"))
        if not any(jar.name.startswith("flink-dist") for jar in jars) or len(python_jars) != 1:
            raise LocalServiceError(
                f"the pyflink package at {home} lacks lib/flink-dist-*.jar or exactly one opt/flink-python-*.jar: "
                "reinstall apache-flink"
            )
        if self.lib_dir.exists():
            shutil.rmtree(self.lib_dir)
        self.lib_dir.mkdir(parents=True)
        for jar in [*jars, *python_jars]:
            (self.lib_dir / jar.name).symlink_to(jar)

    def _launch_taskmanagers(self, count: int, also: Sequence[subprocess.Popen] = ()) -> list[TaskManagerProcess]:
        """Run ``taskmanager.sh start`` ``count`` times at once, each with its own resource id; record the PIDs.

        ``also``: scripts started before, to wait for with these.
        """
        state = self._read_state()
        first = state["next_taskmanager"]
        resource_ids = [f"tm-{n}" for n in range(first, first + count)]
        state["next_taskmanager"] = first + count
        self._write_state(state)
        before = set(self._pid_lines(_TASKMANAGER_PID_FILE))
        scripts = [*also, *(self._spawn_script("taskmanager.sh", "start", "-D", f"taskmanager.resource-id={rid}")
                            for rid in resource_ids)]
        failures = []
        for script in scripts:  # wait for every script before reporting any failure: none is left running
            try:
                self._finish_script(script)
            except LocalServiceError as exc:
                failures.append(exc)
        if failures:
            raise failures[0]
        new = [pid for pid in self._pid_lines(_TASKMANAGER_PID_FILE) if pid not in before]
        found = self._resource_ids_of(new, expected=resource_ids)
        missing = [rid for rid in resource_ids if rid not in found]
        if missing:
            seen = ", ".join(f"{pid} ({'running' if pid_alive(pid) else 'gone'})" for pid in new) or "none"
            raise LocalServiceError(f"taskmanager.sh start recorded no PID for {', '.join(missing)} (new PIDs: "
                                    f"{seen}); the logs end with:\n{self._log_tail()}")
        state = self._read_state()
        state["taskmanagers"].update({rid: found[rid] for rid in resource_ids})
        self._write_state(state)
        return [TaskManagerProcess(rid, found[rid]) for rid in resource_ids]

    @staticmethod
    def _resource_ids_of(pids: list[int], expected: list[str], timeout_s: float = 20.0) -> dict[str, int]:
        """Map each of ``expected`` to the new TaskManager PID started with it.

        The PID file gets a PID as soon as the script forked; on a loaded machine the process may not have
        exec'ed Java yet, so its command line is read again until every PID shows its resource id (or died).
        """
        if len(pids) == 1 and len(expected) == 1:
            return {expected[0]: pids[0]}
        deadline = time.monotonic() + timeout_s
        while True:
            found = {rid: pid for pid in pids if (rid := _resource_id_of(pid)) is not None}
            if set(expected) <= set(found) or time.monotonic() > deadline or not all(map(pid_alive, pids)):
                return found
            time.sleep(0.1)

    def _wait_for_taskmanagers(self, resource_ids: set[str], timeout_s: float) -> None:
        """Wait until the REST API lists ``resource_ids`` among the registered TaskManagers, with their slots."""
        state = self._read_state()
        rest_url = f"http://127.0.0.1:{state['rest_port']}"
        deadline = time.monotonic() + timeout_s
        seen = "the REST API did not answer"
        while time.monotonic() < deadline:
            if not pid_alive(state["jobmanager_pid"]):
                raise LocalServiceError(f"the Flink JobManager exited while starting; the logs end with:\n"
                                        f"{self._log_tail()}")
            dead = sorted(rid for rid in resource_ids if not pid_alive(state["taskmanagers"][rid]))
            if dead:
                raise LocalServiceError(f"TaskManager(s) {', '.join(dead)} exited while starting; the logs end "
                                        f"with:\n{self._log_tail()}")
            try:
                registered = {tm["id"]: tm for tm in self._get(rest_url, "/taskmanagers", timeout_s=3)["taskmanagers"]}
                seen = f"registered TaskManagers: {sorted(registered) or 'none'}"
                if all(rid in registered and registered[rid]["slotsNumber"] == SLOTS_PER_TASKMANAGER
                       for rid in resource_ids):
                    return
            except (OSError, ValueError, KeyError):
                pass  # not up yet; the deadline bounds the retries
            time.sleep(0.25)
        raise LocalServiceError(
            f"TaskManager(s) {', '.join(sorted(resource_ids))} did not register with the Flink cluster at {rest_url} "
            f"within {timeout_s:.0f} s ({seen}); the logs ({self.log_dir}) end with:\n{self._log_tail()}"
        )

    def _check_identity(self) -> None:
        """Make sure the REST API that answered is this cluster's (not another one's on a reused port)."""
        config = {entry["key"]: entry["value"] for entry in self.rest_get("/jobmanager/config")}
        if config.get("state.savepoints.dir") != self.savepoints_dir.as_uri():
            raise LocalServiceError(
                f"the Flink REST API at {self.rest_url} belongs to another cluster (savepoints dir "
                f"{config.get('state.savepoints.dir')!r}): choose another port"
            )

    def _spawn_script(self, name: str, *args: str) -> subprocess.Popen:
        command = [str(pyflink_home() / "bin" / name), *args]
        # A new session: the daemons outlive the caller (the CLI) and are stopped by PID.
        return subprocess.Popen(command, env=self.environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=self.work_dir, text=True, start_new_session=True)

    def _finish_script(self, script: subprocess.Popen, timeout_s: float = 120.0, check: bool = True) -> str:
        what = " ".join(Path(script.args[0]).name if i == 0 else arg for i, arg in enumerate(script.args))
        try:
            output, _ = script.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            script.kill()
            script.communicate()
            raise LocalServiceError(f"{what} did not finish within {timeout_s:.0f} s") from exc
        if check and (script.returncode != 0 or "[ERROR]" in output):
            raise LocalServiceError(f"{what} failed (exit {script.returncode}):\n{_tail(output, 20)}"
                                    f"\nThe logs end with:\n{self._log_tail()}")
        return output

    def _script(self, name: str, *args: str, timeout_s: float = 120.0, check: bool = True) -> str:
        return self._finish_script(self._spawn_script(name, *args), timeout_s, check)

    def _pid_lines(self, name: str) -> list[int]:
        try:
            return [int(line) for line in (self.pid_dir / name).read_text().split() if line.isdigit()]
        except FileNotFoundError:
            return []

    def _last_pid(self, name: str) -> int | None:
        lines = self._pid_lines(name)
        return lines[-1] if lines else None

    def _recorded_pids(self) -> list[int]:
        """Every PID this work directory knows of: the state file's and Flink's own PID files'."""
        state = self._read_state() or {}
        pids = [*state.get("taskmanagers", {}).values(), *self._pid_lines(_TASKMANAGER_PID_FILE)]
        pids += [state["jobmanager_pid"]] if state.get("jobmanager_pid") else []
        pids += self._pid_lines(_JOBMANAGER_PID_FILE)
        return list(dict.fromkeys(pids))

    def _live_recorded_pids(self) -> list[int]:
        """The recorded PIDs that run, and run for this work directory (:meth:`_runs_here`)."""
        return [pid for pid in self._recorded_pids() if self._runs_here(pid)]

    def _runs_here(self, pid: int) -> bool:
        """Whether ``pid`` runs, for this work directory: a PID recorded long ago (a killed TaskManager's) may
        since belong to another process, another cluster's or broker's even."""
        return pid_alive(pid) and _runs_for(pid, self.work_dir)

    def _clean_up_leftovers(self) -> None:
        """Before a start: end processes a dead JobManager left behind and forget its PID files."""
        _terminate_all(self._live_recorded_pids(), 10)
        for name in (_JOBMANAGER_PID_FILE, _TASKMANAGER_PID_FILE):
            (self.pid_dir / name).unlink(missing_ok=True)
        self._state_file.unlink(missing_ok=True)

    def _log_tail(self, lines: int = 15) -> str:
        parts = []
        for path in sorted(self.log_dir.glob("flink-*-*-*.*")):
            if path.suffix in (".log", ".out") and "client" not in path.name:
                text = _tail(path.read_text(errors="replace"), lines)
                if text:
                    parts.append(f"--- {path.name}\n{text}")
        return "\n".join(parts) or "(no logs)"

    def _read_state(self) -> dict | None:
        return read_state_file(self._state_file)

    def _write_state(self, state: dict) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        temporary = self._state_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(state, indent=1))
        temporary.replace(self._state_file)

    @staticmethod
    def _get(rest_url: str, path: str, timeout_s: float) -> Any:
        with urllib.request.urlopen(rest_url + path, timeout=timeout_s) as response:  # noqa: S310 - loopback
            return json.loads(response.read())


def _terminate_all(pids: list[int], timeout_s: float) -> None:
    """SIGTERM every PID at once, SIGKILL those still running after ``timeout_s``; return when all are gone."""
    for pid in pids:
        _send(pid, signals.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        if pid_alive(pid):
            stop_process(pid, timeout_s=0)  # SIGKILL, and wait until it is gone


def _send(pid: int, signal: int) -> None:
    try:
        os.kill(pid, signal)
    except ProcessLookupError:
        pass


def _runs_for(pid: int, work_dir: Path) -> bool:
    """Whether process ``pid`` names ``work_dir`` in its command line or environment (Flink's daemons do: their
    conf and log dirs; a script not yet exec'ed into Java, its environment). True where /proc cannot tell."""
    marker = str(work_dir).encode()
    try:
        return any(marker in Path(f"/proc/{pid}/{part}").read_bytes() for part in ("cmdline", "environ"))
    except FileNotFoundError:
        return not Path("/proc/self").exists()  # gone since, or no /proc on this system
    except OSError:
        return True


def _resource_id_of(pid: int) -> str | None:
    """The ``taskmanager.resource-id`` a TaskManager process was started with (from its command line)."""
    try:
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    for argument in arguments:
        if argument.startswith("taskmanager.resource-id="):
            return argument.split("=", 1)[1]
    return None


def _explain_client_failure(output: str) -> str:
    """The useful part of a failed `flink` client's output: the Python traceback of a `-py` job (without
    Java frames, with its last Java causes) if there is one, else the end of the output."""
    lines = output.strip().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if not starts:
        return _tail(output, 30)
    python = []
    for line in lines[starts[-1]:]:
        if line.startswith(("ERROR ", "WARN ")):  # the client's own log lines follow the Python output
            break
        if not line.lstrip().startswith(("at ", "... ")):
            python.append(line)
    causes = list(dict.fromkeys(line for line in python if line.startswith("Caused by:")))
    shown = [line for line in python if not line.startswith("Caused by:")]
    return "\n".join([*shown[:30], *causes[-2:]])


def _first_and_root_cause(stacktrace: str) -> str:
    lines = stacktrace.splitlines()
    causes = [line for line in lines if line.startswith("Caused by:")]
    return "\n".join([lines[0], *causes[-2:]]) if lines else ""


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
