"""Which production journal records a replay may use (docs/design.md §9), without Flink or Kafka."""

from flink_agents_replay.storage.journal.markers import encode_marker, plan_restore

# Partition 0's barrier ends at offset 20; key "k1" has seq 4 in flight; key "waiting" was still replaying its
# recovered history from seq 7 on when the savepoint was taken.
_MARKER = encode_marker("tid", 0, {0: 5}, {0: 20}, {0: [("k1", 4)]}, replaying={0: [("waiting", 7)]})


def test_runs_started_after_the_barrier_are_never_reused_by_a_replay():
    plan = plan_restore([_MARKER], range(0, 1))
    assert plan.needs(0, 25, "k2", 9), "a failover restore reuses everything after the barrier"
    assert not plan.needed_by_replay(0, 25, "k2", 9), "a replay runs it under its own policy"
    assert not plan.needed_by_replay(0, 20, "k1", 5), "the in-flight key's next run starts after the barrier"


def test_a_run_in_flight_at_the_barrier_finishes_from_production_records_before_and_after_it():
    plan = plan_restore([_MARKER], range(0, 1))
    assert plan.needed_by_replay(0, 6, "k1", 4) and plan.needed_by_replay(0, 31, "k1", 4)
    assert not plan.needed_by_replay(0, 6, "k1", 3), "a run the savepoint holds as done"


def test_a_history_still_replaying_at_the_barrier_is_kept_but_not_the_key_s_later_runs():
    plan = plan_restore([_MARKER], range(0, 1))
    assert plan.needed_by_replay(0, 6, "waiting", 7) and plan.needed_by_replay(0, 9, "waiting", 8)
    assert not plan.needed_by_replay(0, 6, "waiting", 6), "before the unreplayed history: in the savepoint"
    assert plan.needs(0, 21, "waiting", 9)
    assert not plan.needed_by_replay(0, 21, "waiting", 9), "written after the barrier: a later run"
    assert not plan.needed_by_replay(0, 12, "other", 8), "another key's records below the barrier"


def test_partitions_the_subtask_does_not_own_give_a_replay_nothing():
    plan = plan_restore([_MARKER], range(1, 2))
    assert not plan.needed_by_replay(0, 6, "waiting", 7) and not plan.needed_by_replay(0, 31, "k2", 4)
