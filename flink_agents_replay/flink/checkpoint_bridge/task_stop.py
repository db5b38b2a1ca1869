"""The task-stop signal: a run's threads learn that Flink is cancelling or failing their task, and start nothing.

A TaskManager that lost its JobManager (paused, partitioned) fails its tasks as soon as it runs again, but the
operator's ``close()``, which stops the runs, comes only when the task thread gets there: measured, runs made
3-4 new calls 26-133 ms after the process resumed, though Flink was failing the task 10 ms after. The task's
execution state turns CANCELING or FAILED at once, then the StreamTask's ``canceled`` flag is set (``failing``, for
a failure on the task thread); the bridge's ``TaskStopSignal`` (Java) reads them every 5 ms and, once one says so,
writes one byte to a pipe.
:meth:`TaskStop.stopping` reads that pipe without blocking: the operator asks it before every call, action and
run (``scope.check``), next to whether it is closing.

The two halves meet at a pipe for the reason completion wake-ups do (:mod:`.wakeups`): Python's worker threads
cannot call into Java, and Java threads must not call the embedded interpreter. The Java side holds the write
end (it opens ``/proc/self/fd/<n>`` before Python closes its own), so the pipe ends when Java stops: the end of
the stream without the byte means the signal is gone (the operator closing), not a stop.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

__all__ = ["STOPPING", "TaskStop"]

#: The byte the Java side writes when the task is being cancelled or failed.
STOPPING = b"\x01"

log = logging.getLogger("flink_agents_replay.operator")


class TaskStop:
    """The Python half of the bridge's ``TaskStopSignal`` (Java), given to ``attach_task_stop``.

    ``java_signal`` needs one method, ``listen(fd)``: open the pipe's write end ``/proc/self/fd/<fd>`` and write
    :data:`STOPPING` there once the task is being cancelled or failed.
    """

    def __init__(self, java_signal: Any):
        read_fd, write_fd = os.pipe()
        try:
            java_signal.listen(write_fd)  # Java opens its own descriptor of the write end
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        os.set_blocking(read_fd, False)
        self._fd: int | None = read_fd
        self._lock = threading.Lock()  # one reader at a time, and never a closed (possibly reused) descriptor
        self._stopping = False

    def stopping(self) -> bool:
        """Whether the task is being cancelled or failed (any thread; one non-blocking read until it is)."""
        if self._stopping:
            return True
        with self._lock:
            if self._stopping or self._fd is None:
                return self._stopping
            try:
                data = os.read(self._fd, 1)
            except BlockingIOError:
                return False
            if data == STOPPING:
                self._stopping = True
                log.info("the task is being cancelled or failed: its runs start no new call, action or run")
            else:  # the end of the stream: the Java side stopped watching (the operator closes)
                os.close(self._fd)
                self._fd = None
            return self._stopping

    def close(self) -> None:
        """Close the read end (the operator closes)."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
