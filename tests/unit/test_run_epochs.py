"""Run epochs on the checkpoint-time clock (flink_agents_replay.flink.epochs), the marker and manifest fields that
carry a checkpoint's trigger time across a restore and to a replay, and the CLI's epoch arguments."""

import argparse

import pytest

from flink_agents_replay.cli import _epoch_or_time
from flink_agents_replay.flink.epochs import RunEpochs
from flink_agents_replay.replay.settings import ReplaySettings
from flink_agents_replay.storage.capture.manifest import CaptureDescription, ManifestEntry
from flink_agents_replay.storage.journal.markers import checkpoint_time, encode_marker

T1, T2 = 1_780_000_000_000, 1_780_000_060_000  # two checkpoints' trigger times (epoch ms)


def test_a_fresh_start_counts_from_its_own_clock_and_each_checkpoint_moves_the_epoch_past_it():
    epochs = RunEpochs(now_ms=T1 - 5_000)
    in_flight_at_t1 = epochs.current
    assert in_flight_at_t1 <= T1  # started before checkpoint T1's barrier: part of T1
    epochs.checkpoint(T1)
    assert epochs.current == T1 + 1  # started after it
    epochs.checkpoint(T2)
    assert epochs.current == T2 + 1


def test_a_restore_goes_on_from_the_restored_checkpoints_time_not_from_its_id():
    epochs = RunEpochs(now_ms=T2 + 999_999)
    epochs.restored(3, T1)
    assert epochs.current == T1 + 1
    assert epochs.of_restored_run() == T1  # a run saved without an epoch was in flight at the restored checkpoint


def test_a_restore_from_a_marker_without_time_starts_from_this_clock_after_every_id_epoch():
    epochs = RunEpochs(now_ms=T2)
    epochs.restored(42, None)  # a 0.4.0 savepoint: its epochs and its replays' as-of were checkpoint ids
    assert epochs.current == T2 + 1 and epochs.current > 42
    assert epochs.of_restored_run() == 42


def test_a_checkpoint_time_behind_this_clock_never_moves_the_epoch_back():
    epochs = RunEpochs(now_ms=T2)  # this TaskManager's clock ahead of the JobManager's
    epochs.checkpoint(T1)
    assert epochs.current == T2 + 1


def test_the_marker_carries_the_checkpoint_time_and_older_markers_have_none():
    new = [encode_marker("tid", s, {s: 1}, {s: 2}, {}, checkpoint_time_ms=T1) for s in range(2)]
    assert checkpoint_time(new) == T1
    assert checkpoint_time([encode_marker("tid", 0, {0: 1}, {0: 2}, {})]) is None  # 0.4.0's
    assert checkpoint_time([b""]) is None and checkpoint_time([]) is None


def test_the_manifest_entry_carries_the_checkpoint_time_and_older_entries_have_none():
    description = CaptureDescription(uid="op", capture_topic="c", key_type="STRING", max_parallelism=2,
                                     codec_version=1)
    entry = ManifestEntry(5, {0: 3, 1: 4}, description, 1, T1)
    assert ManifestEntry.decode(entry.encode()[1]) == entry
    old = ManifestEntry(5, {0: 3}, description).encode()[1]
    assert b"checkpoint_time_ms" not in old and ManifestEntry.decode(old).checkpoint_time_ms is None


def test_a_replay_reads_memory_as_of_the_savepoints_time_or_of_its_id_before_times_were_kept():
    assert ReplaySettings("c", {}, None, checkpoint_id=7, checkpoint_time_ms=T1).memory_as_of == T1
    assert ReplaySettings("c", {}, None, checkpoint_id=7).memory_as_of == 7
    assert ReplaySettings("c", {}, None).memory_as_of == 0


def test_the_cli_takes_an_epoch_or_a_time():
    assert _epoch_or_time(str(T1)) == T1
    assert _epoch_or_time("2026-05-28T20:26:40Z") == T1
    assert _epoch_or_time("2026-05-28T20:26:40") == T1  # no zone: UTC
    assert _epoch_or_time("2026-05-28T22:26:40+02:00") == T1
    with pytest.raises(argparse.ArgumentTypeError, match="ISO 8601"):
        _epoch_or_time("last tuesday")


def test_epochs_read_as_times_or_as_checkpoint_ids_of_older_versions():
    from flink_agents_replay.longterm.versions import describe_epoch

    assert describe_epoch(T1) == f"epoch {T1} (2026-05-28T20:26:40.000Z)"
    assert describe_epoch(42) == "checkpoint 42"


def test_manifest_entries_of_one_checkpoint_id_from_two_jobs_are_refused():
    from flink_agents_replay.core.errors import ReplayConfigError
    from flink_agents_replay.storage.capture.manifest import capture_start

    description = CaptureDescription(uid="op", capture_topic="c", key_type="STRING", max_parallelism=2,
                                     codec_version=1)
    ours = [ManifestEntry(3, {0: 1}, description, 0, T1), ManifestEntry(3, {1: 2}, description, 1, T1)]
    start = capture_start(ours, 3, topic="c.manifest", capture_topic="c")
    assert start.offsets == {0: 1, 1: 2} and start.checkpoint_time_ms == T1
    theirs = [ManifestEntry(3, {0: 7, 1: 8}, description, 0, T2)]  # a later job started without a savepoint
    with pytest.raises(ReplayConfigError, match="checkpoint 3 of 2 different jobs"):
        capture_start(ours + theirs, 3, topic="c.manifest", capture_topic="c")
