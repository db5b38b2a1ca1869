"""Completion wake-ups, the Python half (checkpoint_bridge/wakeups.py): tokens cross the pipe whole, from any
thread, never block, and a dropped one is forgotten on the Java side once its key was handled without it. The Java
half reads the pipe the way this fake does (its own descriptor, opened through /proc/self/fd)."""

import os
import struct
import threading

import pytest

from flink_agents_replay.flink.checkpoint_bridge.wakeups import CompletionWakeups


class _FakeJava:
    """Stands in for the bridge's CompletionWakeups.java: opens the pipe by its /proc path, keeps remembered tokens."""

    def __init__(self):
        self.remembered: list[int] = []
        self.forgotten: list[int] = []
        self.read_fd: int | None = None

    def listen(self, fd: int) -> None:
        self.read_fd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK)

    def remember(self, token: int) -> None:
        self.remembered.append(token)

    def forget(self, token: int) -> None:
        self.forgotten.append(token)

    def tokens(self) -> list[int]:
        data = b""
        while True:
            try:
                chunk = os.read(self.read_fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            data += chunk
        return [value for (value,) in struct.iter_unpack(">q", data)]


@pytest.fixture
def java():
    java = _FakeJava()
    yield java
    if java.read_fd is not None:
        os.close(java.read_fd)


def test_tokens_woken_from_other_threads_arrive_whole(java):
    wakeups = CompletionWakeups(java)
    tokens = [wakeups.remember_current_key() for _ in range(200)]
    assert java.remembered == tokens and len(set(tokens)) == 200
    threads = [threading.Thread(target=lambda part=tokens[i::4]: [wakeups.wake(t) for t in part]) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wakeups.close()
    assert sorted(java.tokens()) == tokens and wakeups.dropped == 0


def test_a_full_pipe_drops_the_wake_up_instead_of_blocking_and_settle_forgets_it(java):
    wakeups = CompletionWakeups(java)
    token = wakeups.remember_current_key()
    for _ in range(20_000):  # ~160 kB: more than a pipe holds (64 kB by default)
        wakeups.wake(token)
    wakeups.close()
    assert wakeups.dropped > 0
    wakeups.settle(token)
    assert java.forgotten == [token]
    wakeups.settle(token)  # settled once: not forgotten twice
    assert java.forgotten == [token]


def test_after_close_a_wake_up_does_nothing_and_the_reader_sees_the_end(java):
    wakeups = CompletionWakeups(java)
    token = wakeups.remember_current_key()
    wakeups.close()
    wakeups.wake(token)  # e.g. an acknowledgement arriving after the operator closed
    os.set_blocking(java.read_fd, True)
    assert os.read(java.read_fd, 8) == b""  # end of stream: Java's reader stops
