"""The operator's bookkeeping of waits (``flink/waits.py``) on fake keyed state and timers: parking, decisions
applied, early, duplicate, unmatched, rejected and bounded, deadlines, and the per-group count of parked runs."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action
from flink_agents_replay.engine import RunInput, execute_run
from flink_agents_replay.engine.run import resume_history
from flink_agents_replay.flink import waits as waits_module
from flink_agents_replay.flink.signals import MalformedSignal, Signal, parse_signal
from flink_agents_replay.flink.waits import OperatorWaits
from flink_agents_replay.storage.records.journal import CallOutcome, CallRecord
from flink_agents_replay.storage.records.parked import decode_decision
from flink_agents_replay.storage.records.waits import Decision


class _Value:
    def __init__(self):
        self.stored = None

    def value(self):
        return self.stored

    def update(self, value):
        self.stored = value

    def clear(self):
        self.stored = None


class _Map(dict):
    def get(self, key):
        return super().get(key)

    def put(self, key, value):
        self[key] = value

    def contains(self, key):
        return key in self

    def remove(self, key):
        del self[key]

    def is_empty(self):
        return not self


class _Context:
    def __init__(self):
        self.timers: list[int] = []

    def get_state(self, descriptor):
        return _Value()

    def get_map_state(self, descriptor):
        return _Map()

    def timer_service(self):
        return self

    def register_processing_time_timer(self, when):
        self.timers.append(when)


class _Counter:
    def __init__(self):
        self.count = 0

    def inc(self, n=1):
        self.count += n


class Asks(Agent):
    @action(InputEvent)
    def ask(event, ctx):
        ctx.send_event(OutputEvent(output=ctx.wait_for("ok?", {"n": event.input}, timeout_s=60)))


def waits(max_early: int = 3, time_out: bool = True):
    counters = {name: _Counter() for name in ("waits_opened", "waits_timed_out", "decisions_applied",
                                              "decisions_early", "decisions_ignored", "decisions_unmatched",
                                              "decisions_rejected", "runs_waiting")}
    resumed = []
    context = _Context()
    operator_waits = OperatorWaits(agent_name="asks", event_types=Asks().event_types(), runtime_context=context,
                                   counters=counters, ttl_s=10, max_early=max_early, time_out=time_out,
                                   resume=lambda key, run, decision, ctx: resumed.append((key, run.seq, decision)))
    return operator_waits, counters, resumed, context


def parked(operator_waits, context, seq=1):
    result = execute_run(Asks(), RunInput("k", 3, seq, seq), {})
    events = list(operator_waits.park("k", 3, result.waiting, context))
    return result.waiting, events


def kinds(events) -> list[str]:
    return [event.kind for event in events]


def test_a_parked_run_is_resumed_once_by_its_decision_and_a_duplicate_is_ignored():
    operator_waits, counters, resumed, context = waits()
    waiting, events = parked(operator_waits, context)
    assert kinds(events) == ["opened"] and events[0].payload == {"n": 1} and events[0].name == "ok?"
    assert context.timers == [waiting.wait.deadline_ms] and counters["runs_waiting"].count == 1
    signal = Signal("k", waiting.wait.wait_id, Decision.approve(by="ana"))
    assert kinds(operator_waits.on_signal(signal, context)) == ["resumed"]
    assert kinds(operator_waits.on_signal(signal, context)) == ["decision_ignored"]
    assert resumed == [("k", 1, Decision.approve(by="ana"))]
    assert kinds(operator_waits.finished("k", 3, 1, context)) == ["closed"]
    assert counters["runs_waiting"].count == 0 and operator_waits.open_by_group == {3: 0}
    assert kinds(operator_waits.on_signal(signal, context)) == ["decision_ignored"]  # still known once closed
    assert (counters["decisions_applied"].count, counters["decisions_ignored"].count) == (1, 2)


def test_an_early_decision_is_kept_and_applied_when_its_wait_opens():
    operator_waits, counters, resumed, context = waits()
    wait_id = execute_run(Asks(), RunInput("k", 3, 1, 1), {}).waiting.wait.wait_id  # the id it will have
    assert kinds(operator_waits.on_signal(Signal("k", wait_id, Decision.deny("no")), context)) == ["decision_early"]
    _, events = parked(operator_waits, context)
    assert kinds(events) == ["opened", "resumed"] and resumed[0][2] == Decision.deny("no")
    assert counters["decisions_early"].count == 1


def test_early_decisions_expire_as_unmatched_and_are_bounded_per_key():
    operator_waits, counters, _, context = waits(max_early=2)
    for n in range(2):
        assert kinds(operator_waits.on_signal(Signal("k", f"w{n}", Decision.approve()), context)) == [
            "decision_early"]
    refused = list(operator_waits.on_signal(Signal("k", "w2", Decision.approve()), context))
    assert kinds(refused) == ["decision_rejected"] and "max_early_decisions_per_key" in refused[0].reason
    assert kinds(operator_waits.on_timer("k", min(context.timers) - 1, context)) == []
    assert kinds(operator_waits.on_timer("k", max(context.timers), context)) == ["decision_unmatched"] * 2
    assert len(operator_waits.decisions) == 0 and counters["decisions_unmatched"].count == 2


def test_a_deadline_resumes_the_run_with_a_timeout_and_a_later_decision_is_a_duplicate():
    operator_waits, counters, resumed, context = waits()
    waiting, _ = parked(operator_waits, context)
    assert kinds(operator_waits.on_timer("k", waiting.wait.deadline_ms - 1, context)) == []
    assert kinds(operator_waits.on_timer("k", waiting.wait.deadline_ms, context)) == ["resumed"]
    assert resumed[0][2].timed_out and counters["waits_timed_out"].count == 1
    late = Signal("k", waiting.wait.wait_id, Decision.approve())
    assert kinds(operator_waits.on_signal(late, context)) == ["decision_ignored"]


def test_a_decision_made_after_the_deadline_loses_to_the_timeout_though_its_timer_has_not_fired_yet(monkeypatch):
    """After a restore (the deadline passed while the job was down) the late decision can come before the timer:
    before, it was applied (the demo saw approvals sent after their timeout resume their runs)."""
    operator_waits, counters, resumed, context = waits()
    waiting, _ = parked(operator_waits, context)
    deadline = waiting.wait.deadline_ms
    monkeypatch.setattr(waits_module, "_now_ms", lambda: deadline + 3500)  # received after the deadline too
    late = Signal("k", waiting.wait.wait_id, Decision(approved=True, by="ana", decided_at_ms=deadline + 3000))
    events = list(operator_waits.on_signal(late, context))
    assert kinds(events) == ["resumed", "decision_ignored"] and "after the wait's deadline" in events[1].reason
    assert resumed[0][2].timed_out and resumed[0][2].decided_at_ms == deadline
    assert (counters["waits_timed_out"].count, counters["decisions_applied"].count) == (1, 0)
    assert kinds(operator_waits.on_timer("k", deadline, context)) == []  # the timer finds it decided


def test_a_decision_sent_in_time_is_applied_though_it_arrives_after_the_deadline(monkeypatch):
    operator_waits, counters, resumed, context = waits()
    waiting, _ = parked(operator_waits, context)
    monkeypatch.setattr(waits_module, "_now_ms", lambda: waiting.wait.deadline_ms + 60_000)  # the job was down
    in_time = Signal("k", waiting.wait.wait_id, Decision(approved=True, decided_at_ms=waiting.wait.deadline_ms - 1))
    assert kinds(operator_waits.on_signal(in_time, context)) == ["resumed"]
    assert not resumed[0][2].timed_out and counters["decisions_applied"].count == 1


def test_a_decision_received_in_time_counts_though_its_senders_clock_runs_fast():
    operator_waits, counters, resumed, context = waits()
    waiting, _ = parked(operator_waits, context)
    skewed = Signal("k", waiting.wait.wait_id, Decision(approved=True, decided_at_ms=waiting.wait.deadline_ms + 2000))
    assert kinds(operator_waits.on_signal(skewed, context)) == ["resumed"] and not resumed[0][2].timed_out


def test_an_early_decision_made_after_the_deadline_times_the_wait_out_when_the_run_reaches_it(monkeypatch):
    operator_waits, counters, resumed, context = waits()
    wait = execute_run(Asks(), RunInput("k", 3, 1, 1), {}).waiting.wait  # the wait it will reach again
    # A minute past the deadline: the wait opened again below gets its deadline anew, a few ms later.
    monkeypatch.setattr(waits_module, "_now_ms", lambda: wait.deadline_ms + 60_000)
    late = Signal("k", wait.wait_id, Decision(approved=True, decided_at_ms=wait.deadline_ms + 60_000))
    assert kinds(operator_waits.on_signal(late, context)) == ["decision_early"]
    _, events = parked(operator_waits, context)
    assert kinds(events) == ["opened", "resumed", "decision_ignored"] and resumed[0][2].timed_out


def test_a_malformed_decision_is_reported_not_raised():
    operator_waits, counters, _, context = waits()
    events = list(operator_waits.on_signal(parse_signal("k", b'{"approved": true}'), context))
    assert kinds(events) == ["decision_rejected"] and "needs a wait_id" in events[0].reason
    assert counters["decisions_rejected"].count == 1


@pytest.mark.parametrize(("raw", "reason"), [
    (b"not json", "Expecting value"),
    (b"[1, 2]", "a decision is a JSON object, not list"),
    ({"wait_id": "w", "approved": "yes"}, "approved is true, false or absent"),
    ({"wait_id": "w", "v": 9}, "decision format version 9"),
    ({"wait_id": "w", "value": float("nan")}, "Out of range float values"),
    ({"wait_id": "w", "sent_at_ms": "today"}, "sent_at_ms is a number"),
])
def test_decisions_that_cannot_be_read_say_why(raw, reason):
    parsed = parse_signal("k", raw)
    assert isinstance(parsed, MalformedSignal) and reason in parsed.reason


def test_a_decision_reads_from_json_with_every_field():
    parsed = parse_signal("k", '{"wait_id": "w", "approved": false, "reason": "no", "by": "ana", "value": [1], '
                               '"signal_id": "s1", "sent_at_ms": 5}')
    assert parsed == Signal("k", "w", Decision(approved=False, value=[1], reason="no", by="ana", decided_at_ms=5), "s1")


def test_the_parked_count_restores_per_key_group():
    operator_waits, counters, _, _ = waits()
    operator_waits.restored({3: 2, 9: 1})
    assert counters["runs_waiting"].count == 3 and Counter(operator_waits.open_by_group) == Counter({3: 2, 9: 1})


def test_in_a_replay_deadlines_do_not_fire_and_production_finishing_the_run_resumes_it_for_the_gate_to_decide():
    operator_waits, counters, resumed, context = waits(time_out=False)
    waiting, _ = parked(operator_waits, context)
    assert context.timers == []  # no deadline timer: production's decisions, timeouts included, are recorded
    assert kinds(operator_waits.on_timer("k", waiting.wait.deadline_ms + 1, context)) == []
    operator_waits.resume_in_replay("k", 2, context)  # another seq: not this run
    assert resumed == []
    operator_waits.resume_in_replay("k", 1, context)
    operator_waits.resume_in_replay("k", 1, context)  # once
    assert resumed == [("k", 1, None)]  # no decision handed in: the replay's gate decides
    assert operator_waits.decision_for(1) == (waiting, None)  # after a restore too: resumed, the gate decides


@pytest.mark.parametrize("field", ["wait_id", "reason", "by", "signal_id"])
def test_a_decision_with_a_lone_surrogate_is_rejected_before_it_reaches_state(field):
    """Valid JSON ("\\ud800"), but no Java or msgpack string: kept in state it failed the TaskManager (found by the
    adversarial check)."""
    record = {"wait_id": "w", field: "\ud800"}
    parsed = parse_signal("k", json.dumps(record))
    assert isinstance(parsed, MalformedSignal) and f"{field} is not valid Unicode" in parsed.reason
    parsed.raw.encode("utf-8")  # the event's text is safe to write anywhere
    operator_waits, counters, _, context = waits()
    assert kinds(operator_waits.on_signal(parsed, context)) == ["decision_rejected"]
    assert len(operator_waits.decisions) == 0


def test_a_decision_nesting_too_deeply_is_rejected_not_raised():
    deep = '{"wait_id": "w", "value": ' + "[" * 5000 + "]" * 5000 + "}"
    parsed = parse_signal("k", deep)
    assert isinstance(parsed, MalformedSignal) and "nests too deeply" in parsed.reason


def test_closed_decisions_expire_at_their_own_timer_and_a_run_waiting_again_closes_its_first_wait():
    operator_waits, _, resumed, context = waits()
    first, _ = parked(operator_waits, context)
    list(operator_waits.on_signal(Signal("k", first.wait.wait_id, Decision.approve()), context))
    second = execute_run(Asks(), RunInput("k", 3, 1, 2), {})  # stands for the same run waiting a second time
    list(operator_waits.park("k", 3, second.waiting, context))
    assert operator_waits._decision(first.wait.wait_id).status.value == "closed"
    assert operator_waits.open_by_group == {3: 1}  # still one parked run
    list(operator_waits.on_signal(Signal("k", second.waiting.wait.wait_id, Decision.deny()), context))
    list(operator_waits.finished("k", 3, 1, context))
    assert {decode_decision(raw).status.value for raw in operator_waits.decisions.values()} == {"closed"}
    assert kinds(operator_waits.on_timer("k", max(context.timers), context)) == []
    assert len(operator_waits.decisions) == 0  # both dropped at their timers


def test_the_closed_event_names_the_decision_the_run_used_which_a_restore_may_have_taken_from_the_journal():
    operator_waits, _, _, context = waits()
    waiting, _ = parked(operator_waits, context)
    list(operator_waits.on_signal(Signal("k", waiting.wait.wait_id, Decision.approve(by="ana")), context))
    journaled = Decision(timed_out=True, by="timeout")  # what an earlier attempt journaled: the effects follow it
    resumed = RunInput("k", 3, 1, 1, decisions={waiting.wait.wait_id: Decision.approve(by="ana")}, resuming=True)
    history = resume_history(waiting)
    opened = next(r for r in waiting.records if getattr(r, "resource", "") == "@wait")
    history.add_call(CallRecord(1, 0, waiting.event_id, waiting.action, 1, "@decision", opened.args_digest,
                                CallOutcome.RETURNED, journaled, opened.input_digest))
    result = execute_run(Asks(), resumed, {}, history=history)
    [closed] = operator_waits.finished("k", 3, 1, context, calls=result.calls)
    assert closed.kind == "closed" and closed.decision == journaled
