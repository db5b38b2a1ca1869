"""A real Apache Kafka broker (KRaft, one combined broker/controller) on 127.0.0.1.

Started from the official jars that :mod:`flink_agents_replay.local.jars` fetches, with its data, log
and PID under a work directory. ``start`` returns once the broker answers a metadata request; ``stop``
ends it by the recorded PID. Used by ``flink-agents-replay local kafka ...``, the test fixtures and the
demo.

With ``sasl_users`` the broker also listens with ``SASL_PLAINTEXT`` (mechanism ``PLAIN``, the users and
passwords given) on a port of its own: a broker that requires authentication, so tests can check that a
client built by this package carries the user's security settings. The plain listener stays (the
broker's own readiness check and its inter-broker traffic use it).

For fault tests (docs/design.md, "infrastructure faults: the broker"): :meth:`LocalKafkaBroker.pause` and
:meth:`~LocalKafkaBroker.resume` freeze and thaw the broker process (SIGSTOP/SIGCONT: connections stay open
and nothing answers, as with a broker stuck in a long GC pause or a frozen VM), and
:meth:`~LocalKafkaBroker.restart` stops it and starts it again on the same ports with the same data. With
``advertised_port`` the broker tells clients to connect to another port than it listens on: where a proxy
(:mod:`flink_agents_replay.testing.delay_proxy`) forwards to it.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import string
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from flink_agents_replay.local.errors import LocalServiceError
from flink_agents_replay.local.jars import KAFKA_BROKER, bundle_jars, require_command
from flink_agents_replay.local.paths import conf_dir, home_dir
from flink_agents_replay.local.processes import (
    RecordedProcess,
    claim_port,
    free_port,
    local_jvm_options,
    pid_alive,
    spawn_service,
    wait_until_ready,
)

__all__ = ["BrokerStatus", "LocalKafkaBroker", "default_work_dir"]

#: The storage format tool runs for a second: the C1 compiler alone (no C2) runs it with about a third less CPU.
_FAST_START = "-XX:TieredStopAtLevel=1"
_JVM_OPTIONS = ["-Xms256m", "-Xmx768m", "-XX:+UseG1GC", "-Djava.awt.headless=true"]


def default_work_dir() -> Path:
    """Work directory of the broker the CLI manages."""
    return home_dir() / "kafka"


@dataclass(frozen=True)
class BrokerStatus:
    """What a work directory says about its broker."""

    running: bool
    pid: int | None
    bootstrap_servers: str | None
    work_dir: Path
    #: The listener that requires SASL/PLAIN authentication (only with ``sasl_users``).
    sasl_bootstrap_servers: str | None = None

    def describe(self) -> str:
        """One line for people."""
        if self.running:
            return f"running: pid {self.pid}, bootstrap servers {self.bootstrap_servers}, data in {self.work_dir}"
        return f"not running (work directory {self.work_dir})"


class LocalKafkaBroker(RecordedProcess):
    """One local KRaft broker whose state (data, log, PID, port) lives in ``work_dir``.

    Args:
        work_dir: directory for data, logs and the state file; created if missing.
        port: client port; ``0`` picks a free one. The controller takes another free port.
        start_timeout_s: how long ``start`` waits for the broker to answer.
        sasl_users: user name -> password: also listen with SASL_PLAINTEXT (PLAIN) for these users, on
            another free port (``BrokerStatus.sasl_bootstrap_servers``).
        advertised_port: the port clients are told to connect to (a proxy in front of the broker); the
            status's ``bootstrap_servers`` is then that port. Default: the port the broker listens on.
    """

    def __init__(self, work_dir: Path | str | None = None, *, port: int = 0, start_timeout_s: float = 90.0,
                 sasl_users: Mapping[str, str] | None = None, advertised_port: int | None = None):
        self.work_dir = Path(work_dir) if work_dir is not None else default_work_dir()
        self.port = port
        self.start_timeout_s = start_timeout_s
        self.sasl_users = dict(sasl_users or {})
        self.advertised_port = advertised_port
        self._controller_port: int | None = None  # kept across restart(): the KRaft quorum is configured with it

    @property
    def _state_file(self) -> Path:
        return self.work_dir / "broker.json"

    @property
    def log_file(self) -> Path:
        """The broker's log (stdout, stderr and log4j output)."""
        return self.work_dir / "logs" / "server.log"

    def status(self) -> BrokerStatus:
        """Read the state file and check that its PID still runs."""
        state = self._read_state()
        if state and pid_alive(state["pid"]):
            return BrokerStatus(True, state["pid"], state["bootstrap_servers"], self.work_dir,
                                state.get("sasl_bootstrap_servers"))
        return BrokerStatus(False, None, None, self.work_dir)

    def start(self) -> BrokerStatus:
        """Start the broker (or return the one already running here) and wait until it answers."""
        current = self.status()
        if current.running:
            return current
        java = require_command("java", "a Java 17 runtime (Debian: apt-get install openjdk-17-jre-headless)")
        jars = bundle_jars(KAFKA_BROKER)
        port = claim_port(self.port)
        controller_port = self._controller_port or free_port(exclude={port})
        self.port, self._controller_port = port, controller_port  # a restart() comes back on the same ports
        data_dir = self.work_dir / "data"
        logs_dir = self.work_dir / "logs"
        logs_dir.mkdir(parents=True, exist_ok=True)
        properties = self.work_dir / "server.properties"
        template = string.Template((conf_dir() / "kafka" / "server.properties").read_text())
        sasl_port = free_port(exclude={port, controller_port}) if self.sasl_users else None
        properties.write_text(
            template.substitute(port=port, controller_port=controller_port, data_dir=data_dir)
            + _sasl_properties(port, controller_port, sasl_port, self.sasl_users)
            + _advertised_properties(port, self.advertised_port)
        )
        classpath = os.pathsep.join(str(jar) for jar in jars)  # exactly the locked jars, nothing else
        log_options = [
            f"-Dkafka.logs.dir={logs_dir}",
            f"-Dlog4j2.configurationFile={conf_dir() / 'kafka' / 'log4j2.properties'}",
        ]
        if not (data_dir / "meta.properties").is_file():
            # Storage is formatted once; a restart reuses the data (and the cluster id) it holds.
            self._run_checked(
                [java, _FAST_START, *log_options, "-cp", classpath, "kafka.tools.StorageTool", "format",
                 "--cluster-id", _cluster_id(), "--config", str(properties), "--ignore-formatted"],
                "format the broker's KRaft storage",
            )
        with open(logs_dir / "stdout.log", "ab") as out:
            process = spawn_service(
                [java, *_JVM_OPTIONS, *local_jvm_options(), *log_options, "-cp", classpath, "kafka.Kafka",
                 str(properties)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.work_dir,  # outlives the CLI; stopped by PID
            )
        bootstrap = f"127.0.0.1:{self.advertised_port or port}"
        sasl_bootstrap = f"127.0.0.1:{sasl_port}" if sasl_port else None
        self._state_file.write_text(json.dumps({"pid": process.pid, "bootstrap_servers": bootstrap,
                                                "sasl_bootstrap_servers": sasl_bootstrap}))
        try:
            self._wait_until_ready(process, f"127.0.0.1:{port}")  # directly: a proxy may not run yet
        except BaseException:
            self.stop()
            raise
        return BrokerStatus(True, process.pid, bootstrap, self.work_dir, sasl_bootstrap)

    # -- faults, for tests ---------------------------------------------------------------------------
    def pause(self) -> int:
        """Freeze the running broker (SIGSTOP): its connections stay open, nothing answers. Returns its PID."""
        return self._signal_running(signal.SIGSTOP, "pause")

    def resume(self) -> int:
        """Thaw a paused broker (SIGCONT). Returns its PID."""
        return self._signal_running(signal.SIGCONT, "resume")

    def restart(self, *, down_s: float = 0.0, stop_timeout_s: float = 30.0) -> BrokerStatus:
        """Stop the broker (SIGTERM: a clean shutdown), keep it down ``down_s`` seconds, start it again on the
        same ports with the same data."""
        self.stop(timeout_s=stop_timeout_s)
        if down_s > 0:
            time.sleep(down_s)  # the outage itself: what a test injects, not a wait for a condition
        return self.start()

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop the broker, also a paused one (it is thawed first, or SIGTERM would wait for SIGCONT)."""
        status = self.status()
        if status.running and status.pid is not None:
            os.kill(status.pid, signal.SIGCONT)
        return super().stop(timeout_s=timeout_s)

    def discard(self) -> bool:
        """Stop a broker whose data goes away with it (a test's, a demo's): SIGKILL at once. A controlled shutdown
        saves data nobody will read, and takes 10-30 s once the broker holds thousands of partitions."""
        return self.stop(timeout_s=0)

    def _signal_running(self, sig: signal.Signals, what: str) -> int:
        status = self.status()
        if not status.running or status.pid is None:
            raise LocalServiceError(f"cannot {what} the Kafka broker in {self.work_dir}: it is not running")
        os.kill(status.pid, sig)
        return status.pid

    def _wait_until_ready(self, process: subprocess.Popen, bootstrap: str) -> None:
        from confluent_kafka.admin import AdminClient

        # log_level 0: connection-refused noise while the broker boots is expected, not news.
        admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 2000, "log_level": 0})
        wait_until_ready(process, lambda: bool(admin.list_topics(timeout=2).brokers), what="the Kafka broker",
                         where=bootstrap, timeout_s=self.start_timeout_s, log_tail=self._log_tail, interval_s=0.2)

    def _log_tail(self, lines: int = 20) -> str:
        text = ""
        for name in ("stdout.log", "server.log"):
            path = self.work_dir / "logs" / name
            if path.is_file():
                text += "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) + "\n"
        return text.strip() or "(empty)"

    def _run_checked(self, command: list[str], what: str) -> None:
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=self.work_dir)
        if result.returncode != 0:
            raise LocalServiceError(f"could not {what} (exit {result.returncode}):\n{result.stdout}{result.stderr}")


def _sasl_properties(port: int, controller_port: int, sasl_port: int | None, users: Mapping[str, str]) -> str:
    """Lines added to server.properties for a SASL_PLAINTEXT listener (later lines win in a properties file)."""
    if sasl_port is None:
        return ""
    for name, password in users.items():
        if not name.isidentifier() or '"' in password or "\\" in password:
            raise LocalServiceError(f"SASL user {name!r}: use a plain identifier as the name and a password "
                                    "without quotes or backslashes (they go into a JAAS line)")
    accounts = " ".join(f'user_{name}="{password}"' for name, password in users.items())
    return "\n".join([
        "",
        "# SASL_PLAINTEXT listener (LocalKafkaBroker(sasl_users=...)): clients must authenticate with PLAIN.",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port},"
        f"SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "listener.name.sasl_plaintext.sasl.enabled.mechanisms=PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config="
        f"org.apache.kafka.common.security.plain.PlainLoginModule required {accounts};",
        "",
    ])


def _advertised_properties(port: int, advertised_port: int | None) -> str:
    """Lines that make clients connect to ``advertised_port`` (a proxy in front of the broker)."""
    if advertised_port is None or advertised_port == port:
        return ""
    return f"\n# Clients connect through a proxy (LocalKafkaBroker(advertised_port=...)).\n" \
           f"advertised.listeners=PLAINTEXT://127.0.0.1:{advertised_port}\n"


def _cluster_id() -> str:
    """A KRaft cluster id: a base64url 16-byte UUID, as `kafka-storage.sh random-uuid` prints.

    Like Kafka's own generator, avoid a leading '-': the storage tool would read it as an option.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id
