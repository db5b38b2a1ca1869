"""A key's recovered history with resumed records (``later_inputs_while_waiting="run"``): where a parked run
resumed in the key's order, what a finished later run leaves of a parked run's records, and the memory a
resumed run hands back (engine/run.py)."""

from __future__ import annotations

from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, Tool, action
from flink_agents_replay.engine import RunInput, execute_run
from flink_agents_replay.engine.run import resume_history
from flink_agents_replay.storage.journal.history import KeyHistory
from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore
from flink_agents_replay.storage.journal.recovery import read_recovery_index
from flink_agents_replay.storage.journal.writer import JournalWriter
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import (
    AcceptedRecord,
    CallOutcome,
    CallRecord,
    ResumedRecord,
    RunPosition,
    key_digest,
)
from flink_agents_replay.storage.records.waits import Decision


def _call(seq: int, position: int = 0) -> CallRecord:
    return CallRecord(seq, 0, f"e{seq}", "act", position, "tool", "d", CallOutcome.RETURNED, "r", f"in{seq}")


def _history(wait_id: str = "w1") -> KeyHistory:
    """Run 1 parked; 2 accepted and ran; 1 resumed after 2 and called again; 3 accepted."""
    history = KeyHistory()
    history.add_accepted(AcceptedRecord(2, "in2"))
    history.add_call(_call(2))
    history.add_resumed(ResumedRecord(1, after=2, wait_id=wait_id, input_digest="in1"))
    history.add_call(_call(1, position=1))
    history.add_accepted(AcceptedRecord(3, "in3"))
    return history


def test_a_recorded_resume_comes_before_the_next_recorded_input():
    history = _history()
    assert history.recorded_resume(1) is None and history.recorded_resume(2) == 1
    assert history.recorded_input(3) == "in3"
    taken = history.take_seq(1, "w1")  # the run resumes: its records and its resume record are taken
    assert history.recorded_resume(2) is None and not history.recorded_calls(1, "e1", "act")
    assert taken.recorded_calls(1, "e1", "act")[1] is not None and taken.resumes == []


def test_a_resume_recorded_again_by_a_later_attempt_supersedes_the_first():
    history = _history()
    history.add_resumed(ResumedRecord(1, after=3, wait_id="w1", input_digest="in1"))  # resumed elsewhere, after 3
    assert history.resumes == [(3, 1, "w1")] and history.recorded_resume(2) is None
    history.add_resumed(ResumedRecord(1, after=3, wait_id="w1", input_digest="in1"))  # the same again
    assert history.resumes == [(3, 1, "w1")]


def test_a_run_that_resumed_twice_takes_its_records_and_the_second_resume_with_it():
    history = _history()
    history.add_resumed(ResumedRecord(1, after=3, wait_id="w2", input_digest="in1"))
    assert history.resumed_later(1, "w1") and history.resumed_later(1, "w2")
    taken = history.take_seq(1, "w1")
    assert taken.resumes == [(3, 1, "w2")] and history.resumes == [(3, 1, "w2")]  # it orders the key's inputs too
    assert taken.recorded_calls(1, "e1", "act")[1] is not None and not history.recorded_calls(1, "e1", "act")
    assert taken.resumed_later(1, "w2") and taken.take_records(1)  # parked again at w2: they travel on


def test_a_parked_runs_records_are_taken_out_to_travel_with_it_and_its_resume_stays_to_order_the_key():
    history = _history()
    taken = history.take_records(1)
    assert [(r.seq, r.position) for r in taken] == [(1, 1)] and not history.recorded_calls(1, "e1", "act")
    history.drop_through_seq(2)  # the later run finished
    assert history.recorded_resume(2) == 1 and not history.recorded_calls(2, "e2", "act")


def test_giving_up_on_a_recorded_resume_drops_it_with_the_later_records():
    history = _history()
    dropped = history.drop_after(RunPosition(2, 2**62 - 1))  # order.give_up after accepted seq 2
    assert dropped >= 2 and history.recorded_resume(2) is None and history.recorded_input(3) is None
    kept = _history()
    kept.drop_after(RunPosition(2, 2**62))  # another input at seq 3: the resume before it stays
    assert kept.recorded_resume(2) == 1


def test_resume_history_takes_the_seq_and_its_resume_record_from_the_recovered_history():
    class Asks(Agent):
        @action(InputEvent)
        def ask(event, ctx):
            ctx.send_event(OutputEvent(output=ctx.wait_for("ok?", {"n": event.input})))

    waiting = execute_run(Asks(), RunInput("k", 0, 1, 1), {}).waiting
    recovered = _history(wait_id=waiting.wait.wait_id)
    recovered.held = frozenset({5})
    history = resume_history(waiting, recovered)
    assert history.recorded_calls(1, "e1", "act")[1] is not None  # merged into the resumed run's history
    assert recovered.recorded_resume(2) is None and recovered.recorded_input(3) == "in3"


class Remembers(Agent):
    @action(InputEvent)
    def remember(event, ctx):
        seen = ctx.call("peek", ctx.memory.get("seen", []))
        ctx.memory.set(f"by_input.{event.input}", True)
        decision = ctx.wait_for("ok?", {"n": event.input})
        ctx.memory.set("seen", [*seen, event.input])
        ctx.memory.set("last", decision.approved)
        ctx.send_event(OutputEvent(output=seen))


def _agent() -> Remembers:
    return Remembers(resources={"peek": Tool(lambda seen: list(seen), side_effects="none")})


def test_a_resumed_run_hands_back_every_memory_write_in_order_and_journals_where_it_resumed():
    store = MemoryJournalStore(4)
    codec = RecordCodec(b"resumed-records-signing-key-0123", "resumes")
    writer = JournalWriter(store, codec, "per_run")
    waiting = execute_run(_agent(), RunInput("k", 1, 1, "a"), {"seen": ["x"]}, journal=writer.run_journal(1)).waiting
    resumed = RunInput("k", 1, 1, "a", decisions={waiting.wait.wait_id: Decision.approve()}, resuming=True,
                       resumed_after=4)
    result = execute_run(_agent(), resumed, {"seen": ["x"]}, history=resume_history(waiting),
                         journal=writer.run_journal(1))
    writer.close()
    assert result.waiting is None and result.outputs[0].output == ["x"]
    assert [(u.path, u.value) for u in result.memory_updates] == [
        ("by_input.a", True), ("seen", ["x", "a"]), ("last", True)]
    recovered = read_recovery_index(store, codec, dict.fromkeys(range(4), 0), store.end_offsets(range(4)))
    history = recovered.history(key_digest("k"))
    assert history.recorded_resume(4) == 1 and history.recorded_input(1) is not None  # one accepted record
