"""Recovery markers and pruning decisions, without Flink."""

import pytest

from flink_agents_replay.core.errors import JournalError
from flink_agents_replay.storage.journal.markers import PruneTracker, build_marker, encode_marker, plan_restore


def test_marker_is_lowered_to_in_flight_runs_and_unreplayed_history():
    ends = {0: 100, 1: 50, 2: 7}
    marker = build_marker(ends, [(0, 40), (0, 60), (1, 49)], {2: 3, 9: 1})
    assert marker == {0: 40, 1: 49, 2: 3}


def test_restore_plan_takes_only_owned_partitions_from_every_subtask():
    old_a = encode_marker("tid", 0, {0: 10, 1: 11}, {0: 20, 1: 21}, {0: [("k1", 4)]})
    old_b = encode_marker("tid", 1, {2: 12, 3: 13}, {2: 22, 3: 23}, {})
    plan = plan_restore([old_a, old_b], range(1, 3))
    assert plan.offsets == {1: 11, 2: 12} and plan.barrier_ends == {1: 21, 2: 22}
    assert plan.topic_ids == {"tid"} and not plan.fresh
    full = plan_restore([old_a, old_b], range(0, 4))
    # Below the barrier's end only in-flight runs' records are needed; after it, everything.
    assert full.needs(0, 15, "k1", 4) and not full.needs(0, 15, "k2", 4) and full.needs(0, 20, "k2", 9)


def test_history_not_replayed_at_the_barrier_is_read_again_by_the_next_restore():
    """A key still replaying (waiting for an input to come back) at checkpoint N: a restore from N must
    find its recovered records again, though they lie below N's barrier."""
    marker = encode_marker("tid", 0, {0: 5}, {0: 20}, {}, replaying={0: [("waiting", 7)]})
    plan = plan_restore([marker], range(0, 1))
    assert plan.needs(0, 6, "waiting", 7) and plan.needs(0, 9, "waiting", 8)
    assert not plan.needs(0, 6, "waiting", 6), "its inputs before the unreplayed history are in the checkpoint"
    assert not plan.needs(0, 6, "done", 7), "another key's records below the barrier are not needed"
    old_marker = encode_marker("tid", 0, {0: 5}, {0: 20}, {})  # written before "replaying" existed
    assert not plan_restore([old_marker], range(0, 1)).needs(0, 6, "waiting", 7)


def test_no_marker_is_a_fresh_start():
    assert plan_restore([], range(0, 8)).fresh
    assert plan_restore([b""], range(0, 8)).fresh


def test_unknown_marker_version_is_refused():
    with pytest.raises(JournalError, match="marker version 9"):
        plan_restore([b'{"version": 9}'], range(0, 1))


def test_completing_a_checkpoint_prunes_up_to_its_marker_and_forgets_older_ones():
    tracker = PruneTracker()
    tracker.remember(1, {0: 10, 1: 5})
    tracker.remember(2, {0: 20, 1: 5})
    tracker.remember(3, {0: 30, 1: 8})
    deletions = tracker.complete(2, low_watermarks={0: 0, 1: 0})
    assert deletions == {0: 20, 1: 5}
    assert tracker.pruned(deletions) == 25
    assert tracker.complete(1) == {}  # older than a completed one: already covered
    assert tracker.complete(3) == {0: 30, 1: 8}


def test_abort_prunes_nothing_and_a_later_checkpoint_still_does():
    tracker = PruneTracker()
    tracker.remember(1, {0: 10})
    tracker.abort(1)
    assert tracker.complete(1, {0: 0}) == {}
    tracker.remember(2, {0: 12})
    assert tracker.complete(2) == {0: 12}


def test_never_prunes_backwards_or_below_what_is_already_deleted():
    tracker = PruneTracker()
    tracker.remember(1, {0: 10, 1: 3})
    deletions = tracker.complete(1, low_watermarks={0: 0, 1: 7})  # partition 1 already pruned to 7
    assert deletions == {0: 10}
    tracker.pruned(deletions)
    tracker.remember(2, {0: 9, 1: 7})  # a run in flight holds partition 0 back
    assert tracker.complete(2) == {}


def test_markers_carry_the_runs_parked_per_key_group_and_a_restore_sums_its_own():
    from flink_agents_replay.storage.journal.markers import encode_marker, waits_open

    first = encode_marker("topic-id", 0, {0: 5, 1: 7}, {0: 5, 1: 7}, {}, waits_open={0: 2, 1: 1, 5: 0})
    second = encode_marker("topic-id", 1, {2: 3}, {2: 3}, {}, waits_open={2: 4})
    version_1 = b'{"version": 1, "topic_id": "topic-id", "subtask": 2, "offsets": {"3": 0}, "ends": {"3": 0}, ' \
                b'"in_flight": {}}'
    assert waits_open([first, second, version_1, b""], range(0, 2)) == {0: 2, 1: 1}
    assert waits_open([first, second, version_1], range(1, 3)) == {1: 1, 2: 4}
    assert plan_restore([first, version_1], range(0, 4)).offsets == {0: 5, 1: 7, 3: 0}  # both versions read
