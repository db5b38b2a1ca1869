"""The journal's side of Flink checkpoints, without Flink: restore, markers, pruning (docs/design.md §5.1, §7).

A subtask's :class:`JournalCheckpoints` owns its journal store and writer, the recovery index a restore
reads, and the prune tracker. The operator calls it at each checkpoint hook and passes plain values:

* :meth:`~JournalCheckpoints.restore` (``initialize_state``): combine the restored markers
  (:func:`~.markers.plan_restore`), check they were taken on this journal topic, apply the gap policy
  (records the checkpoint needs already deleted), and read the owned partitions into a
  :class:`~.index.RecoveryIndex`. Without a marker: :meth:`~JournalCheckpoints.start_without_checkpoint`
  (attempt records, :mod:`.attempts`).
* :meth:`~JournalCheckpoints.snapshot` (``snapshot_state``): wait for the records the barrier covers, then
  the marker: per owned partition the next offset, lowered to the first record of every run in flight and
  of every recovered history not yet replayed.
* :meth:`~JournalCheckpoints.completed` / :meth:`~JournalCheckpoints.aborted`: prune below the completed
  checkpoint's marker; an aborted one prunes nothing.
* :meth:`~JournalCheckpoints.expire_histories` (before each snapshot): a recovered history waits for its
  key's inputs to come back, and holds its partition's pruning back meanwhile. An input that never comes
  back (a non-replayable source, a changed filter, a processing-time window upstream) would hold it back
  forever; so a key's history that made no progress for ``history_expiry_s`` expires: it is dropped
  from the index, its records no longer lower the marker, and the next completed checkpoint prunes past
  them. Its clock starts at the restore and restarts each time one of its runs is applied; the markers
  carry it (``replaying_since``), so repeated failures do not keep a history alive. Never expired: keys
  with a run in flight (now, or at the restored checkpoint: their input is keyed state and will run).

A job that is never resumed from its own checkpoints (``resumable=False``: a replay, run again from the
production savepoint each time) restores from another journal, read only (``restore_from``), takes only
the records the savepoint's runs need, accepts what was pruned since, and writes no marker, prunes
nothing and writes no attempt records.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from flink_agents_replay.core.errors import JournalError, JournalGapError
from flink_agents_replay.storage.journal.attempts import begin_attempt, read_job_history
from flink_agents_replay.storage.journal.fencing import PartitionFences
from flink_agents_replay.storage.journal.index import KeyHistory, RecoveryIndex
from flink_agents_replay.storage.journal.markers import (
    PruneTracker,
    RestorePlan,
    build_marker,
    encode_marker,
    plan_restore,
)
from flink_agents_replay.storage.journal.recovery import read_recovery_index
from flink_agents_replay.storage.journal.store import JournalStore
from flink_agents_replay.storage.journal.transfer import moved_journal_refusal
from flink_agents_replay.storage.journal.writer import JournalWriter, RunJournal

__all__ = ["JournalCheckpoints", "RunInFlight", "describe_partitions"]

log = logging.getLogger("flink_agents_replay.operator")  # the operator's log lines, as tests and the demo read them


@dataclass(frozen=True)
class RunInFlight:
    """A run under way at a checkpoint: where its records go and which input it is."""

    group: int  # its key group = journal partition
    key_digest: str
    seq: int
    journal: RunJournal | None


class JournalCheckpoints:
    """One subtask's journal across checkpoints: its store and writer, the recovery index and pruning.

    Args:
        store: the journal this job writes (``None``: journal disabled; every hook is then a no-op).
        writer: the writer over ``store``.
        restore_from: the journal a restore reads; default ``store``. A replay reads production's, read only.
        owned: the journal partitions (key groups) this subtask owns.
        subtask: this subtask's index (for log lines).
        resumable: whether this job is resumed from its own checkpoints (markers, pruning, attempt records).
        accept_gap: restore even when records the checkpoint needs are gone (their actions run again).
        accept_moved_from: the topic id(s) of a journal moved here with its offsets kept (:mod:`.transfer`):
            markers of that id restore when every owned partition reaches their end offsets.
        continue_job: an earlier job whose records a start without checkpoint reuses (see :mod:`.attempts`).
        ack_timeout_s: bound on the flush at a snapshot and on a run's first acknowledged offset.
        history_expiry_s: how long a key's recovered history may make no progress before it expires.
    """

    def __init__(self, *, store: JournalStore | None, writer: JournalWriter | None, owned: range, subtask: int,
                 restore_from: JournalStore | None = None, resumable: bool = True, accept_gap: bool = False,
                 accept_moved_from: str | Sequence[str] | None = None, continue_job: str | None = None,
                 ack_timeout_s: float = 60.0, history_expiry_s: float = 1800.0):
        self.store = store
        self.writer = writer
        self.restore_from = restore_from if restore_from is not None or not resumable else store
        self.owned = owned
        self.subtask = subtask
        self.resumable = resumable
        self.accept_gap = accept_gap
        self.accept_moved_from = accept_moved_from
        self.continue_job = continue_job
        self.ack_timeout_s = ack_timeout_s
        self.index = RecoveryIndex()
        self.prunes = PruneTracker()
        self.restored = False  # True while recovered history is left to replay
        self.last_restore_ms: float | None = None
        self.earlier_attempt_records_ignored = 0  # fenced at this start (journal/fencing.py)
        self.other_key_records_skipped = 0  # other jobs' attempt records signed with another key (journal/attempts.py)
        self._known_ends: dict[int, int] = {}  # partition -> its end at the last snapshot (_barrier_ends)
        self._ends_seen: dict[int, int | None] = {}  # partition -> the acknowledged end _barrier_ends last took
        self.history_expiry_s = history_expiry_s
        self.waiting_since: dict[str, float] = {}  # key digest -> since when its history waits (epoch s)
        self.runs_restored_in_flight: set[str] = set()  # keys whose run was in flight at the restored checkpoint
        self.histories_expired = 0  # keys whose recovered history expired in this attempt

    # -- restore -----------------------------------------------------------------------------------
    def restore(self, marker_values: Iterable[bytes], *, job_id: str | None) -> None:
        """Find this subtask's offsets in the restored markers and read the journal from them; without a
        marker, :meth:`start_without_checkpoint` (a resumable job only)."""
        journal = self.restore_from
        if journal is None:
            return
        plan = plan_restore(marker_values, self.owned)
        if plan.fresh:
            if self.resumable:
                self.start_without_checkpoint(job_id)
            return
        begun = time.monotonic()
        offsets = self.check_topic_id(journal, plan, dict(plan.offsets))
        offsets = self._apply_gap_policy(journal, offsets)
        end = journal.end_offsets(offsets)
        # A replay takes only what the savepoint's runs in flight need, never production's later runs (design §9).
        keep = plan.needs if self.resumable else plan.needed_by_replay
        fences = PartitionFences(self.writer.codec, plan.fences, topic=journal.topic)

        def read_to_end() -> None:
            self.index = read_recovery_index(journal, self.writer.codec, offsets, end, keep=keep, fences=fences)

        def read_on(start) -> None:
            read_recovery_index(journal, self.writer.codec, start, journal.end_offsets(start), keep=keep,
                                fences=fences, index=self.index)

        if not self.resumable:
            read_to_end()
        else:  # every start fences the attempts before it, a restore too
            begin_attempt(self.writer, partitions=self.owned, job_id=job_id or "unknown", attempt=0,
                          subtask=self.subtask, read_so_far=end, read_first=read_to_end, read_on=read_on)
        self._fenced(fences)
        self.restored = True
        self._start_expiry_clocks(plan.replaying_since, {digest for digest, _ in plan.in_flight})
        self.last_restore_ms = (time.monotonic() - begun) * 1000
        log.info("subtask %d restored: read %d journal records for %d keys from partitions %s in %.2f s; "
                 "%d runs were in flight at the checkpoint", self.subtask, self.index.records_read, len(self.index),
                 describe_partitions(offsets), self.last_restore_ms / 1000, len(plan.in_flight))

    def check_topic_id(self, journal: JournalStore, plan: RestorePlan, offsets: dict[int, int]) -> dict[int, int]:
        """The offsets to read: ``offsets`` when the markers were taken on ``journal``'s topic; else refused
        (:class:`JournalGapError`), or, accepting a gap, nothing (read from the earliest records)."""
        if plan.topic_ids == {journal.topic_id}:
            return offsets
        refusal = self._moved_journal_refusal(journal, plan)
        if refusal is None:
            return offsets
        message = (f"the journal topic {journal.topic!r} is not the topic this checkpoint was taken with "
                   f"(topic id {journal.topic_id}, checkpoint: {sorted(plan.topic_ids)}): it was deleted and "
                   "recreated, so recorded actions are gone")
        if not self.accept_gap:
            raise JournalGapError(
                f"{message}; set accept_reexecution_after_gap=True to run them again. If the journal was moved to "
                "another Kafka cluster with `flink-agents-replay journal dump` and `journal load` (offsets kept), "
                f"set accept_moved_journal_from={sorted(plan.topic_ids)[0]!r} instead (now: {refusal})")
        log.warning("%s; running them again (accept_reexecution_after_gap)", message)
        return {}

    def _moved_journal_refusal(self, journal: JournalStore, plan: RestorePlan) -> str | None:
        """Why ``accept_moved_from`` does not let markers of another topic id restore; ``None`` when it does."""
        refusal = moved_journal_refusal(
            marker_topic_ids=plan.topic_ids, current_topic_id=journal.topic_id, accepted_from=self.accept_moved_from,
            marker_ends=plan.barrier_ends, current_ends=journal.end_offsets(self.owned), owned=self.owned)
        if refusal is None:
            log.info("subtask %d: accepted the moved journal %s (topic id %s -> %s, accept_moved_journal_from)",
                     self.subtask, journal.topic, ", ".join(sorted(plan.topic_ids)), journal.topic_id)
        return refusal

    def _apply_gap_policy(self, journal: JournalStore, offsets: dict[int, int]) -> dict[int, int]:
        """Refuse (or, accepting a gap, read from the earliest records) when needed records were deleted."""
        low = journal.start_offsets(offsets)
        gaps = {p: (offsets[p], low[p]) for p in offsets if offsets[p] < low[p]}
        if not gaps:
            return offsets
        message = _gap_message(gaps)
        if not self.accept_gap:
            raise JournalGapError(message + ". Actions in that gap would run again: set "
                                  "accept_reexecution_after_gap=True to accept that")
        log.warning("%s; reading from the earliest records (accept_reexecution_after_gap)", message)
        return {**offsets, **{p: low[p] for p in gaps}}

    def start_without_checkpoint(self, job_id: str | None) -> None:
        """No checkpoint: reuse what earlier attempts of this job wrote, if any; then mark this attempt's start.

        See :mod:`flink_agents_replay.storage.journal.attempts` for how records are tied to a job.
        """
        if job_id is None:
            log.warning("subtask %d: the job id is unknown here, so a restart before the first checkpoint will run "
                        "its inputs' calls again", self.subtask)
            return
        begun = time.monotonic()
        codec, job_ids = self.writer.codec, {job_id} | ({self.continue_job} if self.continue_job else set())
        fences = PartitionFences(codec, topic=self.store.topic)
        found = read_job_history(self.store, codec, self.owned, job_ids, fences=fences)
        attempt, restarted, starts = found.last_attempt + 1, found.found, dict(found.starts)
        begin_attempt(self.writer, partitions=self.owned, job_id=job_id, attempt=attempt, subtask=self.subtask,
                      read_so_far=found.ends, read_on=lambda start: read_job_history(
                          self.store, codec, self.owned, job_ids, fences=fences, start=start, history=found))
        self._fenced(fences)
        self._skipped_other_keys(found.other_key_records)
        if restarted:
            self.index = found.index
            self.restored = True
            self._start_expiry_clocks({}, set())
            self.last_restore_ms = (time.monotonic() - begun) * 1000
            log.info("subtask %d restored: read %d journal records for %d keys from partitions %s in %.2f s; job %s "
                     "restarted before its first completed checkpoint (attempt %d): the records of its earlier "
                     "attempts are reused", self.subtask, found.index.records_read - found.other_records,
                     len(found.index), describe_partitions(starts), self.last_restore_ms / 1000, job_id,
                     attempt)
        else:
            log.info("subtask %d: fresh start of job %s, no checkpoint and no earlier attempt in the journal "
                     "(partitions %s); %d records of earlier jobs are not reused", self.subtask, job_id,
                     describe_partitions(self.owned), found.other_records)

    def _skipped_other_keys(self, skipped: int) -> None:
        self.other_key_records_skipped = skipped
        if skipped:
            log.warning("subtask %d: %d attempt records of earlier jobs in partitions %s do not verify with this "
                        "job's signing key (an earlier job had another); this job reuses nothing of other jobs, so "
                        "they are skipped. To continue an earlier job (continue_job), give its key in "
                        "verification_keys", self.subtask, skipped, describe_partitions(self.owned))

    def _fenced(self, fences: PartitionFences) -> None:
        self.earlier_attempt_records_ignored = fences.ignored_total
        fences.report(self.subtask)

    # -- runs --------------------------------------------------------------------------------------
    def run_journal(self, group: int) -> RunJournal | None:
        """Where a new run of key group ``group`` journals (``None`` without a journal)."""
        return self.writer.run_journal(group) if self.writer is not None else None

    def history(self, key_digest: str) -> KeyHistory | None:
        """The key's recovered history while a restore replays, else ``None``."""
        return self.index.history(key_digest) if self.restored else None

    def run_applied(self, key_digest: str) -> bool:
        """A run of the key was applied: forget its replayed history; ``True`` when that was the last of
        the recovered journal (the restore is over)."""
        if not self.restored:
            return False
        self.runs_restored_in_flight.discard(key_digest)
        if key_digest in self.waiting_since:
            self.waiting_since[key_digest] = time.time()  # progress: the key's inputs are coming back
        self.index.forget_if_empty(key_digest)
        if len(self.index):
            return False
        self.restored = False
        return True

    # -- expiry of recovered histories ---------------------------------------------------------------
    def _start_expiry_clocks(self, since: dict[str, float], in_flight: set[str]) -> None:
        now = time.time()
        self.waiting_since = {digest: min(since.get(digest, now), now) for digest in self.index.digests()}
        self.runs_restored_in_flight = in_flight

    def expire_histories(self, runs_in_flight: Iterable[RunInFlight]) -> int:
        """Drop the recovered histories that made no progress for ``history_expiry_s`` (see the module
        docstring); return how many keys expired. Called on the task thread before a snapshot."""
        if not self.restored or not self.resumable:
            return 0
        busy = self.runs_restored_in_flight | {run.key_digest for run in runs_in_flight}
        deadline = time.time() - self.history_expiry_s
        stale = [d for d in self.index.digests() if d not in busy and self.waiting_since.get(d, 0.0) <= deadline]
        if not stale:
            return 0
        records = sum(self.index.drop(digest) for digest in stale)
        for digest in stale:
            self.waiting_since.pop(digest, None)
        self.histories_expired += len(stale)
        log.warning("subtask %d: the recovered history of %d key%s expired (%d records): none of their recorded "
                    "inputs came back for %.0f s (recovered_history_expiry_s); their records no longer hold "
                    "the journal's pruning back, and such an input that still comes back runs again",
                    self.subtask, len(stale), "" if len(stale) == 1 else "s", records, self.history_expiry_s)
        if not len(self.index):
            self.restored = False
            log.info("subtask %d: recovered journal fully replayed or expired", self.subtask)
        return len(stale)

    # -- checkpoints -------------------------------------------------------------------------------
    def snapshot(self, checkpoint_id: int, runs_in_flight: Iterable[RunInFlight], *,
                 checkpoint_time_ms: int | None = None, waits_open: Mapping[int, int] | None = None,
                 tools: Mapping[str, Mapping[str, str]] | None = None, lineage: str | None = None) -> bytes | None:
        """The recovery marker: per owned partition, the first offset a restore from here must read (and the
        checkpoint's trigger time, for the run epochs of a restore; ``tools``, the agent's tool digests, kept by
        subtask 0; the job ``lineage``, for traces)."""
        if self.store is None or not self.resumable:  # a replay is run again from the savepoint, not resumed
            return None
        ends = self._barrier_ends(self.writer.acknowledge_appended(self.ack_timeout_s))
        in_flight: dict[int, list[tuple[str, int]]] = {}
        firsts = []
        for run in runs_in_flight:
            in_flight.setdefault(run.group, []).append((run.key_digest, run.seq))
            if run.journal is not None and run.journal.first_delivery is not None:
                firsts.append((run.group, self._first_offset(run)))
        marker = build_marker(ends, firsts, self.index.floor_offsets())
        self.prunes.remember(checkpoint_id, marker)
        unreplayed = self.index.unreplayed()
        since = {digest: self.waiting_since[digest] for keys in unreplayed.values() for digest, _ in keys
                 if digest in self.waiting_since}
        return encode_marker(self.store.topic_id, self.subtask, marker, ends, in_flight, unreplayed,
                             fences=self.writer.fences, replaying_since=since, checkpoint_time_ms=checkpoint_time_ms,
                             waits_open=waits_open, tools=tools if self.subtask == 0 else None, lineage=lineage)

    def _first_offset(self, run: RunInFlight) -> int:
        """Where a restore must start reading to find every record of ``run`` (which wrote one at least). A first
        record acknowledged without an offset (a retried batch the broker already had) gives no place: then the
        partition's first offset still stored, so no record of the run is pruned (``JournalError`` if unknown)."""
        first = run.journal.first_offset(self.ack_timeout_s)
        if first is not None:
            return first
        low = self.store.start_offsets([run.group]).get(run.group, -1)
        if low < 0:
            raise JournalError(f"no offset for the first journal record of a run in flight in partition {run.group}, "
                               f"nor a first offset of the partition (Kafka answered {low}); this checkpoint fails")
        return low

    def _barrier_ends(self, written: Mapping[int, int | None]) -> dict[int, int]:
        """Each owned partition's end at the barrier: past the last record this attempt wrote there before it
        (``written``, acknowledged).

        The store is asked at the attempt's first snapshot, then only for a partition whose new acknowledged end
        cannot be trusted: none (acknowledged without an offset) or below the end already known (offsets only
        grow). Asking at every snapshot put a broker round trip (6-7 ms at the p50, up to 200 ms) on the task
        thread, with every wake-up waiting behind it (issue 33). Besides this attempt only a zombie writes to an
        owned partition, and fencing ignores its records.
        """
        ask = []
        for partition in self.owned:
            end = written.get(partition)
            unchanged = partition not in written or (end is not None and end == self._ends_seen.get(partition))
            if unchanged:  # nothing written there since the last snapshot (an unknown end is asked again)
                if partition not in self._known_ends:
                    ask.append(partition)
            elif end is not None and end >= self._known_ends.get(partition, end + 1):
                self._known_ends[partition] = self._ends_seen[partition] = end
            else:
                ask.append(partition)
        asked = self.store.end_offsets(ask) if ask else {}
        for partition, answer in asked.items():
            if answer >= 0:  # else kept out: build_marker refuses it below, and the next snapshot asks again
                self._known_ends[partition] = answer
                if partition in written:
                    self._ends_seen[partition] = written[partition]
        return {p: asked[p] if asked.get(p, 0) < 0 else self._known_ends.get(p, -1) for p in self.owned}

    def completed(self, checkpoint_id: int) -> int:
        """Delete the journal records this checkpoint made unnecessary; return how many."""
        if self.store is None or not self.resumable:
            return 0
        low = None if self.prunes.seeded else self.store.start_offsets(self.owned)
        deletions = self.prunes.complete(checkpoint_id, low)
        if not deletions:
            return 0
        self.store.delete_before(deletions)
        return self.prunes.pruned(deletions)

    def aborted(self, checkpoint_id: int) -> None:
        """An aborted checkpoint prunes nothing."""
        self.prunes.abort(checkpoint_id)

    def close(self) -> None:
        """Refuse further writes (runs abandoned on close may still run), release the store's clients."""
        if self.writer is not None:
            self.writer.close()
        try:
            if self.store is not None:
                self.store.close()
        finally:
            if self.writer is not None and self.writer.fence_watch is not None:
                self.writer.fence_watch.close()


def _gap_message(gaps: dict[int, tuple[int, int]]) -> str:
    shown = ", ".join(f"partition {p}: needs {o}, earliest {lw}" for p, (o, lw) in sorted(gaps.items())[:5])
    if any(needed < 0 for needed, _ in gaps.values()):
        # Versions before 0.6.0 could take librdkafka's -1001 (no offset, during a broker restart) for an end offset.
        return (f"this checkpoint's journal marker holds no offset ({shown}): it was taken by a version before "
                "0.6.0 while the broker restarted, so where its runs' records start is unknown. Restoring the "
                "latest checkpoint with accept_reexecution_after_gap=True reads from the earliest records and "
                "reuses every one still there")
    return (f"journal records this checkpoint needs were already deleted ({shown}); this happens when "
            "restoring an older savepoint after later checkpoints pruned the journal")


def describe_partitions(partitions: Iterable[int]) -> str:
    """Partitions for a log line: ``[0, 1, 2, 5]`` as ``"0-2,5"``."""
    spans: list[list[int]] = []
    for p in sorted(partitions):
        if spans and p == spans[-1][1] + 1:
            spans[-1][1] = p
        else:
            spans.append([p, p])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in spans) or "none"
