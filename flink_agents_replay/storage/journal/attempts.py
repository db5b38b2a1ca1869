"""Which journal records belong to *this* job: attempt records, for restarts before the first checkpoint.

A restore from a checkpoint finds its records through the checkpoint's markers (:mod:`.markers`). Before a
job's first checkpoint completes there is no marker, yet a restarted attempt would run every input since
the job started again: every call of every run repeated. With minute-long checkpoint intervals, or a
first checkpoint held up by backpressure, that is the common case.

So a subtask that starts with nothing to restore writes, and has acknowledged, an *attempt record* in
each journal partition it owns, before any run journals anything: ``{job id, attempt}``. The job id is
Flink's (the same for every attempt of a job, also across a JobManager failover with HA); the attempt
number is this package's own, one more than the highest found for the job, because Flink's attempt
numbers start again after a JobManager failover. The first attempt record of a job in a partition marks
where that job's history begins there.

On such a start a subtask reads its partitions from their earliest record:

* it finds attempt records of its own job: the job restarted before completing a checkpoint. Everything
  from the job's first attempt record on is its history and is reused exactly like records after a
  checkpoint's marker (in-flight runs, accepted order, divergence rules and all).
* it finds none: a brand-new job (a new job id). Records of earlier jobs are not reused (a new job is not
  a continuation of an old one unless it restores the old one's savepoint); the log says how many it
  passed over.

A job may also be told to continue an earlier job (``AgentConfig(continue_job=...)``): a job that used
up its restart attempts before its first checkpoint and is submitted again gets a new job id, and would
otherwise run every input of the old one again.

Limits, stated in the user guide: a stateless redeploy that keeps the job id (application mode with HA gives
its job a fixed id; redeployed after its HA data was removed, it starts without state under the same id)
counts as the same job and reuses its records; give the redeployed job another journal topic (or delete
the old one) to start from nothing.

Every start writes attempt records, not only a start without state: a restore from a checkpoint or a
savepoint, at any parallelism, writes them too, and they are the fences of :mod:`.fencing` (a record an older
attempt delivers after a newer attempt's record in the same partition is ignored). A start reads its
partitions first, then writes its records, then reads what arrived between the two (:func:`begin_attempt`),
so what it filed as history is what every later restore finds before its fence.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flink_agents_replay.core.errors import SignatureError
from flink_agents_replay.storage.journal.fencing import FENCING_MARKER_VERSION, PartitionFences, fence_of
from flink_agents_replay.storage.journal.index import RecoveryIndex
from flink_agents_replay.storage.journal.recovery import decode_attempt_record, parse_stored_key
from flink_agents_replay.storage.journal.store import JournalStore
from flink_agents_replay.storage.journal.writer import JournalWriter
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import ATTEMPT_ACTION, RecordKind

__all__ = ["ATTEMPT_ACTION", "JobHistory", "attempt_key", "begin_attempt", "read_job_history",
           "write_attempt_records"]

log = logging.getLogger(__name__)

_ATTEMPT_DIGEST = "_job"
_VERSION = FENCING_MARKER_VERSION  # 1: before fencing (no "fences" field)


def attempt_key(partition: int, job_id: str) -> bytes:
    """The Kafka record key of an attempt record (seq 0: before every input of every key)."""
    return f"{partition}:0:{job_id}:{ATTEMPT_ACTION}:{_ATTEMPT_DIGEST}".encode()


@dataclass
class JobHistory:
    """What the owned partitions hold of one job: its records, where they begin, and its last attempt."""

    index: RecoveryIndex
    starts: dict[int, int] = field(default_factory=dict)  # partition -> offset of the job's first attempt record
    last_attempt: int = -1
    other_records: int = 0  # records of other jobs (or before this job started) passed over
    other_key_records: int = 0  # attempt records of other jobs signed with another key, skipped (see _note_attempt)
    ends: dict[int, int] = field(default_factory=dict)  # partition -> where the read ended

    @property
    def found(self) -> bool:
        """Whether any owned partition holds records of this job (a restart before its first checkpoint)."""
        return bool(self.starts)


def read_job_history(store: JournalStore, codec: RecordCodec, partitions: Iterable[int],
                     job_ids: Iterable[str], *, fences: PartitionFences | None = None,
                     start: Mapping[int, int] | None = None, history: JobHistory | None = None) -> JobHistory:
    """Read ``partitions`` from their earliest record; index what was written from the first attempt record of
    any of ``job_ids`` (this job, and an earlier one it continues) on, except what ``fences`` ignores.

    ``start`` and ``history`` continue an earlier read (from its ``ends``) into the same history."""
    job_ids = set(job_ids)
    partitions = list(partitions)
    fences = fences or PartitionFences(codec, topic=store.topic)
    start = store.start_offsets(partitions) if start is None else dict(start)
    end = store.end_offsets(partitions)
    history = JobHistory(RecoveryIndex(codec, topic=store.topic)) if history is None else history
    for stored in store.read(start, end):
        history.index.records_read += 1
        _, _, event, action, digest_of_key = parse_stored_key(stored)
        if action == ATTEMPT_ACTION:
            _note_attempt(history, fences, codec, store.topic, stored, event in job_ids)
        elif stored.partition not in history.starts:
            history.other_records += 1
        elif fences.admits(stored):
            history.index.add_raw(digest_of_key, stored)
    history.ends.update(end)
    return history


def _note_attempt(history: JobHistory, fences: PartitionFences, codec: RecordCodec, topic: str, stored,
                  ours: bool) -> None:
    try:
        payload = decode_attempt_record(codec, stored, topic=topic)
    except SignatureError:
        if ours:  # this job's own start that does not verify: tampering, or a key changed under a job
            raise
        # Another job's start, signed with that job's key (a new job may have a new one): nothing of it is this
        # job's history, so skipping it uses nothing unverified. That job's other records before this job's
        # start are passed over unread (other_records).
        history.other_key_records += 1
        return
    fences.note_marker(stored, payload)  # any job's: a zombie of an earlier job is fenced too
    if ours:
        history.starts.setdefault(stored.partition, stored.offset)
        history.last_attempt = max(history.last_attempt, int(payload["attempt"]))


def write_attempt_records(writer: JournalWriter, partitions: Iterable[int], job_id: str, attempt: int,
                          subtask: int) -> dict[int, int]:
    """Write and acknowledge one attempt record per partition, before any run of this attempt journals; from
    then on ``writer`` stamps this attempt's fences on its records. Returns them (partition -> fence).

    With a fence watch, the start's fence record is written and acknowledged first (:func:`_announce`)."""
    partitions = list(partitions)
    _announced(writer, _announce(writer, partitions, job_id, subtask))
    return _await_fences(writer, _produce_attempt_records(writer, partitions, job_id, attempt, subtask))


def _announce(writer: JournalWriter, partitions: list[int], job_id: str, subtask: int) -> Any:
    """Write this start's record in the fence topic (:mod:`.fence_watch`), if the writer has one: it must be
    acknowledged before the journal attempt records are written (the order the fence check relies on)."""
    watch = writer.fence_watch
    if watch is None:
        return None
    writer.store.prepare_writes()  # the journal's producer connects while the fence record travels
    return watch.announce(partitions, job_id=job_id, subtask=subtask)


def _announced(writer: JournalWriter, delivery: Any) -> None:
    if delivery is not None:
        writer.fence_watch.announced(delivery)


def _produce_attempt_records(writer: JournalWriter, partitions: Iterable[int], job_id: str, attempt: int,
                             subtask: int) -> list[tuple[int, Any]]:
    deliveries = []
    for partition in partitions:
        key = attempt_key(partition, job_id)
        payload = {"version": _VERSION, "job_id": job_id, "attempt": attempt, "subtask": subtask, "fences": True}
        value = writer.encode(key, RecordKind.ATTEMPT, payload, partition=partition, fingerprint="",
                              what="an attempt record")
        deliveries.append((partition, writer.append(partition, key, value, "an attempt record")))
    return deliveries


def _await_fences(writer: JournalWriter, deliveries: list[tuple[int, Any]]) -> dict[int, int]:
    fences = {partition: fence_of(delivery.wait(writer.ack_timeout_s)) for partition, delivery in deliveries}
    writer.begin_attempt(fences)
    log.debug("wrote attempt records to %d partitions", len(fences))
    return fences


def begin_attempt(writer: JournalWriter, *, partitions: Iterable[int], job_id: str, attempt: int, subtask: int,
                  read_so_far: Mapping[int, int], read_on: Callable[[Mapping[int, int]], None],
                  read_first: Callable[[], None] | None = None) -> dict[int, int]:
    """Write this attempt's records (:func:`write_attempt_records`), then ``read_on(read_so_far)``: the reader
    continues from where the first read ended, past this attempt's own markers, so records that arrived in
    between are history (before the fence) and a zombie's after them are ignored. When every marker landed
    where the first read ended, nothing arrived in between and the second read (a consumer's start-up, most
    of a restore's time on a small journal) is skipped.

    ``read_first``: the first read (up to ``read_so_far``, taken before), run while the markers are on their
    way: a new producer's first acknowledged write and a consumer's start-up each take about half a second. With a
    fence watch, the start's fence record is on its way then, and the attempt records follow its acknowledgement."""
    partitions = list(partitions)
    announced = _announce(writer, partitions, job_id, subtask)
    if announced is None:
        deliveries = _produce_attempt_records(writer, partitions, job_id, attempt, subtask)
    if read_first is not None:
        read_first()
    if announced is not None:
        _announced(writer, announced)
        deliveries = _produce_attempt_records(writer, partitions, job_id, attempt, subtask)
    fences = _await_fences(writer, deliveries)
    if any(read_so_far.get(partition) != fence - 1 for partition, fence in fences.items()):  # marker offsets
        read_on(dict(read_so_far))
    return fences
