"""A subtask's end of the exporter process: hand runs over, ask for flushes, read the counts back.

The operator's interpreter packs each run's facts (:mod:`.handoff`) and puts them in a queue; a writer thread
writes the queue to the exporter process's standard input in one write per wake-up (the write itself releases the
interpreter's lock), and a reader thread reads its answers. Nothing here makes a span or imports OpenTelemetry.

The process is started with the interpreter the subtask runs on and the subtask's ``sys.path`` (a TaskManager's
embedded Python reports its base installation as its prefix, not the job's environment). Its standard error goes
nowhere: what it cannot deliver comes back as counts (``dropped``), which the operator logs and counts. If it dies,
what it held is lost and counted, and the next run starts another.
"""

from __future__ import annotations

import itertools
import logging
import os
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Mapping

import msgpack

from flink_agents_replay.traces.export import TracingConfig
from flink_agents_replay.traces.exporter_process import frame

__all__ = ["ProcessSpanSink", "interpreter"]

log = logging.getLogger(__name__)


def interpreter() -> str:
    """The Python to start the exporter with: this one's, also inside a TaskManager (whose ``sys.executable`` may be
    a launcher's shim that picks another version)."""
    if sys.prefix != sys.base_prefix and sys.executable:  # a virtual environment's own interpreter
        return sys.executable
    exact = os.path.join(sys.base_prefix, "bin", f"python{sys.version_info.major}.{sys.version_info.minor}")
    return exact if os.access(exact, os.X_OK) else sys.executable


class ProcessSpanSink:
    """Runs handed to an exporter process (see the module's docstring); never blocks a run or the task thread but
    in :meth:`flush`, which waits at most its timeout."""

    def __init__(self, settings: TracingConfig, *, agent: str, kinds: Mapping[str, str]) -> None:
        self.settings = settings
        self._init = frame(b"I", msgpack.packb({"settings": settings.model_dump_json(), "agent": agent,
                                                "kinds": dict(kinds)}))
        self._lock = threading.Condition()
        self._frames: deque[tuple[int, bytes]] = deque()  # (spans about, frame) waiting to be written
        self._queued = 0
        self._process: subprocess.Popen | None = None
        self._answers: dict[int, tuple[int, int, bool]] = {}
        self._numbers = itertools.count(1)
        self._closed = False
        self._lost = 0  # spans dropped here: the queue full, or a process that died with them
        self._counted = (0, 0, False)  # the process's (exported, dropped, down) as last answered
        self._before = (0, 0)  # (exported, dropped) of processes that ended: the counts never go back
        self._writer: threading.Thread | None = None

    @property
    def exported(self) -> int:
        return self._before[0] + self._counted[0]

    @property
    def dropped(self) -> int:
        return self._before[1] + self._counted[1] + self._lost

    @property
    def collector_down(self) -> bool:
        return self._counted[2]

    def submit(self, packed: bytes, estimate: int) -> None:
        """Hand over one run's packed facts (about ``estimate`` spans)."""
        with self._lock:
            if self._closed or self._queued + estimate > self.settings.max_queued_spans:
                self._lost += estimate
                return
            self._frames.append((estimate, frame(b"R", msgpack.packb([estimate, packed]))))
            self._queued += estimate
            self._ensure_started()
            self._lock.notify_all()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until the process has exported (or dropped) everything handed over so far; ``False`` when that took
        longer than ``timeout_s`` (default: the settings' ``flush_timeout_s``), or the collector is down."""
        timeout = self.settings.flush_timeout_s if timeout_s is None else timeout_s
        with self._lock:
            if self._process is None:
                return True
            number = next(self._numbers)
            self._frames.append((0, frame(b"F", msgpack.packb([number, timeout]))))
            self._lock.notify_all()
            # the process's own wait is bounded by the timeout; a little more for the answer to travel
            answered = self._lock.wait_for(lambda: number in self._answers or self._process is None, timeout + 1)
            self._answers.pop(number, None)
            return bool(answered) and self._process is not None and not self.collector_down

    def close(self) -> None:
        """Flush (within the timeout), end the process's input and wait for it to export what it holds."""
        self.flush()
        with self._lock:
            self._closed = True
            self._lock.notify_all()
            process = self._process
        if self._writer is not None:
            self._writer.join(5)
        if process is not None:
            try:
                process.wait(self.settings.export_timeout_s + self.settings.flush_timeout_s + 2)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _ensure_started(self) -> None:
        """Start the process (and the threads) if none runs (called with the lock held)."""
        if self._process is not None:
            return
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
        self._process = subprocess.Popen(
            [interpreter(), "-m", "flink_agents_replay.traces.exporter_process"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, close_fds=True)
        self._frames.appendleft((0, self._init))
        self._writer = threading.Thread(target=self._write, args=(self._process,), daemon=True,
                                        name="flink-agents-replay-span-writer")
        self._writer.start()
        threading.Thread(target=self._read, args=(self._process,), daemon=True,
                         name="flink-agents-replay-span-answers").start()

    def _write(self, process: subprocess.Popen) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._frames or self._closed or self._process is not process)
                if self._process is not process:  # it died: the next one has a writer of its own
                    return
                taken = list(self._frames)
                self._frames.clear()
                closing = self._closed
            try:
                if taken:
                    process.stdin.write(b"".join(payload for _, payload in taken))
                    process.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                self._died(process, sum(estimate for estimate, _ in taken))
                return
            with self._lock:
                self._queued -= sum(estimate for estimate, _ in taken)
            if closing:
                process.stdin.close()
                return

    def _read(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            kind, number, exported, dropped, down = line.decode().split()
            with self._lock:
                self._counted = (int(exported), int(dropped), down == "1")
                if kind == "F":
                    self._answers[int(number)] = self._counted
                self._lock.notify_all()
        process.stdout.close()
        process.wait()
        if process.returncode and not self._closed:
            self._died(process, 0)

    def _died(self, process: subprocess.Popen, lost: int) -> None:
        """The process ended before its input did: what it held is lost (counted); the next run starts another."""
        with self._lock:
            if self._process is not process:
                return
            log.warning("the trace exporter process ended (exit code %s); the spans it held are lost",
                        process.poll())
            self._lost += lost + self._queued
            self._queued = 0
            self._frames.clear()
            try:
                process.stdin.close()
            except OSError:
                pass  # its pipe broke with it
            self._before = (self.exported, self._before[1] + self._counted[1])
            self._counted = (0, 0, False)
            self._process = None
            self._lock.notify_all()
