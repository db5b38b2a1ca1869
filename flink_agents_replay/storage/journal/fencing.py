"""Fencing of earlier attempts: a record of an older attempt never wins over a newer attempt's history.

When Flink loses a TaskManager it restarts the subtasks elsewhere, but the old process may live on (a
network partition, a process paused and resumed, a JVM stuck in GC). Its runs go on calling services and
its producer goes on delivering journal records, also *after* the new attempt has read its partitions. A
later restore would then file those late records as history and reuse them: results the new attempt
never saw, maybe for seqs it ran differently.

So every start of a subtask (fresh, restarted before a checkpoint, restored from a checkpoint or a
savepoint, at any parallelism, under any job id) writes an acknowledged *attempt marker* in each journal
partition it owns before it journals anything (:func:`~.attempts.write_attempt_records`). The attempt's
number in a partition — its *fence* — is that marker's offset + 1, and every record the attempt writes there
carries it (header ``att``, :meth:`RecordCodec.encode`). Offsets only grow, so a later start always gets a
higher fence in every partition it owns, without reading anything, and whatever was pruned: fences need no
counter that survives deletions, job ids or rescaling (a partition's owners come and go; its offsets stay).

Readers walk a partition in offset order and keep the highest fence seen so far. A record whose ``att`` is
below the fence in force at its offset was written by an attempt older than a marker that precedes it: a
zombie's late delivery. It is ignored, counted and logged. Records an older attempt wrote *before* the newer
marker are its legitimate history and stay (the newer attempt may even be replaying them). A restore that
starts reading after the fencing marker gets the fence from the checkpoint's recovery marker
(:func:`~.markers.encode_marker` keeps the snapshotting attempt's fences), in force from the marker's offset
on. Records of versions without ``att`` count as attempt 0; attempt markers of those versions do not fence.

What these fences cannot do: stop a zombie calling services. :mod:`.fence_watch` does that for external calls
(every start also names its partitions in the journal's fence topic, and an external call asks the broker for it
after its started record's acknowledgement); the operator's task-stop signal stops the rest. Calls a zombie made
carry the same call ids as the new attempt's (ids name the request, docs/design.md §6.5). And a zombie paused
inside its own start, between writing its marker and its acknowledgement, whose marker lands after a newer
attempt's, looks newer: the window is a produce round trip, and Flink cancels such a task as soon as the process
answers again.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping

from flink_agents_replay.storage.journal.store import StoredRecord
from flink_agents_replay.storage.records.codec import RecordCodec

__all__ = ["FENCING_MARKER_VERSION", "PartitionFences", "fence_of"]

log = logging.getLogger("flink_agents_replay.operator")  # the operator's log lines, as tests read them

#: Attempt-record payload version from which an attempt record is a fence (payload ``"fences": True``).
FENCING_MARKER_VERSION = 2


def fence_of(marker_offset: int) -> int:
    """The fence of an attempt whose marker sits at ``marker_offset`` (0 is kept for "no attempt number")."""
    return marker_offset + 1


class PartitionFences:
    """The fences in force while a read walks partitions in offset order, and the records they ignored.

    Args:
        codec: verifies an ignored record (a tampered one raises instead of vanishing) ...
        topic: ... as a record of this topic.
        carried: per partition, the fence the restored checkpoint's attempt held there; in force from its
            marker's offset on, also when the read starts after that marker.
    """

    def __init__(self, codec: RecordCodec, carried: Mapping[int, int] | None = None, *, topic: str) -> None:
        self._codec = codec
        self._topic = topic
        self._carried = dict(carried or {})
        self._seen: dict[int, int] = {}  # partition -> the highest fence of a marker read so far
        self.ignored: Counter[int] = Counter()  # partition -> records of an earlier attempt ignored

    def note_marker(self, stored: StoredRecord, payload: Mapping) -> None:
        """An attempt record was read: from here on its fence is in force in its partition."""
        if int(payload.get("version", 1)) >= FENCING_MARKER_VERSION and payload.get("fences"):
            fence = fence_of(stored.offset)
            self._seen[stored.partition] = max(self._seen.get(stored.partition, 0), fence)

    def fence_at(self, partition: int, offset: int) -> int:
        """The fence in force for a record at ``offset`` (0: none)."""
        fence = self._seen.get(partition, 0)
        carried = self._carried.get(partition, 0)
        if carried and offset >= carried:  # after the carried marker (at carried - 1)
            fence = max(fence, carried)
        return fence

    def admits(self, stored: StoredRecord) -> bool:
        """Whether a (non-attempt) record belongs to history: not a late record of an attempt a marker before
        it superseded. An ignored record is verified first and counted."""
        fence = self.fence_at(stored.partition, stored.offset)
        if not fence:
            return True
        header = RecordCodec.peek_header(stored.value)
        if header is None or int(header.get("att", 0)) >= fence:
            return True  # not a record of ours is refused when its key replays, as before
        self._codec.verify(stored.key, stored.value, topic=self._topic, partition=stored.partition,
                           where=f"partition {stored.partition} offset {stored.offset}")
        self.ignored[stored.partition] += 1
        return False

    @property
    def ignored_total(self) -> int:
        """Records of an earlier attempt ignored in this read."""
        return sum(self.ignored.values())

    def report(self, subtask: int) -> None:
        """Log what was ignored (nothing when nothing was)."""
        if self.ignored_total:
            shown = ", ".join(f"{p}: {n}" for p, n in sorted(self.ignored.items())[:8])
            log.warning("subtask %d: %d records of an earlier attempt ignored (written after a newer attempt's "
                        "marker: a zombie's late delivery; per partition %s)", subtask, self.ignored_total, shown)
