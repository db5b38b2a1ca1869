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

Limits, stated in the README: a stateless redeploy that keeps the job id (application mode with HA gives
its job a fixed id; redeployed after its HA data was removed, it starts without state under the same id)
counts as the same job and reuses its records; give the redeployed job another journal topic (or delete
the old one) to start from nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from flink_agents_replay.errors import SignatureError
from flink_agents_replay.journal.index import RecoveryIndex
from flink_agents_replay.journal.recovery import parse_stored_key
from flink_agents_replay.journal.store import JournalStore
from flink_agents_replay.journal.writer import JournalWriter
from flink_agents_replay.records.codec import RecordCodec
from flink_agents_replay.records.journal import ATTEMPT_ACTION, RecordKind

__all__ = ["ATTEMPT_ACTION", "JobHistory", "attempt_key", "read_job_history", "write_attempt_records"]

log = logging.getLogger(__name__)

_ATTEMPT_DIGEST = "_job"
_VERSION = 1


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

    @property
    def found(self) -> bool:
        """Whether any owned partition holds records of this job (a restart before its first checkpoint)."""
        return bool(self.starts)


def read_job_history(store: JournalStore, codec: RecordCodec, partitions: Iterable[int],
                     job_ids: Iterable[str]) -> JobHistory:
    """Read ``partitions`` from their earliest record; index what was written from the first attempt record of
    any of ``job_ids`` (this job, and an earlier one it continues) on."""
    job_ids = set(job_ids)
    partitions = list(partitions)
    start = store.start_offsets(partitions)
    end = store.end_offsets(partitions)
    history = JobHistory(RecoveryIndex(codec, topic=store.topic))
    for stored in store.read(start, end):
        history.index.records_read += 1
        _, _, event, action, digest_of_key = parse_stored_key(stored)
        if action == ATTEMPT_ACTION:
            if event in job_ids:
                _note_attempt(history, codec, store.topic, stored)
            continue
        if stored.partition in history.starts:
            history.index.add_raw(digest_of_key, stored)
        else:
            history.other_records += 1
    return history


def _note_attempt(history: JobHistory, codec: RecordCodec, topic: str, stored) -> None:
    record = codec.decode(stored.key, stored.value, topic=topic, partition=stored.partition,
                          where=f"partition {stored.partition} offset {stored.offset}")
    if record.kind != RecordKind.ATTEMPT.value:
        raise SignatureError(f"journal record at partition {stored.partition} offset {stored.offset} has an attempt "
                             f"key but kind {record.kind!r}")
    history.starts.setdefault(stored.partition, stored.offset)
    history.last_attempt = max(history.last_attempt, int(record.payload["attempt"]))


def write_attempt_records(writer: JournalWriter, partitions: Iterable[int], job_id: str, attempt: int,
                          subtask: int) -> None:
    """Write and acknowledge one attempt record per partition, before any run of this attempt journals."""
    partitions = list(partitions)
    deliveries = []
    for partition in partitions:
        key = attempt_key(partition, job_id)
        payload = {"version": _VERSION, "job_id": job_id, "attempt": attempt, "subtask": subtask}
        value = writer.encode(key, RecordKind.ATTEMPT, payload, partition=partition, fingerprint="",
                              what="an attempt record")
        deliveries.append(writer.append(partition, key, value, "an attempt record"))
    for delivery in deliveries:
        delivery.wait(writer.ack_timeout_s)
    log.debug("wrote attempt %d records of job %s to %d partitions", attempt, job_id, len(partitions))
