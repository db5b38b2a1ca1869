"""Fenced attempts make no new external call: the broker says when a newer attempt started (docs/design.md §5.3).

Journal fencing (:mod:`.fencing`) keeps a zombie's late records out of history, but a zombie (an older attempt of a
subtask whose process lives on after Flink restored the task elsewhere: a paused or partitioned TaskManager) still
*acts*: it goes on making calls, and a service that does not deduplicate by call id takes their effects twice. Its
own task's state cannot tell it about a restore on another TaskManager, and timing cannot either. The broker can:

* Every journal has a **fence topic**, ``<journal>.fences`` (one partition, created with the journal topic). Every
  start of a subtask first writes one record there naming the journal partitions it now owns, and has it
  acknowledged (:meth:`FenceWatch.announce`), *then* writes its attempt records in those partitions
  (:func:`~.attempts.begin_attempt`).
* Before an ``external`` call, its *started* record is acknowledged (``must_ack``). Then, before the call is made,
  the attempt asks the broker for the fence topic's end (one ListOffsets round trip on a consumer kept open per
  subtask, :meth:`FenceWatch.check`). If the end moved since what this attempt last read (its own fence record at
  first), it reads the new fence records. One that names a partition of this attempt is a newer start: the attempt
  is *fenced*. The call is not made (:class:`AttemptFencedError`, logged once, counted in :attr:`FenceWatch.refused`)
  and the writer refuses every later record, so no further call of the attempt gets past its started record.

Why it holds (acks=all, the high watermark): the end the broker reports is its high watermark, and an acknowledged
record lies below it. If the check did not see a newer start's fence record F, F was not yet acknowledged when the
broker answered; the newer start writes its journal attempt record A only after F's acknowledgement, so A comes
after the call's started record S (acknowledged before the check was asked) in the partition. The newer attempt
reads S before its fence: the call is *in doubt* there, exactly as after a crash during the call, and its in-doubt
policy decides (the call under way "may finish"). If the check saw F, the call is not made: S is in doubt to the
newer attempt (before A) or a zombie's late record (after A, ignored); either way one attempt makes it at most once.

Concurrent checks share round trips (group commit): a check waits for the next query that *starts* after it
arrived, so one ListOffsets answers every check waiting meanwhile, and none is answered by a query older than its
started record's acknowledgement.

Fence records are JSON with a ``"version"`` (:func:`encode_fence`); a reader keeps reading ``partitions`` in a
later version. One that cannot be read at all fences every partition (a zombie must never guess it is not one).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from flink_agents_replay.core.errors import AttemptFencedError, JournalClosedError, JournalError
from flink_agents_replay.integrations.kafka.settings import KafkaSettings, KafkaSettingsLike
from flink_agents_replay.integrations.kafka.store import KafkaTopicStore, TopicDelivery
from flink_agents_replay.integrations.kafka.topics import FENCES

__all__ = ["FENCE_RECORD_VERSION", "FENCE_TOPIC_SUFFIX", "AttemptFencedError", "FenceWatch", "decode_fence",
           "encode_fence", "fence_topic_of"]

log = logging.getLogger("flink_agents_replay.operator")  # the operator's log lines, as tests read them

FENCE_TOPIC_SUFFIX = ".fences"
#: Version of a fence record (JSON): ``{"version", "journal", "job_id", "subtask", "partitions", "time_ms"}``.
FENCE_RECORD_VERSION = 1
_ALL = ((0, 1 << 62),)  # what a fence record that cannot be read names: every partition


def fence_topic_of(journal_topic: str) -> str:
    """The fence topic of ``journal_topic``."""
    return journal_topic + FENCE_TOPIC_SUFFIX


def _ranges(partitions: Iterable[int]) -> list[list[int]]:
    """Sorted partitions as ``[start, end)`` ranges (a subtask owns one contiguous range of key groups)."""
    ranges: list[list[int]] = []
    for partition in sorted(set(partitions)):
        if ranges and ranges[-1][1] == partition:
            ranges[-1][1] = partition + 1
        else:
            ranges.append([partition, partition + 1])
    return ranges


def encode_fence(*, journal: str, job_id: str, subtask: int, partitions: Iterable[int]) -> bytes:
    """A fence record: the start of ``subtask`` of job ``job_id`` owns ``partitions`` of ``journal`` from now on."""
    return json.dumps({"version": FENCE_RECORD_VERSION, "journal": journal, "job_id": job_id, "subtask": subtask,
                       "partitions": _ranges(partitions), "time_ms": int(time.time() * 1000)},
                      separators=(",", ":")).encode()


def decode_fence(value: bytes | None) -> dict[str, Any]:
    """A fence record's fields, ``partitions`` as ``(start, end)`` ranges; a record that cannot be read names every
    partition (``"unreadable": True``)."""
    try:
        data = json.loads(value or b"")
        ranges = tuple((int(start), int(end)) for start, end in data["partitions"])
        return {**data, "partitions": ranges}
    except (ValueError, TypeError, KeyError) as exc:
        return {"partitions": _ALL, "unreadable": f"{type(exc).__name__}: {exc}"}


def _overlap(ranges: Iterable[tuple[int, int]], others: Iterable[tuple[int, int]]) -> bool:
    """Whether two sets of ``[start, end)`` ranges share a partition."""
    others = tuple(others)
    return any(start < other_end and other_start < end for start, end in ranges for other_start, other_end in others)


class FenceWatch:
    """One subtask's fence: its record in the fence topic, and the check before each external call.

    Args:
        settings: the user's Kafka settings.
        journal_topic: the journal; its fence topic is ``<journal>.fences``.
        create_topic: create the fence topic if missing (else a missing one is an error).
        replication_factor: for a created fence topic (default: the broker's default; give the journal's).
        timeout_s: bound on start-up requests and on each check's query.
        ack_timeout_s: how long the fence record's acknowledgement is waited for.
        journal_store: the journal's store, whose producer writes the fence record (one producer less per
            subtask); without it the watch makes its own.
    """

    def __init__(self, settings: KafkaSettingsLike | Mapping[str, Any], journal_topic: str, *,
                 create_topic: bool = True, replication_factor: int | None = None, timeout_s: float = 30.0,
                 ack_timeout_s: float = 60.0, journal_store: KafkaTopicStore | None = None) -> None:
        self.settings = KafkaSettings.of(settings)
        self.journal_topic = journal_topic
        self.topic = fence_topic_of(journal_topic)
        self.timeout_s = timeout_s
        self.ack_timeout_s = ack_timeout_s
        self._own_store: KafkaTopicStore | None = None
        if journal_store is None:
            self._own_store = KafkaTopicStore(settings=self.settings, topic=self.topic, partitions=1, role=FENCES,
                                              create_topic=create_topic, replication_factor=replication_factor,
                                              timeout_s=timeout_s, ack_timeout_s=ack_timeout_s)
        else:  # created and checked like a store's topic (one partition, no compaction), written by the journal's
            journal_store.admin.prepare_topic(self.topic, 1, role=FENCES, create=create_topic,
                                              replication_factor=replication_factor)
        self._producer_store: KafkaTopicStore = journal_store or self._own_store
        self._consumer: Consumer | None = None
        self._tp = TopicPartition(self.topic, 0)
        self._mine: tuple[tuple[int, int], ...] = ()
        self._own_offset: int | None = None
        self._seen: int | None = None  # the next fence-topic offset not yet read (None: not announced)
        self.subtask = -1
        #: The newer start that fenced this attempt (its record's fields and offset), once one did.
        self.fenced_by: dict[str, Any] | None = None
        #: External calls refused because the attempt was fenced.
        self.refused = 0
        self.checks = 0  # checks made (each waited for a query that started after it)
        self.queries = 0  # ListOffsets round trips made (concurrent checks share them)
        self._cond = threading.Condition()
        self._started = 0  # queries started
        self._finished = 0  # queries finished (one at a time: the last started)
        self._in_flight = False
        self._error: BaseException | None = None  # the last finished query's failure
        self._closed = False

    # -- the start ---------------------------------------------------------------------------------
    def announce(self, partitions: Iterable[int], *, job_id: str, subtask: int) -> TopicDelivery:
        """Write this start's fence record (asynchronously); :meth:`announced` waits for it. The attempt's journal
        attempt records must wait until then."""
        partitions = list(partitions)
        self._mine = tuple((start, end) for start, end in _ranges(partitions))
        self.subtask = subtask
        value = encode_fence(journal=self.journal_topic, job_id=job_id, subtask=subtask, partitions=partitions)
        return self._producer_store.append_to(self.topic, 0, f"{job_id}:{subtask}".encode(), value)

    def announced(self, delivery: TopicDelivery) -> int:
        """Wait for the fence record's acknowledgement: from its offset on, a fence record naming a partition of ours
        is a newer start. Returns the offset."""
        offset = delivery.wait(self.ack_timeout_s)
        with self._cond:
            self._own_offset = offset
            self._seen = offset + 1
        log.debug("subtask %d: fence record at %s offset %d", self.subtask, self.topic, offset)
        # The check's consumer connects now, off the start's path: the first external call does not pay for it.
        threading.Thread(target=self._warm_up_quietly, name=f"fence-watch-{self.subtask}", daemon=True).start()
        return offset

    # -- the check ---------------------------------------------------------------------------------
    @property
    def fenced(self) -> bool:
        """Whether a newer start on a partition of this attempt was seen: it makes no further call."""
        return self.fenced_by is not None

    def refuse_if_fenced(self, what: str) -> None:
        """Raise :class:`AttemptFencedError` if this attempt was fenced (a record it would write: refused)."""
        if self.fenced_by is not None:
            raise AttemptFencedError(f"{what} was not journaled: {self._describe()}")

    def check(self, partition: int, what: str = "an external call") -> None:
        """Before an external call whose started record in ``partition`` is acknowledged: ask the broker whether a
        newer attempt started on a partition of ours since; :class:`AttemptFencedError` (the call must not be made)
        if one did. One round trip, shared with the checks waiting at the same time."""
        if self._seen is None:
            return  # no fence record of ours (a replay, or a store without a fence topic): nothing to compare with
        self.checks += 1
        if self.fenced_by is None:
            self._await_fresh_query()
        if self.fenced_by is not None:
            self._refuse(partition, what)

    def _refuse(self, partition: int, what: str) -> None:
        with self._cond:
            self.refused += 1
            first = self.refused == 1
        message = (f"an external call was not made ({what}, journaled as started in partition {partition}): "
                   f"{self._describe()}; this attempt makes no further call")
        if first:
            log.warning("subtask %d: %s", self.subtask, message)
        raise AttemptFencedError(message)

    def _describe(self) -> str:
        by = self.fenced_by or {}
        if by.get("unreadable"):
            return (f"fence record at {self.topic} offset {by.get('offset')} could not be read ({by['unreadable']}); "
                    "this attempt takes it for a newer attempt's start")
        if by.get("deleted"):
            return (f"fence records of {self.topic} below offset {by.get('offset')} were deleted before this attempt "
                    "read them; it takes them for a newer attempt's start")
        return (f"a newer attempt of this task started (job {by.get('job_id')} subtask {by.get('subtask')}, fence "
                f"record at {self.topic} offset {by.get('offset')}): Flink restored it elsewhere, this attempt is a "
                "zombie")

    def _await_fresh_query(self) -> None:
        """Wait for a query of the fence topic that starts after now (making it if none is under way)."""
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            if self._closed:
                raise JournalClosedError(f"an external call was not made: the subtask closed its fence watch "
                                         f"({self.topic})")
            need = self._started + 1  # the one under way, if any, started before this check
            while self._finished < need:
                if not self._in_flight:
                    self._started += 1
                    self._in_flight = True
                    break
                if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                    raise JournalError(f"the fence check of {self.topic} did not finish within {self.timeout_s:.0f} s")
            else:
                if self._error is not None:
                    raise JournalError(f"could not check {self.topic} for a newer attempt: {self._error}")
                return
        error: BaseException | None = None
        try:
            self._query()
        except BaseException as exc:  # noqa: BLE001 - handed to the checks waiting for this query, then raised
            error = exc
        with self._cond:
            self._finished = self._started
            self._in_flight = False
            self._error = error
            self._cond.notify_all()
        if error is not None:
            if isinstance(error, JournalError):
                raise error
            raise JournalError(f"could not check {self.topic} for a newer attempt: {error}") from error

    def _query(self) -> None:
        """One ListOffsets round trip; then the new fence records, if the end moved (one thread at a time)."""
        consumer = self._get_consumer()
        self.queries += 1
        try:
            low, high = consumer.get_watermark_offsets(self._tp, timeout=self.timeout_s, cached=False)
        except KafkaException as exc:
            raise JournalError(f"could not ask {self.topic} for its end: {exc.args[0]}") from None
        seen = self._seen
        assert seen is not None
        if high <= seen:
            return
        if low > seen:
            self.fenced_by = {"offset": low, "deleted": True}
            return
        for offset, value in self._read(consumer, seen, high):
            fence = decode_fence(value)
            if fence.get("journal", self.journal_topic) != self.journal_topic:
                continue
            if _overlap(fence["partitions"], self._mine):
                self.fenced_by = {**fence, "offset": offset}
                break
        self._seen = high

    def _read(self, consumer: Consumer, start: int, end: int) -> list[tuple[int, bytes | None]]:
        consumer.assign([TopicPartition(self.topic, 0, start)])
        found: list[tuple[int, bytes | None]] = []
        deadline = time.monotonic() + self.timeout_s
        try:
            while start < end:
                message = consumer.poll(min(0.5, max(0.0, deadline - time.monotonic())))
                if message is None:
                    if time.monotonic() > deadline:
                        raise JournalError(f"reading {self.topic} from offset {start} to {end} stalled")
                    continue
                if message.error():
                    raise JournalError(f"reading {self.topic} failed: {message.error()}")
                if message.offset() >= start:
                    found.append((message.offset(), message.value()))
                    start = message.offset() + 1
        finally:
            consumer.unassign()
        return found

    def _get_consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(self.settings.reader_config(purpose="fences"))
        return self._consumer

    def _warm_up_quietly(self) -> None:
        """Connect the check's consumer with one query (its first check would otherwise pay the connection); a
        failure here is the next check's to meet."""
        try:
            self._await_fresh_query()
        except Exception as exc:  # noqa: BLE001 - a check asks again
            log.debug("fence watch warm-up of %s: %s", self.topic, exc)

    def close(self) -> None:
        """Release the clients, once the query under way (if any) is over; a check after this fails."""
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: not self._in_flight, self.timeout_s)
            consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()
        if self._own_store is not None:
            self._own_store.close()
