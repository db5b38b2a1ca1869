"""The job mode plug-ins without Flink: production's mode and a replay's (input adapter, seq, call gate).
(That capture, replay and the journal stay free of the operator is the .importlinter layers contract.)"""

from collections import Counter

from flink_agents_replay.api.call_site import Fork
from flink_agents_replay.flink.mode import PRODUCTION
from flink_agents_replay.replay.gate import ReplayCalls
from flink_agents_replay.replay.mode import ReplayMode
from flink_agents_replay.replay.policy import CallPolicy
from flink_agents_replay.replay.settings import ReplaySettings
from flink_agents_replay.storage.capture.records import CapturedInput
from flink_agents_replay.storage.formats.state import WaitingInput, encode_waiting
from flink_agents_replay.storage.records.journal import CallOutcome, CallRecord


class Counted:
    def __init__(self, counts: Counter, name: str):
        self.counts, self.name = counts, name

    def inc(self, n: int = 1) -> None:
        self.counts[self.name] += n


def replay_mode(counts: Counter) -> ReplayMode:
    settings = ReplaySettings("prod.capture", {0: 5}, "prod.journal", policies={"*": CallPolicy.RECORDED})
    mode = ReplayMode(settings=settings, kafka={"bootstrap.servers": "unused:9092"}, signing_key=b"k" * 16,
                      uid="agent", journal_topic="replay.journal", max_parallelism=4, read_production_journal=True,
                      kafka_timeout_s=1.0, name="replay.capture")
    mode.counters = {"replay_inputs_skipped": Counted(counts, "replay_inputs_skipped")}  # as open() sets them
    return mode


def test_production_takes_every_input_as_it_comes_with_live_calls():
    assert PRODUCTION.admit("text", 7, accepted_seq=lambda: 3) == WaitingInput("text", 7)
    assert PRODUCTION.drop_held([b"x"], accepted_seq=lambda: 3) == [b"x"]
    assert PRODUCTION.seq_for("k", WaitingInput("text", 7), 4) == 4 and PRODUCTION.gate_for("d", 4) is None
    assert PRODUCTION.resumable and PRODUCTION.restores_input_order and not PRODUCTION.report_failures


def test_replay_takes_captured_inputs_with_production_seq_and_drops_those_the_savepoint_holds():
    counts = Counter()
    mode = replay_mode(counts)
    assert mode.admit(CapturedInput("k", 4, 70, "text", "digest"), 99, lambda: 3) == WaitingInput("text", 70, 4)
    assert mode.admit(CapturedInput("k", 3, 60, "old", "digest"), 99, lambda: 3) is None
    kept = mode.drop_held([encode_waiting(WaitingInput("a", 1, 2)), encode_waiting(WaitingInput("b", 1, 5))], lambda: 3)
    assert kept == [encode_waiting(WaitingInput("b", 1, 5))]
    assert counts["replay_inputs_skipped"] == 2


def test_replay_runs_an_input_as_production_numbered_it():
    mode = replay_mode(Counter())
    assert mode.seq_for("k", WaitingInput("text", 1, 4), 4) == 4
    assert mode.seq_for("k", WaitingInput("text", 1, 9), 4) == 9, "the capture lacks inputs in between"
    assert mode.seq_for("k", WaitingInput("text", 1), 4) == 4


def test_replay_gate_serves_the_calls_of_production_run_of_the_same_input_once():
    mode = replay_mode(Counter())
    call = CallRecord(seq=4, order=0, event_id="e", action="act", position=0, resource="tool", args_digest="a",
                      outcome=CallOutcome.RETURNED, result="r")
    mode.recorded_calls[("digest", 4)] = {("e", "act", 0): call}
    gate = mode.gate_for("digest", 4)
    assert isinstance(gate, ReplayCalls) and gate.recorded == {("e", "act", 0): call}
    assert gate.call_id_prefix == "replay:replay.journal:" and gate.policies == {"*": CallPolicy.RECORDED}
    # No checkpoint id in these settings: production's outside state is read as of 0 (nothing of it).
    assert gate.fork == Fork(as_of=0, name="replay.capture")
    assert mode.gate_for("digest", 4).recorded == {}, "a run's recorded calls are handed out once"
    assert not mode.resumable and not mode.restores_input_order and mode.report_failures


def test_a_replay_refuses_a_savepoint_whose_checkpoint_time_is_not_the_manifests():
    """Checkpoint ids restart with each job started without a savepoint: on a shared capture topic the manifest
    may describe another job's checkpoint of the same id. Its trigger time tells them apart."""
    import pytest

    from flink_agents_replay.core.errors import NO_RESTART_MARKER, ReplayConfigError

    settings = ReplaySettings("prod.capture", {0: 5}, "prod.journal", checkpoint_id=3,
                              checkpoint_time_ms=1_780_000_000_000)
    mode = ReplayMode(settings=settings, kafka={"bootstrap.servers": "unused:9092"}, signing_key=b"k" * 16,
                      uid="agent", journal_topic="replay.journal", max_parallelism=4, read_production_journal=True,
                      kafka_timeout_s=1.0, name="replay.capture")
    mode.restored(checkpoint_id=3, checkpoint_time_ms=1_780_000_000_000)  # the manifest's: fine
    mode.restored(checkpoint_id=3, checkpoint_time_ms=None)  # a marker without a time cannot be checked
    with pytest.raises(ReplayConfigError, match="another job on the same capture topic") as refused:
        mode.restored(checkpoint_id=3, checkpoint_time_ms=1_770_000_000_000)
    assert NO_RESTART_MARKER in str(refused.value)
    PRODUCTION.restored(checkpoint_id=3, checkpoint_time_ms=1)  # production restores any checkpoint
