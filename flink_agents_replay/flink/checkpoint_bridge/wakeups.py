"""Completion wake-ups: work finishing on another thread brings the task thread back to its key.

A bridged function whose work for a key ends on a worker thread would otherwise need a processing-time
timer per key, polling for the end. With wake-ups, the function remembers a token for the current key on
the task thread (:meth:`CompletionWakeups.remember_current_key`) and, when the work is done, wakes it from
any thread (:meth:`CompletionWakeups.wake`): the bridge then fires the function's ``on_timer`` for that
key at the current processing time, from the task thread's mailbox, between two inputs.

The two halves meet at a pipe: Python's worker threads cannot call Java, and Java threads must not call
the embedded interpreter. A token is 8 bytes, written at once (pipe writes up to ``PIPE_BUF`` are atomic)
and never blocking: a full pipe drops the wake-up and counts it in :attr:`CompletionWakeups.dropped`,
which is why a function keeps a slow fallback timer and calls :meth:`CompletionWakeups.settle` when it
handled the work without its wake-up. Wake-ups are not state: a restore starts without any.
"""

from __future__ import annotations

import itertools
import os
import struct
import threading
from typing import Any

__all__ = ["CompletionWakeups"]

_TOKEN = struct.Struct(">q")


class CompletionWakeups:
    """The Python half of the bridge's ``CompletionWakeups`` (Java), given to ``attach_wakeups``."""

    def __init__(self, java_wakeups: Any):
        read_fd, write_fd = os.pipe()
        try:
            java_wakeups.listen(read_fd)  # Java opens its own descriptor of the pipe
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        os.set_blocking(write_fd, False)
        self._java = java_wakeups
        self._write_fd = write_fd
        self._tokens = itertools.count(1)
        self._lock = threading.Lock()  # a wake-up never writes to a closed (possibly reused) descriptor
        self._closed = False
        self._dropped: set[int] = set()
        #: Wake-ups lost to a full pipe (the fallback timer handles their keys).
        self.dropped = 0

    def remember_current_key(self) -> int:
        """A new token for the key the task thread is on now (call on the task thread only)."""
        token = next(self._tokens)
        self._java.remember(token)
        return token

    def wake(self, token: int) -> None:
        """Fire ``on_timer`` for the token's key soon (any thread; never blocks)."""
        with self._lock:
            if self._closed:
                return
            try:
                os.write(self._write_fd, _TOKEN.pack(token))
            except OSError:  # full pipe (or Java stopped reading): the fallback timer applies the run
                self._dropped.add(token)
                self.dropped += 1

    def settle(self, token: int) -> None:
        """The token's work was handled (task thread): forget it on the Java side if its wake-up was dropped."""
        with self._lock:
            dropped = token in self._dropped
            self._dropped.discard(token)
        if dropped:
            self._java.forget(token)

    def hold_input(self, timeout_ms: int) -> None:
        """Take no input until :meth:`release_input` (task thread): Java runs the task's mails meanwhile, so
        wake-ups keep coming; the task fails if the hold lasts ``timeout_ms``."""
        self._java.holdInput(timeout_ms)

    def release_input(self) -> None:
        """Take input again (task thread)."""
        self._java.releaseInput()

    def close(self) -> None:
        """Close the pipe: the Java reader stops; later wake-ups do nothing."""
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self._write_fd)
