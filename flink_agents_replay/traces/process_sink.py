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
import time
from collections import deque
from collections.abc import Mapping

import msgpack

from flink_agents_replay.traces.export import TracingConfig
from flink_agents_replay.traces.exporter_process import frame

__all__ = ["ProcessSpanSink", "interpreter"]

log = logging.getLogger(__name__)

#: How long the writer gathers runs before it writes them: a wake-up and a write per batch, not per run, on the
#: interpreter the runs share. A flush or the close writes at once.
_GATHER_S = 0.05


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
        self._flushes = 0  # flushes waiting for their answer
        self._lost = 0  # spans dropped here: the queue full, or a process that died with them
        self._counted = (0, 0, False)  # the process's (exported, dropped, down) as last answered
        self._before = (0, 0)  # (exported, dropped) of processes that ended: the counts never go back
        self._written = 0  # spans written to the current process (it holds those it has not answered for)
        self._writer: threading.Thread | None = None
        self._reader: threading.Thread | None = None
        self._pause = 1.0  # before another process starts after one died (doubles, at most a minute)
        self._restart_at = 0.0

    @property
    def exported(self) -> int:
        return self._before[0] + self._counted[0]

    @property
    def dropped(self) -> int:
        return self._before[1] + self._counted[1] + self._lost

    @property
    def collector_down(self) -> bool:
        return self._counted[2]

    def start(self) -> None:
        """Start the process now, not with the first run: it spends about a second of CPU importing what it needs,
        better while the job starts than while its first runs do."""
        with self._lock:
            if not self._closed:
                self._ensure_started()

    def submit(self, packed: bytes, estimate: int) -> None:
        """Hand over one run's packed facts (``estimate`` spans); never blocks."""
        with self._lock:
            if (self._closed or self._queued + estimate > self.settings.max_queued_spans
                    or (self._process is None and time.monotonic() < self._restart_at)):
                self._lost += estimate  # a full queue, or a process that died a moment ago: not restarted yet
                return
            self._frames.append((estimate, frame(b"R", msgpack.packb([estimate, packed]))))
            self._queued += estimate
            self._ensure_started()
            if len(self._frames) == 1:  # the writer waits for a first frame; then it gathers (_GATHER_S) unwoken
                self._lock.notify_all()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait, at most ``timeout_s`` (default: the settings' ``flush_timeout_s``), until the process has exported
        (or dropped) everything handed over so far; ``False`` if it did not answer in time, or the collector is
        down (the process then answers at once)."""
        timeout = self.settings.flush_timeout_s if timeout_s is None else timeout_s
        with self._lock:
            process = self._process
            if process is None:
                return True
            number = next(self._numbers)
            self._frames.append((0, frame(b"F", msgpack.packb([number, timeout * 0.9]))))  # its answer travels too
            self._flushes += 1  # the writer writes at once
            self._lock.notify_all()
            try:
                answered = self._lock.wait_for(lambda: number in self._answers or self._process is not process,
                                               timeout)
            finally:
                self._flushes -= 1
            self._answers.pop(number, None)
            return bool(answered) and self._process is process and not self.collector_down

    def close(self) -> None:
        """End the process's input, without waiting for it: it exports what it holds on its own (within its flush
        and export timeouts) and exits. A closing operator (a failover, a cancel) must not wait for a collector that
        is slow or down; the counts of that last stretch are not read."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        if self._writer is not None:
            self._writer.join(1.0)  # the frames still queued go out, then the input ends

    def _ensure_started(self) -> None:
        """Start the process (and the threads) if none runs (called with the lock held)."""
        if self._process is not None:
            return
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
        process = subprocess.Popen(
            [interpreter(), "-m", "flink_agents_replay.traces.exporter_process"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, close_fds=True)
        self._process, self._written, self._counted = process, 0, (0, 0, False)
        self._frames.appendleft((0, self._init))
        self._writer = threading.Thread(target=self._write, args=(process,), daemon=True,
                                        name="flink-agents-replay-span-writer")
        self._writer.start()
        self._reader = threading.Thread(target=self._read, args=(process,), daemon=True,
                                        name="flink-agents-replay-span-answers")
        self._reader.start()

    def _write(self, process: subprocess.Popen) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._frames or self._closed or self._process is not process)
                self._lock.wait_for(lambda: self._closed or self._flushes or self._process is not process, _GATHER_S)
                if self._process is not process:  # it died: the next one has a writer of its own
                    return
                taken = list(self._frames)
                self._frames.clear()
                closing = self._closed
                spans = sum(estimate for estimate, _ in taken)
                self._queued -= spans
                self._written += spans  # the process holds them from here (or they are lost with it)
            try:
                if taken:
                    process.stdin.write(b"".join(payload for _, payload in taken))
                    process.stdin.flush()
                if closing:
                    process.stdin.close()
                    return
            except (BrokenPipeError, OSError, ValueError):
                self._died(process, "its input broke")
                return

    def _read(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            kind, _, rest = line.decode("utf-8", "replace").strip().partition(" ")
            if kind == "X":  # it could not start: say why, once per process
                log.warning("the trace exporter process could not start: %s", rest)
                continue
            number, exported, dropped, down = rest.split()
            with self._lock:
                if self._process is not process:  # answers of a process given up on count no more
                    return
                self._counted = (int(exported), int(dropped), down == "1")
                if kind == "F":
                    self._answers[int(number)] = self._counted
                self._lock.notify_all()
        process.stdout.close()
        process.wait()
        if not self._closed:
            self._died(process, f"it exited with code {process.returncode}")

    def _died(self, process: subprocess.Popen, why: str) -> None:
        """The process ended (or broke) before its input did: what it held is lost (counted), and another starts
        with the next run, after a pause that doubles with each death in a row (at most a minute)."""
        with self._lock:
            if self._process is not process:
                return
            held = max(0, self._written - self._counted[0] - self._counted[1])
            self._lost += held + self._queued
            log.warning("the trace exporter process ended (%s); %d spans it held or was to get are lost; another "
                        "starts in %.0f s", why, held + self._queued, self._pause)
            self._queued = 0
            self._frames.clear()
            self._before = (self._before[0] + self._counted[0], self._before[1] + self._counted[1])
            self._counted, self._written, self._process = (0, 0, False), 0, None
            self._restart_at = time.monotonic() + self._pause
            self._pause = min(60.0, self._pause * 2)
            self._lock.notify_all()
        if process.poll() is None:  # hung, or its input broke: it must not live on
            process.kill()
        try:
            process.stdin.close()
        except OSError:
            pass  # its pipe broke with it
