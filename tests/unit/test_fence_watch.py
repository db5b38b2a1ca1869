"""Fenced attempts make no new external call, enforced by the broker (issue 36, docs/design.md §5.3).

A zombie (an older attempt whose process lives on after Flink restored its task elsewhere) must not make a new
``external`` call once a newer attempt started on its partitions. Every start writes an acknowledged record to
the journal's fence topic (``<journal>.fences``) naming the partitions it now owns, before its journal attempt
records; an external call's started record is acknowledged, then the attempt asks the broker for the fence
topic's end and reads what is new: a newer start naming the call's partition refuses the call.

Real broker (the session's ``kafka_bootstrap``), real journal and fence topics; the older and the newer attempt
are two writers in this process, exactly what a paused-and-resumed TaskManager's producer is next to the
restored one. The call functions count their calls.
"""

from __future__ import annotations

import threading
import uuid

import pytest

from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action
from flink_agents_replay.api.resources import Tool
from flink_agents_replay.engine import RunInput, execute_run
from flink_agents_replay.storage.journal.attempts import read_job_history, write_attempt_records
from flink_agents_replay.storage.journal.fence_watch import (
    AttemptFencedError,
    FenceWatch,
    decode_fence,
    encode_fence,
    fence_topic_of,
)
from flink_agents_replay.storage.journal.fencing import PartitionFences
from flink_agents_replay.storage.journal.kafka_store import KafkaJournalStore
from flink_agents_replay.storage.journal.writer import Durability, JournalWriter
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import CallOutcome, key_digest

SIGNING_KEY = b"0123456789abcdef0123"
GROUP = 1


class Pay(Agent):
    """Two external calls in a row: ``charge`` then ``notify``."""

    @action(InputEvent)
    def pay(event, ctx):
        charged = ctx.call("charge", event.input)
        ctx.send_event(OutputEvent(output=ctx.call("notify", charged)))


class Calls:
    def __init__(self, during_charge=None):
        self.charge = self.notify = 0
        self.during_charge = during_charge

    def agent(self) -> Pay:
        def charge(amount):
            self.charge += 1
            if self.during_charge is not None:
                self.during_charge()  # the call is under way: a newer attempt starts meanwhile
            return f"charged {amount}"

        def notify(text):
            self.notify += 1
            return f"sent {text}"

        return Pay(resources={"charge": Tool(charge, side_effects="external"),
                              "notify": Tool(notify, side_effects="external")})


@pytest.fixture
def journal(kafka_bootstrap):
    """A fresh journal topic (4 partitions) and a factory of attempts on it: (writer, fence watch) pairs."""
    topic = f"fence-test-{uuid.uuid4().hex[:10]}"
    settings = {"bootstrap.servers": kafka_bootstrap}
    opened = []

    def attempt(partitions=(0, 1, 2, 3), job_id="job", subtask=0) -> JournalWriter:
        store = KafkaJournalStore(settings, topic, 4, timeout_s=20, ack_timeout_s=20)
        watch = FenceWatch(settings, topic, timeout_s=20, ack_timeout_s=20, journal_store=store)
        writer = JournalWriter(store, RecordCodec(SIGNING_KEY, "agent"), Durability.PER_RUN, ack_timeout_s=20,
                               fence_watch=watch)
        opened.append((store, watch))
        write_attempt_records(writer, partitions, job_id, 0, subtask)
        return writer

    yield attempt, topic, settings
    for store, watch in opened:
        watch.close()
        store.close()
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.delete_topics([topic, fence_topic_of(topic)], request_timeout=30).values():
        try:
            future.result(timeout=60)
        except Exception:  # noqa: BLE001 - best effort
            pass


def _run(writer: JournalWriter, calls: Calls, seq: int = 1):
    return execute_run(calls.agent(), RunInput("k", GROUP, seq, 10, None), {}, journal=writer.run_journal(GROUP))


def test_an_older_attempt_makes_no_external_call_after_a_newer_start_on_its_partition(journal, caplog):
    attempt, _, _ = journal
    zombie = attempt()
    newer = attempt()  # Flink restored the task elsewhere: the newer start fences partition 0-3
    calls = Calls()
    with pytest.raises(AttemptFencedError, match="newer attempt"):
        _run(zombie, calls)
    assert (calls.charge, calls.notify) == (0, 0)
    assert zombie.fence_watch.fenced and zombie.fence_watch.refused == 1
    with pytest.raises(AttemptFencedError):  # and it makes no further call, nor writes
        _run(zombie, Calls(), seq=2)
    assert zombie.fence_watch.refused == 1  # counted once: the second run was refused at its first record
    fenced_lines = [r for r in caplog.records if "newer attempt" in r.getMessage()]
    assert len(fenced_lines) == 1  # logged once
    newer_calls = Calls()
    _run(newer, newer_calls)  # the newer attempt is not fenced by the older one's start
    assert (newer_calls.charge, newer_calls.notify) == (1, 1)


def test_a_call_under_way_at_the_newer_start_finishes_and_the_next_is_refused(journal):
    attempt, topic, settings = journal
    zombie = attempt()
    started: list = []
    calls = Calls(during_charge=lambda: started.append(attempt()))
    with pytest.raises(AttemptFencedError):
        _run(zombie, calls)
    # charge's started record preceded the newer start: it was under way and finished; notify was refused.
    assert (calls.charge, calls.notify) == (1, 0)
    # The newer attempt finds charge in doubt (its started record before the newer fence), the zombie's outcome
    # after the newer marker is ignored (journal fencing), and notify was never started.
    store = KafkaJournalStore(settings, topic, 4, timeout_s=20)
    try:
        codec = RecordCodec(SIGNING_KEY, "agent")
        fences = PartitionFences(codec, topic=topic)
        history = read_job_history(store, codec, [GROUP], ["job"], fences=fences)
        key_history = history.index.history(key_digest("k"))
        calls_seen = [record for slot in key_history.calls.values() for record in slot.values()]
    finally:
        store.close()
    assert [(c.resource, c.outcome) for c in calls_seen] == [("charge", CallOutcome.STARTED)]
    assert fences.ignored_total == 2  # charge's result and notify's started record


def test_a_newer_start_on_other_partitions_does_not_fence(journal):
    attempt, _, _ = journal
    mine = attempt(partitions=(0, 1), subtask=0)
    attempt(partitions=(2, 3), subtask=1)  # a sibling subtask of the same start
    calls = Calls()
    _run(mine, calls)
    assert (calls.charge, calls.notify) == (1, 1)
    assert not mine.fence_watch.fenced


def test_concurrent_checks_share_round_trips_and_all_see_the_fence(journal):
    attempt, _, _ = journal
    zombie = attempt()
    attempt()
    refused, errors = [], []

    def one(seq):
        try:
            _run(zombie, Calls(), seq=seq)
        except AttemptFencedError:
            refused.append(seq)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(seq,)) for seq in range(1, 9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors and sorted(refused) == list(range(1, 9))


def test_fence_records_deleted_before_the_attempt_read_them_fence_it(journal, kafka_bootstrap):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    attempt, topic, _ = journal
    zombie = attempt()
    attempt()
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    fences = fence_topic_of(topic)
    end = FenceWatch({"bootstrap.servers": kafka_bootstrap}, topic, timeout_s=20)
    try:
        _, high = end._get_consumer().get_watermark_offsets(TopicPartition(fences, 0), timeout=20, cached=False)
    finally:
        end.close()
    for future in admin.delete_records([TopicPartition(fences, 0, high)], request_timeout=30).values():
        future.result(timeout=30)
    calls = Calls()
    with pytest.raises(AttemptFencedError, match="were deleted before this attempt read them"):
        _run(zombie, calls)
    assert (calls.charge, calls.notify) == (0, 0)


# -- the fence record's format: read by attempts of other versions running at the same time ---------------------
def test_a_version_1_fence_record_reads_as_written():
    written = (b'{"version":1,"journal":"j","job_id":"job","subtask":3,"partitions":[[0,32],[64,65]],'
               b'"time_ms":1765000000000}')
    fence = decode_fence(written)
    assert fence["partitions"] == ((0, 32), (64, 65)) and fence["job_id"] == "job" and fence["subtask"] == 3
    assert decode_fence(encode_fence(journal="j", job_id="job", subtask=3, partitions=[*range(32), 64]))[
        "partitions"] == ((0, 32), (64, 65))


def test_a_later_version_is_read_by_its_partitions_and_an_unreadable_record_names_every_partition():
    later = decode_fence(b'{"version":7,"partitions":[[5,6]],"something_new":{"x":1}}')
    assert later["partitions"] == ((5, 6),)
    for garbage in (b"", b"not json", b'{"version":1}', b'{"partitions":[["a"]]}'):
        fence = decode_fence(garbage)
        assert fence.get("unreadable") and fence["partitions"][0][0] == 0 and fence["partitions"][0][1] > 2**40
