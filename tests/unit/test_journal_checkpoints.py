"""JournalCheckpoints on the in-memory journal: restore, the topic-id check, the gap policy, markers, pruning.

The operator's checkpoint hooks are these calls with plain values; no Flink here.
"""

import json

import pytest

from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action
from flink_agents_replay.api.resources import Tool
from flink_agents_replay.core.errors import JournalError, JournalGapError, SignatureError
from flink_agents_replay.engine import RunInput, execute_run
from flink_agents_replay.storage.journal import checkpoints as checkpoints_module
from flink_agents_replay.storage.journal.checkpoints import JournalCheckpoints, RunInFlight, describe_partitions
from flink_agents_replay.storage.journal.markers import encode_marker
from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore
from flink_agents_replay.storage.journal.writer import Durability, JournalWriter
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import key_digest

SIGNING_KEY = b"0123456789abcdef0123"
PARTITIONS = 4
OWNED = range(0, 2)


class TopicStore(MemoryJournalStore):
    """The in-memory journal with what a Kafka topic also has: a name and a topic id."""

    def __init__(self, topic_id: str = "topic-1"):
        super().__init__(PARTITIONS)
        self.topic = "agent.journal"
        self.topic_id = topic_id


class Echo(Agent):
    @action(InputEvent)
    def answer(event, ctx):
        ctx.send_event(OutputEvent(output=ctx.call("echo", event.input)))


def make_checkpoints(store=None, **options) -> JournalCheckpoints:
    store = store if store is not None else TopicStore()
    writer = JournalWriter(store, RecordCodec(SIGNING_KEY, "agent"), Durability.PER_ACTION)
    return JournalCheckpoints(store=store, writer=writer, owned=OWNED, subtask=0, **options)


def run_once(checkpoints: JournalCheckpoints, key: str, seq: int, group: int) -> RunInFlight:
    """Run ``key``'s input ``seq`` through the engine, journaling into ``checkpoints``' writer."""
    journal = checkpoints.run_journal(group)
    agent = Echo(resources={"echo": Tool(lambda text: text.upper())})
    execute_run(agent, RunInput(key, group, seq, f"input {seq}", None), {}, journal=journal)
    return RunInFlight(group, key_digest(key), seq, journal)


def marker_of(checkpoints: JournalCheckpoints, checkpoint_id: int, runs=()) -> bytes:
    marker = checkpoints.snapshot(checkpoint_id, runs)
    assert marker is not None
    return marker


def test_snapshot_marks_the_end_of_each_owned_partition_lowered_to_runs_in_flight():
    checkpoints = make_checkpoints()
    run_once(checkpoints, "a", 1, group=0)
    in_flight = run_once(checkpoints, "b", 1, group=1)
    run_once(checkpoints, "c", 1, group=1)
    ends = checkpoints.store.end_offsets(OWNED)
    marker = json.loads(marker_of(checkpoints, 1, [in_flight]))
    assert marker["topic_id"] == "topic-1" and marker["ends"] == {str(p): o for p, o in ends.items()}
    assert marker["offsets"] == {"0": ends[0], "1": 0}, "partition 1 is read again from the run in flight"
    assert marker["in_flight"] == {"1": [[key_digest("b"), 1]]}


class CountingStore(TopicStore):
    """Counts the end-offset queries (each a broker round trip on the task thread, with Kafka)."""

    def __init__(self):
        super().__init__()
        self.asked: list[list[int]] = []

    def end_offsets(self, partitions):
        self.asked.append(sorted(partitions))
        return super().end_offsets(partitions)


def test_after_its_first_snapshot_an_attempt_takes_ends_from_its_own_acknowledged_records():
    checkpoints = make_checkpoints(CountingStore())
    run_once(checkpoints, "a", 1, group=0)
    first = json.loads(marker_of(checkpoints, 1))
    assert checkpoints.store.asked == [[0, 1]], "the attempt's first snapshot asks the store"
    run_once(checkpoints, "b", 1, group=1)
    run_once(checkpoints, "c", 2, group=0)
    second = json.loads(marker_of(checkpoints, 2))
    marker_of(checkpoints, 3)
    assert checkpoints.store.asked == [[0, 1]], "then no query: each end is past the attempt's last record"
    ends = TopicStore.end_offsets(checkpoints.store, OWNED)
    assert second["ends"] == {str(p): o for p, o in ends.items()} and second["offsets"] == second["ends"]
    assert int(first["ends"]["0"]) < int(second["ends"]["0"])


@pytest.mark.parametrize("reported", [None, 0], ids=["no offset", "an offset below the known end"])
def test_an_acknowledgement_whose_offset_cannot_be_trusted_makes_the_snapshot_ask_the_store(monkeypatch, reported):
    checkpoints = make_checkpoints(CountingStore())
    run_once(checkpoints, "a", 1, group=0)
    marker_of(checkpoints, 1)
    run_once(checkpoints, "b", 2, group=0)
    real = checkpoints.writer.acknowledge_appended
    monkeypatch.setattr(checkpoints.writer, "acknowledge_appended", lambda timeout_s: {**real(timeout_s), 0: reported})
    marker = json.loads(marker_of(checkpoints, 2))
    assert checkpoints.store.asked == [[0, 1], [0]]
    assert marker["ends"]["0"] == TopicStore.end_offsets(checkpoints.store, [0])[0]


def test_each_acknowledgement_without_an_offset_is_asked_about_also_twice_in_a_row(monkeypatch):
    checkpoints = make_checkpoints(CountingStore())
    run_once(checkpoints, "a", 1, group=0)
    marker_of(checkpoints, 1)
    real = checkpoints.writer.acknowledge_appended
    monkeypatch.setattr(checkpoints.writer, "acknowledge_appended", lambda timeout_s: {**real(timeout_s), 0: None})
    for seq, checkpoint_id in ((2, 2), (3, 3)):
        run_once(checkpoints, "a", seq, group=0)
        marker = json.loads(marker_of(checkpoints, checkpoint_id))
        assert marker["ends"]["0"] == TopicStore.end_offsets(checkpoints.store, [0])[0]
    assert checkpoints.store.asked == [[0, 1], [0], [0]]


def test_a_store_answer_that_is_no_offset_fails_the_snapshot_even_with_an_end_known_and_is_asked_again():
    store = CountingStore()
    checkpoints = make_checkpoints(store)
    run_once(checkpoints, "a", 1, group=0)
    marker_of(checkpoints, 1)
    checkpoints.writer._last[0].offset = None  # its next acknowledgement carries no offset
    answers = iter([{0: -1001}, {0: TopicStore.end_offsets(store, [0])[0]}])
    store.end_offsets = lambda partitions: (store.asked.append(sorted(partitions)), next(answers))[1]
    with pytest.raises(JournalError, match="no end offset"):
        checkpoints.snapshot(2, [])
    assert json.loads(marker_of(checkpoints, 3))["ends"]["0"] == TopicStore.end_offsets(store, [0])[0]
    assert store.asked == [[0, 1], [0], [0]]


def test_the_writer_reports_an_acknowledgement_without_an_offset_as_no_end():
    checkpoints = make_checkpoints()
    run_once(checkpoints, "a", 1, group=0)
    run_once(checkpoints, "b", 1, group=1)
    checkpoints.writer._last[1].offset = None
    ends = checkpoints.writer.acknowledge_appended(1.0)
    assert ends == {0: TopicStore.end_offsets(checkpoints.store, [0])[0], 1: None}


def test_a_run_whose_first_record_came_back_without_an_offset_keeps_its_partition_from_the_first_offset_stored():
    checkpoints = make_checkpoints()
    run_once(checkpoints, "a", 1, group=0)
    completed_marker = marker_of(checkpoints, 1)
    assert checkpoints.completed(1) > 0, "partition 0 was pruned to its end"
    low = checkpoints.store.start_offsets([0])[0]
    in_flight = run_once(checkpoints, "b", 1, group=0)
    run_once(checkpoints, "c", 1, group=0)
    in_flight.journal.first_delivery.offset = None
    marker = json.loads(marker_of(checkpoints, 2, [in_flight]))
    assert marker["offsets"]["0"] == low < int(marker["ends"]["0"]), (completed_marker, marker)


def test_completion_prunes_below_the_marker_and_an_aborted_checkpoint_prunes_nothing():
    checkpoints = make_checkpoints()
    run_once(checkpoints, "a", 1, group=0)
    written = checkpoints.store.end_offsets([0])[0]
    marker_of(checkpoints, 1)
    checkpoints.aborted(1)
    assert checkpoints.completed(1) == 0 and len(checkpoints.store.records(0)) == written
    marker_of(checkpoints, 2)
    assert checkpoints.completed(2) == written
    assert checkpoints.store.records(0) == []


def test_restore_reads_the_records_of_runs_in_flight_at_the_checkpoint():
    production = make_checkpoints()
    run_once(production, "a", 1, group=1)  # done before the barrier: its effects are in the checkpoint
    in_flight = run_once(production, "b", 1, group=1)
    marker = marker_of(production, 1, [in_flight])
    restored = make_checkpoints(production.store)
    restored.restore([marker], job_id="job")
    assert restored.restored and restored.last_restore_ms is not None
    assert restored.history(key_digest("b")) is not None and restored.history(key_digest("a")) is None
    assert len(restored.index) == 1


def test_restore_refuses_markers_of_another_journal_topic():
    production = make_checkpoints()
    marker = marker_of(production, 1, [run_once(production, "a", 1, group=0)])
    recreated = make_checkpoints(TopicStore(topic_id="topic-2"))
    with pytest.raises(JournalGapError, match="not the topic this checkpoint was taken with"):
        recreated.restore([marker], job_id="job")


def test_markers_of_another_topic_accepted_with_a_gap_read_from_the_earliest_records():
    production = make_checkpoints()
    marker = marker_of(production, 1, [run_once(production, "a", 1, group=0)])
    recreated = make_checkpoints(TopicStore(topic_id="topic-2"), accept_gap=True)
    recreated.restore([marker], job_id="job")
    assert recreated.restored and len(recreated.index) == 0


def test_a_moved_journal_restores_from_markers_of_its_old_topic_id_when_its_offsets_reach_them():
    production = make_checkpoints()
    in_flight = run_once(production, "a", 1, group=0)
    marker = marker_of(production, 1, [in_flight])
    moved = TopicStore(topic_id="topic-2")  # a copy with every record at its offset, as journal load makes it
    for partition in OWNED:
        for key, value in production.store.records(partition):
            moved.append(partition, key, value)
    restored = make_checkpoints(moved, accept_moved_from="topic-1")
    restored.restore([marker], job_id="job")
    assert restored.history(key_digest("a")) is not None
    empty = make_checkpoints(TopicStore(topic_id="topic-2"), accept_moved_from="topic-1")
    with pytest.raises(JournalGapError, match="accept_moved_journal_from='topic-1'"):
        empty.restore([marker], job_id="job")  # the moved topic does not reach the marker's ends


def test_restore_refuses_a_gap_unless_accepted():
    production = make_checkpoints()
    in_flight = run_once(production, "a", 1, group=0)
    marker = marker_of(production, 1, [in_flight])
    production.store.delete_before({0: 1})  # a later checkpoint pruned what this one needs
    with pytest.raises(JournalGapError, match="already deleted"):
        make_checkpoints(production.store).restore([marker], job_id="job")
    accepting = make_checkpoints(production.store, accept_gap=True)
    accepting.restore([marker], job_id="job")
    assert accepting.restored


def test_start_without_checkpoint_writes_attempt_records_and_a_restart_reuses_them():
    first = make_checkpoints()
    first.restore([], job_id="job-1")
    assert not first.restored
    assert [len(first.store.records(p)) for p in range(PARTITIONS)] == [1, 1, 0, 0]
    run_once(first, "a", 1, group=0)
    restarted = make_checkpoints(first.store)
    restarted.restore([], job_id="job-1")
    assert restarted.restored and restarted.history(key_digest("a")) is not None


def test_a_job_not_resumed_reads_another_journal_and_writes_no_marker_nor_attempt_records():
    production = make_checkpoints()
    in_flight = run_once(production, "a", 1, group=0)
    marker = marker_of(production, 1, [in_flight])
    replay_store = TopicStore(topic_id="replay-topic")
    replay = make_checkpoints(replay_store, restore_from=production.store, resumable=False)
    replay.restore([marker], job_id="replay-job")
    assert replay.history(key_digest("a")) is not None, "the savepoint's run in flight finishes from production's"
    assert replay.snapshot(2, []) is None and replay.completed(2) == 0
    fresh = make_checkpoints(TopicStore(), restore_from=production.store, resumable=False)
    fresh.restore([], job_id="replay-job")
    assert fresh.store.end_offsets(range(PARTITIONS)) == dict.fromkeys(range(PARTITIONS), 0)


def test_without_a_journal_every_hook_is_a_no_op():
    checkpoints = JournalCheckpoints(store=None, writer=None, owned=OWNED, subtask=0)
    checkpoints.restore([encode_marker("t", 0, {0: 1}, {0: 1}, {})], job_id="job")
    assert checkpoints.snapshot(1, []) is None and checkpoints.completed(1) == 0
    assert checkpoints.run_journal(0) is None and checkpoints.history("k") is None


def test_partitions_described_as_ranges():
    assert describe_partitions([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8" and describe_partitions([]) == "none"


# --- expiry of recovered histories (recovered_history_expiry_s) -----------------------------------------------


class Clock:
    """Wall-clock seconds the test sets (the expiry clock is epoch time: markers carry it across restores)."""

    def __init__(self, monkeypatch, now: float = 1_000_000.0):
        self.now = now
        monkeypatch.setattr(checkpoints_module.time, "time", lambda: self.now)


def restored_after_barrier(keys_and_groups, in_flight=(), **options) -> tuple[JournalCheckpoints, bytes]:
    """A restore whose journal holds one run per key written after the checkpoint's barrier (recovered history);
    ``in_flight`` runs were under way at the barrier."""
    production = make_checkpoints()
    runs = [run_once(production, key, 1, group) for key, group in in_flight]
    marker = marker_of(production, 1, runs)
    for key, group in keys_and_groups:
        run_once(production, key, 1, group)
    restored = make_checkpoints(production.store, **options)
    restored.restore([marker], job_id="job")
    return restored, marker


def test_a_history_whose_inputs_never_come_back_expires_and_the_marker_moves_past_it(monkeypatch):
    clock = Clock(monkeypatch)
    restored, _ = restored_after_barrier([("gone", 0), ("back", 1)], history_expiry_s=60)
    ends = restored.store.end_offsets(OWNED)
    pinned = json.loads(marker_of(restored, 2))
    assert pinned["offsets"]["0"] < ends[0] and pinned["offsets"]["1"] < ends[1]
    assert set(pinned["replaying_since"]) == {key_digest("gone"), key_digest("back")}

    clock.now += 50
    restored.history(key_digest("back"))  # "back"'s input came back: it replays and is applied (progress)
    assert restored.run_applied(key_digest("back")) is False
    clock.now += 11  # 61 s after the restore, 11 s after "back"'s progress
    assert restored.expire_histories([]) == 1 and restored.histories_expired == 1
    assert restored.history(key_digest("gone")) is None and restored.history(key_digest("back")) is not None
    marker = json.loads(marker_of(restored, 3))
    assert marker["offsets"]["0"] == ends[0], "partition 0 is no longer held back by the expired history"
    assert marker["offsets"]["1"] < ends[1] and list(marker["replaying_since"]) == [key_digest("back")]
    assert restored.expire_histories([]) == 0, "an expiry is counted once"
    clock.now += 60
    assert restored.expire_histories([]) == 1 and not restored.restored, "the last history expired: restore over"


def test_keys_with_a_run_in_flight_never_expire(monkeypatch):
    clock = Clock(monkeypatch)
    restored, _ = restored_after_barrier([("running", 0), ("idle", 1)], in_flight=[("restored-run", 0)],
                                         history_expiry_s=60)
    assert restored.history(key_digest("restored-run")) is not None
    clock.now += 61
    running = RunInFlight(0, key_digest("running"), 2, None)
    assert restored.expire_histories([running]) == 1
    assert restored.history(key_digest("idle")) is None
    assert restored.history(key_digest("running")) is not None, "a run in flight uses its history"
    assert restored.history(key_digest("restored-run")) is not None, "its input is keyed state: it will run"


def test_the_expiry_clock_counts_across_restores(monkeypatch):
    clock = Clock(monkeypatch)
    first, _ = restored_after_barrier([("gone", 0)], history_expiry_s=60)
    clock.now += 40
    marker = marker_of(first, 2)  # the key still waits at this checkpoint; then the job fails again
    again = make_checkpoints(first.store, history_expiry_s=60)
    again.restore([marker], job_id="job")
    clock.now += 10
    assert again.expire_histories([]) == 0
    clock.now += 11  # 61 s since the first restore, 21 s since the second
    assert again.expire_histories([]) == 1


def test_markers_without_replaying_since_restore_with_the_clock_starting_at_the_restore(monkeypatch):
    clock = Clock(monkeypatch)
    first, _ = restored_after_barrier([("gone", 0)], history_expiry_s=60)
    old = json.loads(marker_of(first, 2))
    del old["replaying_since"]  # a marker written before the field existed
    clock.now += 100
    again = make_checkpoints(first.store, history_expiry_s=60)
    again.restore([json.dumps(old).encode()], job_id="job")
    assert again.expire_histories([]) == 0
    clock.now += 60
    assert again.expire_histories([]) == 1


class NoEndOffsetStore(TopicStore):
    """A journal whose end offsets come back as librdkafka's -1001 (no offset)."""

    def end_offsets(self, partitions):
        return {p: -1001 for p in partitions}


def test_a_snapshot_without_end_offsets_fails_and_writes_no_marker():
    checkpoints = make_checkpoints(NoEndOffsetStore())
    with pytest.raises(JournalError, match=r"no end offset for journal partitions \[0, 1\]"):
        checkpoints.snapshot(1, [])
    assert checkpoints.completed(1) == 0, "nothing remembered to prune"


def test_a_marker_without_offsets_is_refused_with_its_cause_and_read_from_the_earliest_when_accepted():
    production = make_checkpoints()
    run_once(production, "a", 1, group=0)
    bad = json.loads(marker_of(production, 1))
    bad["offsets"] = {p: -1001 for p in bad["offsets"]}
    marker = json.dumps(bad).encode()
    with pytest.raises(JournalGapError, match="marker holds no offset.*before 0.6.0 while the broker restarted"):
        make_checkpoints(production.store).restore([marker], job_id="job")
    accepted = make_checkpoints(production.store, accept_gap=True)
    accepted.restore([marker], job_id="job")
    assert accepted.index.records_read > 0


def _with_key(store, signing_key: bytes) -> JournalCheckpoints:
    writer = JournalWriter(store, RecordCodec(signing_key, "agent"), Durability.PER_ACTION)
    return JournalCheckpoints(store=store, writer=writer, owned=OWNED, subtask=0)


def test_a_new_job_with_a_new_signing_key_skips_an_earlier_jobs_records_and_counts_them():
    """An earlier job's leftovers signed with its key are not this job's history: skipped, counted, not fatal."""
    earlier = _with_key(TopicStore(), b"the earlier job's signing key")
    earlier.restore([], job_id="job-1")
    run_once(earlier, "a", 1, group=0)
    new = _with_key(earlier.store, b"a new job with a new signing key")
    new.restore([], job_id="job-2")
    assert not new.restored and new.other_key_records_skipped == len(OWNED)  # job-1's start in each partition
    run_once(new, "a", 1, group=0)
    restarted = _with_key(earlier.store, b"a new job with a new signing key")
    restarted.restore([], job_id="job-2")  # its own records still verify and are reused
    assert restarted.restored and restarted.history(key_digest("a")) is not None


def test_a_record_with_another_key_is_refused_where_it_would_be_this_jobs_history():
    earlier = _with_key(TopicStore(), b"the earlier job's signing key")
    earlier.restore([], job_id="job-1")
    run_once(earlier, "a", 1, group=0)
    continuing = _with_key(earlier.store, b"a new job with a new signing key")
    continuing.continue_job = "job-1"  # its history is job-1's: records that do not verify are not skipped
    with pytest.raises(SignatureError):
        continuing.restore([], job_id="job-2")
