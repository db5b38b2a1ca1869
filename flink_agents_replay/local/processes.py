"""Small process and port helpers shared by the local services."""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import tenacity

from flink_agents_replay.local.errors import LocalServiceError

__all__ = ["LOCAL_JVM_OPTIONS_ENV", "RecordedProcess", "free_port", "local_jvm_options", "pid_alive", "port_in_use",
           "read_state_file", "spawn_service", "stop_process", "wait_until_ready"]


#: Extra options for the JVMs of the local broker and Flink cluster (shell words). The test suite sets
#: ``-XX:TieredStopAtLevel=1``: its JVMs live seconds, and C1 alone starts them with a third less CPU.
LOCAL_JVM_OPTIONS_ENV = "FLINK_AGENTS_REPLAY_LOCAL_JVM_OPTIONS"


def local_jvm_options() -> list[str]:
    """The options :data:`LOCAL_JVM_OPTIONS_ENV` gives (none by default)."""
    return shlex.split(os.environ.get(LOCAL_JVM_OPTIONS_ENV, ""))


def free_port(exclude: set[int] = frozenset()) -> int:
    """A TCP port on 127.0.0.1 that nothing holds right now, chosen outside the kernel's ephemeral range.

    Why not the kernel's pick (bind to port 0): that comes from the ephemeral range, which outgoing connections
    (every Kafka client) also draw local ports from, so one of them can take it before our server binds it.
    """
    low, _ = _ephemeral_range()
    candidates = range(_LOWEST_CHOSEN_PORT, low) if low - _LOWEST_CHOSEN_PORT >= 1000 else None
    while True:
        if candidates is None:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
        else:
            port = random.choice(candidates)
        if port not in exclude and port not in _handed_out and not port_in_use(port) and _claim_on_this_host(port):
            _handed_out.add(port)  # two callers in this process never get the same port before either binds
            return port


_LOWEST_CHOSEN_PORT = 20000
_handed_out: set[int] = set()
#: How long a port handed out stays claimed for other processes of this host (time enough to bind it).
_CLAIM_S = 300.0


def _claim_on_this_host(port: int) -> bool:
    """Record ``port`` as handed out in a file every process of this user shares; False if another process
    handed it out in the last :data:`_CLAIM_S` seconds (parallel test workers, two CLIs: neither binds yet)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: this process's own record is all there is
        return True
    path = Path(tempfile.gettempdir()) / f"flink-agents-replay-ports-{os.getuid()}.json"
    with open(path, "a+", encoding="utf-8") as claims_file:
        fcntl.flock(claims_file, fcntl.LOCK_EX)
        claims_file.seek(0)
        try:
            claims = {int(p): t for p, t in json.loads(claims_file.read() or "{}").items()}
        except (ValueError, AttributeError):
            claims = {}  # unreadable: start afresh
        now = time.time()
        claims = {p: t for p, t in claims.items() if now - t < _CLAIM_S}
        if port in claims:
            return False
        claims[port] = now
        claims_file.seek(0)
        claims_file.truncate()
        claims_file.write(json.dumps(claims))
    return True


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux default when unreadable)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def port_in_use(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port`` or holds it bound."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As the servers themselves bind: connections of a stopped server lingering in TIME_WAIT do not count.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return True


def stop_process(pid: int, timeout_s: float = 30.0) -> bool:
    """SIGTERM ``pid`` (and its process group), SIGKILL after ``timeout_s`` (0: at once); True if it was running."""
    if not pid_alive(pid):
        _reap(pid)  # ended on its own or killed by another process: a child of ours still needs waiting for
        return False
    _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            _reap(pid)
            return True
        time.sleep(0.1)
    _signal(pid, signal.SIGKILL)
    while pid_alive(pid):
        time.sleep(0.05)
    _reap(pid)
    return True


def _signal(pid: int, sig: int) -> None:
    try:
        os.killpg(os.getpgid(pid), sig) if os.getpgid(pid) == pid else os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> None:
    process = _services.pop(pid, None)
    if process is not None:
        process.wait()  # gone already: collects its exit status, and its Popen knows (no ResourceWarning)
        return
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def spawn_service(command: list[str], **popen_options) -> subprocess.Popen:
    """Start a service process that outlives its caller (a new session; stopped by PID with :func:`stop_process`).

    Why the registry: a ``Popen`` dropped while its process runs warns (``ResourceWarning``) and leaves a zombie
    when the process ends; kept here, :func:`stop_process` in this process waits for it.
    """
    process = subprocess.Popen(command, start_new_session=True, **popen_options)
    for pid in [pid for pid, known in _services.items() if known.poll() is not None]:
        del _services[pid]
    _services[process.pid] = process
    return process


_services: dict[int, subprocess.Popen] = {}


def read_state_file(path: Path) -> dict | None:
    """The JSON a local service recorded about itself, or ``None`` if there is none (or it is half written)."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


class RecordedProcess:
    """A detached local service whose PID and address live in a JSON state file (``_state_file``).

    Subclasses say where the file is; this gives them reading it and stopping the process it names.
    """

    _state_file: Path

    def _read_state(self) -> dict | None:
        return read_state_file(self._state_file)

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop the process recorded here; return whether one was running."""
        state = self._read_state()
        if not state:
            return False
        was_running = stop_process(state["pid"], timeout_s=timeout_s)
        self._state_file.unlink(missing_ok=True)
        return was_running


def log_tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a service's log, for an error message (``(empty)`` if there are none)."""
    if not path.is_file():
        return "(empty)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) or "(empty)"


def claim_port(port: int, *, what: str = "", option: str = "--port", exclude: set[int] = frozenset()) -> int:
    """``port``, or a free one for ``0``; a :class:`LocalServiceError` naming the fix when it is taken or not a
    port."""
    if not 0 <= port <= 65535:
        raise LocalServiceError(f"{f'the {what} port' if what else 'port'} {port} is not a TCP port: give {option} N "
                                f"with N from 1 to 65535, or {option} 0 for any free port")
    if not port:
        return free_port(exclude=set(exclude))
    if port_in_use(port) or port in exclude:
        raise LocalServiceError(
            f"{f'the {what} port' if what else 'port'} {port} on 127.0.0.1 is already in use: stop what listens "
            f"there, or choose another port ({option} N, or {option} 0 for any free port)")
    return port


def wait_until_ready(process: subprocess.Popen, ready: Callable[[], bool], *, what: str, where: str,
                     timeout_s: float, log_tail: Callable[[], str], interval_s: float = 0.1) -> None:
    """Poll ``ready()`` until it says yes; ``LocalServiceError`` with the log's tail if ``process`` exits
    first or ``timeout_s`` passes. ``ready`` may raise: not up yet."""
    def answers() -> bool:
        if process.poll() is not None:  # not retried: raised as it is
            raise LocalServiceError(f"{what} exited with code {process.returncode} while starting; its log ends "
                                    f"with:\n{log_tail()}")
        try:
            return bool(ready())
        except Exception:  # noqa: BLE001 - not up yet; the deadline bounds the retries
            return False

    polling = tenacity.Retrying(retry=tenacity.retry_if_result(lambda up: not up), wait=tenacity.wait_fixed(interval_s),
                                stop=tenacity.stop_after_delay(timeout_s), retry_error_callback=lambda _: False)
    if not polling(answers):
        raise LocalServiceError(f"{what} did not answer on {where} within {timeout_s:.0f} s; its log ends with:\n"
                                f"{log_tail()}")
