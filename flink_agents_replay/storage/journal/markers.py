"""Recovery markers (kept in Flink operator state) and the pruning they allow.

At checkpoint N each subtask stores a marker: per owned journal partition,

* ``offsets`` — where a restore from N starts reading: the partition's end, lowered to the first record
  of every run still in flight at the barrier and of every recovered history not yet replayed;
* ``ends`` — the partition's end at the barrier: below it, only the in-flight runs' records are needed
  (everything else belongs to runs whose effects N already holds);
* ``in_flight`` — those runs, as (key digest, seq);
* ``replaying`` — keys whose recovered history was not replayed yet at the barrier (a restore still under
  way, e.g. a key waiting for an input to come back), as (key digest, first seq still needed): a further
  failure must find those records again, although they lie below ``ends``;
* ``fences`` — the snapshotting attempt's fence in each partition (:mod:`.fencing`): a restore that reads
  from after that attempt's marker still ignores records an older attempt delivered after it (absent in
  markers of earlier versions: no fence).
* ``replaying_since`` (optional, added in 0.3; readers without it ignore it) — per such key, since when
  (epoch seconds) its history has waited for its inputs, so that the expiry of recovered histories
  (:mod:`.checkpoints`) counts across further restores.
* ``checkpoint_time_ms`` (optional, added in 0.5) — the checkpoint's trigger time, so that a restore goes on
  counting run epochs from it (:mod:`flink_agents_replay.flink.epochs`).
* ``waits_open`` (version 2, 0.7) — per key group, how many runs were parked at a wait
  (:mod:`flink_agents_replay.flink.waits`): keyed state cannot be counted, and a restore at any parallelism
  sums its own key groups' (:func:`waits_open`). Version 1 markers read as none.
* ``tools`` (optional, added in 0.7; subtask 0's marker only) — per tool of the agent, a digest of each part of
  its definition (:mod:`flink_agents_replay.api.tool_definitions`), so a restore names the tools that changed
  (:func:`restored_tools`). Markers without it compare nothing.
* ``lineage`` (optional, added in 0.7) — the job lineage: the Flink job id and a submission id (made where the job
  was built) of the start with nothing to restore, kept through every checkpoint and savepoint after it, so a run's
  trace id stays the same across restores (:func:`restored_lineage`, :mod:`flink_agents_replay.traces.ids`).
  Markers without it: the restoring job's.

When N completes, records below ``offsets`` are deleted; an aborted checkpoint deletes nothing. On
restore every subtask receives every subtask's marker (union state) and takes the partitions it owns
now, so a restore at another parallelism reads exactly its own key groups.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from flink_agents_replay.core.errors import JournalError

__all__ = ["MARKER_VERSION", "PruneTracker", "RestorePlan", "build_marker", "checkpoint_time", "encode_marker",
           "plan_restore", "restored_lineage", "restored_tools", "waits_open"]

MARKER_VERSION = 2
_READABLE = (1, 2)
_NEVER = float("inf")


def build_marker(ends: Mapping[int, int], run_firsts: Iterable[tuple[int, int]],
                 floors: Mapping[int, int]) -> dict[int, int]:
    """Per partition, the first offset a restore must read (``run_firsts``: (partition, first offset)).

    Raises :class:`JournalError` for an end that is not an offset: such a marker would be refused by every restore.
    """
    unknown = {p: o for p, o in ends.items() if o < 0}
    if unknown:
        raise JournalError(f"no end offset for journal partitions {sorted(unknown)} (Kafka answered {unknown}): "
                           "the checkpoint cannot mark where a restore starts")
    marker = dict(ends)
    for partition, first in run_firsts:
        marker[partition] = min(marker[partition], first)
    for partition, floor in floors.items():
        if partition in marker:
            marker[partition] = min(marker[partition], floor)
    return marker


def encode_marker(topic_id: str, subtask: int, offsets: Mapping[int, int], ends: Mapping[int, int],
                  in_flight: Mapping[int, list[tuple[str, int]]],
                  replaying: Mapping[int, list[tuple[str, int]]] | None = None,
                  fences: Mapping[int, int] | None = None,
                  replaying_since: Mapping[str, float] | None = None, checkpoint_time_ms: int | None = None,
                  waits_open: Mapping[int, int] | None = None,
                  tools: Mapping[str, Mapping[str, str]] | None = None, lineage: str | None = None) -> bytes:
    """The bytes kept in union operator state."""
    return json.dumps({
        "version": MARKER_VERSION, "topic_id": topic_id, "subtask": subtask,
        "offsets": {str(p): o for p, o in offsets.items()},
        "ends": {str(p): o for p, o in ends.items()},
        "in_flight": {str(p): [list(run) for run in runs] for p, runs in in_flight.items()},
        "replaying": {str(p): [list(key) for key in keys] for p, keys in (replaying or {}).items()},
        "fences": {str(p): fence for p, fence in (fences or {}).items()},
        "replaying_since": dict(replaying_since or {}),
        **({} if checkpoint_time_ms is None else {"checkpoint_time_ms": checkpoint_time_ms}),
        "waits_open": {str(group): n for group, n in (waits_open or {}).items() if n},
        **({} if tools is None else {"tools": {name: dict(parts) for name, parts in tools.items()}}),
        **({} if lineage is None else {"lineage": lineage}),
    }).encode()


def restored_lineage(values: Iterable[bytes]) -> str | None:
    """The job lineage the restored checkpoint kept (``None``: no marker kept one, e.g. before 0.7)."""
    for value in values:
        if value:
            lineage = json.loads(value).get("lineage")
            if isinstance(lineage, str) and lineage:
                return lineage
    return None


def restored_tools(values: Iterable[bytes]) -> dict[str, dict[str, str]] | None:
    """The agent's tools as the restored checkpoint kept them (``None``: no marker kept them, e.g. before 0.7)."""
    for value in values:
        if value:
            tools = json.loads(value).get("tools")
            if isinstance(tools, dict):
                return tools
    return None


def checkpoint_time(values: Iterable[bytes]) -> int | None:
    """The restored checkpoint's trigger time, from its markers (``None``: no marker kept it)."""
    times = [json.loads(value).get("checkpoint_time_ms") for value in values if value]
    return max((t for t in times if t is not None), default=None)


def waits_open(values: Iterable[bytes], owned: range) -> dict[int, int]:
    """Per owned key group, the runs parked at a wait at the restored checkpoint (from its markers)."""
    found: dict[int, int] = {}
    for value in values:
        if value:
            for group, count in json.loads(value).get("waits_open", {}).items():
                if int(group) in owned:
                    found[int(group)] = found.get(int(group), 0) + count
    return found


@dataclass
class RestorePlan:
    """What a subtask reads on restore, from the markers of the snapshot."""

    offsets: dict[int, int] = field(default_factory=dict)
    barrier_ends: dict[int, int] = field(default_factory=dict)
    in_flight: set[tuple[str, int]] = field(default_factory=set)
    replaying: dict[str, int] = field(default_factory=dict)  # key digest -> first seq still needed
    replaying_since: dict[str, float] = field(default_factory=dict)  # key digest -> waiting since (epoch s)
    topic_ids: set[str] = field(default_factory=set)
    fences: dict[int, int] = field(default_factory=dict)  # partition -> the snapshotting attempt's fence

    @property
    def fresh(self) -> bool:
        """No marker: a first start (nothing to read)."""
        return not self.topic_ids

    def needs(self, partition: int, offset: int, digest_of_key: str, seq: int) -> bool:
        """Whether a journal record matters: after the barrier, of a run in flight at it, or of a recovered
        history not yet replayed at it."""
        return (offset >= self.barrier_ends.get(partition, 0) or (digest_of_key, seq) in self.in_flight
                or seq >= self.replaying.get(digest_of_key, _NEVER))

    def needed_by_replay(self, partition: int, offset: int, digest_of_key: str, seq: int) -> bool:
        """Whether a replay may use a production journal record (docs/design.md §9): one of a run in flight at the
        barrier (also written after it: production finished that run), or of a history production was still
        replaying at the barrier. Records of runs started after the barrier are not: those runs belong to
        the replay and run under its side-effect policy, whatever production had journaled for them.

        The second kind goes beyond "runs in flight": a key production was still recovering at the barrier
        (inputs recorded before an earlier failure, not yet re-reached) holds those records as part of the
        savepoint's recovery state, and a production restore from the savepoint would reuse them too; the
        replay starts from the same state, so it does as well (records written before the barrier only)."""
        return (digest_of_key, seq) in self.in_flight or (
            seq >= self.replaying.get(digest_of_key, _NEVER) and offset < self.barrier_ends.get(partition, 0))


def plan_restore(values: Iterable[bytes], owned: range) -> RestorePlan:
    """Combine every subtask's marker, keeping the partitions in ``owned``."""
    plan = RestorePlan()
    for value in values:
        if not value:
            continue
        marker = json.loads(value)
        if marker.get("version") not in _READABLE:
            raise JournalError(f"recovery marker version {marker.get('version')} is not supported by this version "
                              f"of flink-agents-replay (it reads versions {', '.join(map(str, _READABLE))})")
        plan.topic_ids.add(marker["topic_id"])
        for name, offset in marker["offsets"].items():
            partition = int(name)
            if partition in owned:
                plan.offsets[partition] = offset
                plan.barrier_ends[partition] = marker["ends"][name]
                plan.in_flight.update((digest, seq) for digest, seq in marker["in_flight"].get(name, []))
                fence = marker.get("fences", {}).get(name, 0)
                plan.fences[partition] = max(fence, plan.fences.get(partition, 0))
                for digest, first_seq in marker.get("replaying", {}).get(name, []):
                    plan.replaying[digest] = min(first_seq, plan.replaying.get(digest, first_seq))
        plan.replaying_since.update(marker.get("replaying_since", {}))
    return plan


class PruneTracker:
    """Markers of checkpoints in progress, and what completing one lets the journal delete."""

    def __init__(self) -> None:
        self._pending: dict[int, dict[int, int]] = {}
        self._pruned_to: dict[int, int] = {}

    def remember(self, checkpoint_id: int, marker: Mapping[int, int]) -> None:
        """Keep checkpoint ``checkpoint_id``'s marker until it completes or aborts."""
        self._pending[checkpoint_id] = dict(marker)

    def complete(self, checkpoint_id: int, low_watermarks: Mapping[int, int] | None = None) -> dict[int, int]:
        """Checkpoint done: return ``{partition: offset}`` to delete below (only what moved forward).

        Older pending markers are dropped with it. ``low_watermarks`` seeds what is already deleted, so
        the first prune of an attempt does not count records an earlier attempt deleted.
        """
        marker = self._pending.pop(checkpoint_id, None)
        for older in [c for c in self._pending if c < checkpoint_id]:
            del self._pending[older]
        if marker is None:
            return {}
        if low_watermarks:
            for partition, low in low_watermarks.items():
                self._pruned_to[partition] = max(self._pruned_to.get(partition, 0), low)
        deletions = {p: o for p, o in marker.items() if o > self._pruned_to.get(p, 0)}
        return deletions

    def pruned(self, deletions: Mapping[int, int]) -> int:
        """Record that ``deletions`` were made; return how many records they removed."""
        removed = sum(o - self._pruned_to.get(p, 0) for p, o in deletions.items())
        self._pruned_to.update(deletions)
        return removed

    def abort(self, checkpoint_id: int) -> None:
        """Checkpoint abandoned: forget its marker, delete nothing."""
        self._pending.pop(checkpoint_id, None)

    @property
    def seeded(self) -> bool:
        """Whether the already-deleted offsets are known."""
        return bool(self._pruned_to)
