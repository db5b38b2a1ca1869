"""Fencing of earlier attempts on the in-memory journal (docs/design.md §5.3, journal/fencing.py).

A zombie (an older attempt whose process lives on) delivers records after a newer attempt's marker: readers
ignore and count them. Records the older attempt wrote before that marker are its history and stay. The
zombie here is simply a second writer over the same store that goes on writing after the newer attempt
started, exactly what a paused-and-resumed TaskManager's producer does.
"""

import json
import logging

import pytest

from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action
from flink_agents_replay.api.resources import Tool
from flink_agents_replay.core.errors import SignatureError
from flink_agents_replay.engine import RunInput, execute_run
from flink_agents_replay.engine.digest import digest_value
from flink_agents_replay.storage.journal.attempts import attempt_key, read_job_history, write_attempt_records
from flink_agents_replay.storage.journal.checkpoints import JournalCheckpoints
from flink_agents_replay.storage.journal.fencing import PartitionFences, fence_of
from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore
from flink_agents_replay.storage.journal.recovery import read_recovery_index
from flink_agents_replay.storage.journal.writer import Durability, JournalWriter
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import RecordKind, key_digest

SIGNING_KEY = b"0123456789abcdef0123"
PRODUCER = "agent"
GROUP = 0


class TopicStore(MemoryJournalStore):
    """The in-memory journal with a topic name and id; ``before_next_marker`` runs once, just before the next
    attempt record lands (a zombie record arriving between a start's read and its marker)."""

    def __init__(self):
        super().__init__(2)
        self.topic, self.topic_id = "agent.journal", "topic-1"
        self.before_next_marker = None

    def append(self, partition, key, value):
        if self.before_next_marker is not None and key.endswith(b":_attempt:_job"):
            hook, self.before_next_marker = self.before_next_marker, None
            hook()
        return super().append(partition, key, value)


class Echo(Agent):
    @action(InputEvent)
    def answer(event, ctx):
        ctx.send_event(OutputEvent(output=ctx.call("echo", event.input)))


def codec() -> RecordCodec:
    return RecordCodec(SIGNING_KEY, PRODUCER)


def writer_of(store) -> JournalWriter:
    return JournalWriter(store, codec(), Durability.PER_ACTION)


def run(writer: JournalWriter, key: str, seq: int, value: str) -> int:
    """One run of ``key`` journaled by ``writer``; returns how many records it wrote."""
    journal = writer.run_journal(GROUP)
    execute_run(Echo(resources={"echo": Tool(str.upper)}), RunInput(key, GROUP, seq, value, None), {}, journal=journal)
    journal.acknowledge()
    return journal.records_written


def interleaved(store):
    """Attempt A starts and runs k#1; attempt B starts; A, now a zombie, runs k#2 and z#1; B runs k#2."""
    zombie, newer = writer_of(store), writer_of(store)
    write_attempt_records(zombie, [GROUP], "job", 0, 0)
    early = run(zombie, "k", 1, "first")
    [fence_b] = write_attempt_records(newer, [GROUP], "job", 1, 0).values()
    late = run(zombie, "k", 2, "zombie") + run(zombie, "z", 1, "zombie")
    run(newer, "k", 2, "second")
    return early, late, fence_b


def test_records_of_an_older_attempt_after_a_newer_marker_are_ignored_and_earlier_ones_kept():
    store = TopicStore()
    early, late, fence_b = interleaved(store)
    assert fence_b == fence_of(1 + early), "the newer attempt's fence is its marker's offset + 1"
    fences = PartitionFences(codec(), topic=store.topic)
    index = read_recovery_index(store, codec(), {GROUP: 0}, store.end_offsets([GROUP]), fences=fences)
    history = index.history(key_digest("k"))
    assert history.input_matches(1, digest_value("first")), "the zombie's records before the marker stay"
    assert history.input_matches(2, digest_value("second")), "seq 2 is the newer attempt's, not the zombie's"
    assert index.history(key_digest("z")) is None
    assert fences.ignored_total == late == fences.ignored[GROUP] and late > 0

    # Without fencing the zombie's late records would be history (what main did): the test can fail.
    unfenced = read_recovery_index(store, codec(), {GROUP: 0}, store.end_offsets([GROUP]))
    assert unfenced.history(key_digest("z")) is not None


def test_a_read_that_starts_after_the_newer_marker_takes_the_fence_from_the_checkpoint():
    store = TopicStore()
    _, late, fence_b = interleaved(store)
    start, end = {GROUP: fence_b}, store.end_offsets([GROUP])  # the range after B's marker only
    carried = PartitionFences(codec(), {GROUP: fence_b}, topic=store.topic)
    assert read_recovery_index(store, codec(), start, end, fences=carried).history(key_digest("z")) is None
    assert carried.ignored_total == late
    blind = read_recovery_index(store, codec(), start, end, fences=PartitionFences(codec(), topic=store.topic))
    assert blind.history(key_digest("z")) is not None, "without the carried fence the zombie would win"


def test_a_restart_before_the_first_checkpoint_ignores_a_zombie_of_an_earlier_attempt():
    store = TopicStore()
    _, late, _ = interleaved(store)
    fences = PartitionFences(codec(), topic=store.topic)
    history = read_job_history(store, codec(), [GROUP], {"job"}, fences=fences)
    assert history.found and history.last_attempt == 1
    assert history.index.history(key_digest("z")) is None and fences.ignored_total == late


def test_an_ignored_record_is_still_verified():
    store = TopicStore()
    _, _, fence_b = interleaved(store)
    key, value = store._logs[GROUP][fence_b]  # the zombie's first record after the newer marker, altered
    store._logs[GROUP][fence_b] = (key, value[:-1] + bytes([value[-1] ^ 1]))
    with pytest.raises(SignatureError, match="failed signature verification"):
        read_recovery_index(store, codec(), {GROUP: 0}, store.end_offsets([GROUP]),
                            fences=PartitionFences(codec(), topic=store.topic))


def test_attempt_records_of_earlier_versions_do_not_fence():
    store = TopicStore()
    old = writer_of(store)
    payload = {"version": 1, "job_id": "job", "attempt": 0, "subtask": 0}  # what 0.1-0.x wrote: no "fences"
    old.append(GROUP, attempt_key(GROUP, "job"), old.encode(attempt_key(GROUP, "job"), RecordKind.ATTEMPT, payload,
                                                           partition=GROUP, fingerprint="", what="attempt"), "attempt")
    run(old, "k", 1, "old")  # att 0, as records of earlier versions count
    fences = PartitionFences(codec(), topic=store.topic)
    index = read_recovery_index(store, codec(), {GROUP: 0}, store.end_offsets([GROUP]), fences=fences)
    assert index.history(key_digest("k")) is not None and fences.ignored_total == 0


def checkpoints(store) -> JournalCheckpoints:
    return JournalCheckpoints(store=store, writer=writer_of(store), owned=range(0, 2), subtask=0)


def test_every_start_fences_and_a_later_restore_does_not_reuse_zombie_records(caplog):
    store = TopicStore()
    first = checkpoints(store)
    first.restore([], job_id="job-1")  # a fresh start writes markers
    run(first.writer, "k", 1, "one")
    marker_1 = first.snapshot(1, [])

    # The second attempt restores checkpoint 1; a zombie record of the first lands just before its marker.
    store.before_next_marker = lambda: run(first.writer, "early", 1, "before the marker")
    second = checkpoints(store)
    second.restore([marker_1], job_id="job-1")
    assert second.index.history(key_digest("early")) is not None, "read after its markers: history before them"
    assert json.loads(second.snapshot(2, []))["fences"] == {str(p): f for p, f in second.writer.fences.items()}
    assert second.writer.fences[GROUP] > first.writer.fences[GROUP]

    # The first attempt lives on (a zombie) and delivers after the second's latest checkpoint.
    run(second.writer, "k", 2, "two")
    marker_2 = second.snapshot(3, [])
    late = run(first.writer, "z", 1, "zombie")
    with caplog.at_level(logging.WARNING, logger="flink_agents_replay.operator"):
        third = checkpoints(store)
        third.restore([marker_2], job_id="job-1")
    assert third.earlier_attempt_records_ignored == late > 0
    assert third.index.history(key_digest("z")) is None
    assert f"{late} records of an earlier attempt ignored" in caplog.text
    assert third.writer.fences[GROUP] > second.writer.fences[GROUP]


def test_a_new_job_from_a_savepoint_fences_a_zombie_of_the_old_job():
    store = TopicStore()
    old = checkpoints(store)
    old.restore([], job_id="old-job")
    run(old.writer, "k", 1, "one")
    savepoint = old.snapshot(1, [])
    new = checkpoints(store)
    new.restore([savepoint], job_id="new-job")  # another job id, same partitions
    checkpoint = new.snapshot(2, [])
    late = run(old.writer, "z", 1, "zombie")
    restarted = checkpoints(store)
    restarted.restore([checkpoint], job_id="new-job")
    assert restarted.index.history(key_digest("z")) is None and restarted.earlier_attempt_records_ignored == late
