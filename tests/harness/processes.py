"""The service processes (Kafka, Flink, Chroma) alive on this machine: to check that a run left none behind."""

from __future__ import annotations

import os

__all__ = ["children_running", "service_processes"]


def _is_service(arguments: list[bytes]) -> bool:
    """Kafka and Flink (java), or a Chroma server (``.../chroma run ...``)."""
    return bool(arguments) and (arguments[0].endswith(b"java") or (len(arguments) > 2 and any(
        a.endswith(b"chroma") for a in arguments[:2]) and b"run" in arguments))


def children_running(parent: int, module: bytes) -> set[int]:
    """PIDs of the live children of ``parent`` whose command line holds ``module`` (a TaskManager's exporter
    processes: ``b"flink_agents_replay.traces.exporter_process"``)."""
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    arguments = cmdline.read()
                with open(f"/proc/{entry}/stat") as stat:
                    state, ppid = stat.read().rsplit(") ", 1)[1].split()[:2]
            except (OSError, ValueError):
                continue
            if int(ppid) == parent and state != "Z" and module in arguments:
                pids.add(int(entry))
    return pids


def service_processes(marker: str = "") -> set[int]:
    """PIDs of the live (not zombie) service processes; with ``marker``, only those whose command line holds it (a
    work directory's name: what other tests running at the same time start is not counted)."""
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
            if not zombie and _is_service(arguments) and marker.encode() in b" ".join(arguments):
                pids.add(int(entry))
    return pids
