"""The demo (README command 1) end to end, smaller: it must pass its own verdict and leave no process behind."""

from __future__ import annotations

import os

import pytest

from flink_agents_replay.demo import format_table, run_demo

pytestmark = pytest.mark.integration


def _is_service(arguments: list[bytes]) -> bool:
    """Kafka and Flink (java), or a Chroma server (``.../chroma run ...``)."""
    return bool(arguments) and (arguments[0].endswith(b"java") or (len(arguments) > 2 and any(
        a.endswith(b"chroma") for a in arguments[:2]) and b"run" in arguments))


def _service_processes() -> set[int]:
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    arguments = cmdline.read().split(b"\0")
                with open(f"/proc/{entry}/stat") as stat:
                    zombie = stat.read().split(") ", 1)[1][0] == "Z"
            except (OSError, IndexError):
                continue
            if not zombie and _is_service(arguments):
                pids.add(int(entry))
    return pids


def test_demo_kills_a_taskmanager_mid_stream_and_repeats_nothing():
    before = _service_processes()
    lines: list[str] = []
    result = run_demo(tickets=150, customers=20, say=lines.append)
    table = format_table(result)
    print("\n" + table)
    assert result.ok, table + "\n" + "\n".join(lines)
    assert result.repeated_calls == 0 and result.duplicates == 0 and result.missing == 0
    assert result.records_read_at_restore > 0 and result.actions_reused > 0, table
    assert result.journal_pruned > 0, table
    assert any("killed TaskManager" in line for line in lines)
    assert result.memories == 150 and result.duplicate_memories == 0 and result.replies_using_memory > 0, table
    assert _service_processes() - before == set(), "the demo left Kafka, Flink or Chroma processes running"
