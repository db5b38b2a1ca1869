"""Waits in the capture and the replay diff (issue 35): a parked run is captured, a replay leaves open a wait
production never decided in a run it never finished, and the diff shows each run's waits and decisions on both
sides, the runs still waiting at the end of the replay, and the decisions a replay changed.

The engine, the capture observer and the replay's gate run for real, on an in-memory capture topic; only the
Kafka read of the replay's mode is replaced by a read of that topic.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from pathlib import Path

import pytest

from flink_agents_replay.api.agent import Agent, Event, InputEvent, OutputEvent, action
from flink_agents_replay.api.resources import Tool
from flink_agents_replay.core.keygroups import key_group
from flink_agents_replay.engine import RunInput, execute_run
from flink_agents_replay.engine.run import resume_history
from flink_agents_replay.flink.capture_observer import CaptureObserver
from flink_agents_replay.replay import mode as mode_module
from flink_agents_replay.replay.diff import NOTE_PRODUCTION_WAITING, WaitEntry, WaitRow, compare, pair_waits, waits_of
from flink_agents_replay.replay.gate import ReplayCalls
from flink_agents_replay.replay.mode import ReplayMode
from flink_agents_replay.replay.policy import CallPolicy, WaitPolicy
from flink_agents_replay.replay.settings import ReplaySettings
from flink_agents_replay.storage.capture.manifest import CaptureDescription
from flink_agents_replay.storage.capture.reader import CaptureDecoder
from flink_agents_replay.storage.capture.records import (
    SIGNED_KEY,
    CapturedInput,
    CapturedOutput,
    CapturedParked,
    CapturedRun,
)
from flink_agents_replay.storage.capture.schemas import CAPTURE_SCHEMAS, CAPTURED_PARKED, capture_codec
from flink_agents_replay.storage.capture.writer import CaptureWriter
from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore
from flink_agents_replay.storage.records.journal import CallOutcome, CallRecord, key_digest
from flink_agents_replay.storage.records.waits import Decision, WaitOpened

KEY = b"replay-waits-diff-signing-key-0123"
UID = "refunds-op"
PARTITIONS = 4
ANA = Decision.approve("fine", by="ana")


class Reviewed(Event):
    pass


def refund_agent(calls: Counter) -> Agent:
    """Looks the order up, asks for approval of the amount, then pays (external) or answers it was denied."""

    def tool(name):
        def invoke(*args):
            calls[name] += 1
            return f"{name}{args}"
        return invoke

    class Refunds(Agent):
        @action(InputEvent)
        def assess(event, ctx):
            ctx.send_event(Reviewed(order=ctx.call("lookup", event.input["order"]), amount=event.input["amount"]))

        @action(Reviewed)
        def refund(event, ctx):
            decision = ctx.wait_for("refund-approval", {"order": event.order, "amount": event.amount},
                                    timeout_s=3600)
            if decision.approved:
                ctx.send_event(OutputEvent(output=["paid", ctx.call("payments", event.order, event.amount)]))
            else:
                ctx.send_event(OutputEvent(output=["denied", decision.reason]))

    return Refunds(name="refunds", resources={
        "lookup": Tool(tool("lookup"), side_effects="none"),
        "payments": Tool(tool("payments"), side_effects="external")})


class Capture:
    """A capture topic in memory, written by the operator's observer, read back verified."""

    def __init__(self, topic: str):
        self.store = MemoryJournalStore(PARTITIONS, topic=topic)
        description = CaptureDescription(UID, topic, "STRING", PARTITIONS, 3)
        self.observer = CaptureObserver(writer=CaptureWriter(self.store, capture_codec(KEY, UID), description, None,
                                                             timeout_s=1.0), agent="agent")

    def records(self) -> list:
        decoder = CaptureDecoder(KEY, UID, key_type="STRING", max_parallelism=PARTITIONS)
        return [decoder.decode(value, topic=self.store.topic, partition=partition)
                for partition in range(PARTITIONS) for _, value in self.store.records(partition)]

    def of(self, kind) -> list:
        return [record for record in self.records() if isinstance(record, kind)]


def group(key: str) -> int:
    return key_group(key, "STRING", PARTITIONS)


def order(n: int) -> dict:
    return {"order": f"o-{n}", "amount": 100 + n}


def production(calls: Counter) -> Capture:
    """Key ``k``: input 1 waits and is approved (finished); input 2 waits and is never decided (the capture ends
    with it parked)."""
    capture, agent = Capture("prod.capture"), refund_agent(calls)
    for seq in (1, 2):
        run = RunInput("k", group("k"), seq, order(seq))
        capture.observer.input_accepted(key="k", group=group("k"), seq=seq, value=run.input, event_time=None)
        result = execute_run(agent, run, {})
        capture.observer.run_parked(key="k", group=group("k"), result=result)
        if seq == 1:
            resumed = RunInput("k", group("k"), seq, run.input, decisions={result.waiting.wait.wait_id: ANA},
                               resuming=True)
            done = execute_run(agent, resumed, {}, history=resume_history(result.waiting))
            capture.observer.run_applied(key="k", group=group("k"), result=done)
    return capture


def replay_mode(prod: Capture, wait_policy: WaitPolicy, monkeypatch) -> ReplayMode:
    """A replay's mode that loads production's calls from the in-memory capture (in place of Kafka)."""
    monkeypatch.setattr(mode_module, "read_capture", lambda *args, **kwargs: iter(prod.records()))
    settings = ReplaySettings(prod.store.topic, {p: 0 for p in range(PARTITIONS)}, None,
                              policies={"*": CallPolicy.RECORDED}, wait_policy=wait_policy)
    mode = ReplayMode(settings=settings, kafka={"bootstrap.servers": "unused:9092"}, signing_key=KEY, uid=UID,
                      journal_topic="replay.journal", max_parallelism=PARTITIONS, read_production_journal=False,
                      kafka_timeout_s=1.0, name="replay.capture")
    mode.open(owned=range(PARTITIONS), subtask=0, counters={})
    return mode


def replay(prod: Capture, wait_policy: WaitPolicy, calls: Counter, monkeypatch) -> Capture:
    """The replay of both inputs, as the operator runs them: each run gated, applied or parked, and captured."""
    mode, capture, agent = replay_mode(prod, wait_policy, monkeypatch), Capture("replay.capture"), refund_agent(calls)
    for seq in (1, 2):
        run = RunInput("k", group("k"), seq, order(seq))
        capture.observer.input_accepted(key="k", group=group("k"), seq=seq, value=run.input, event_time=None)
        result = execute_run(agent, run, {}, gate=mode.gate_for(key_digest("k"), seq), report_failures=True)
        if result.waiting is not None:
            capture.observer.run_parked(key="k", group=group("k"), result=result)
        else:
            capture.observer.run_applied(key="k", group=group("k"), result=result)
    return capture


def diff(prod: Capture, replayed: Capture):
    return compare(prod.of((CapturedRun, CapturedParked)), replayed.of((CapturedRun, CapturedParked)),
                   replayed.of(CapturedInput))


# -- the capture ------------------------------------------------------------------------------------------------
def test_a_parked_run_is_captured_with_its_wait_and_its_calls_so_far():
    prod = production(Counter())
    parked = prod.of(CapturedParked)
    assert [(p.key, p.seq, p.action, p.wait.name, p.wait.payload) for p in parked] == [
        ("k", 1, "refund", "refund-approval", {"order": "lookup('o-1',)", "amount": 101}),
        ("k", 2, "refund", "refund-approval", {"order": "lookup('o-2',)", "amount": 102})]
    second = parked[1]
    assert second.key_group == group("k") and second.input_digest == prod.of(CapturedInput)[1].input_digest
    assert [call.resource for call in second.calls] == ["lookup", "@wait"]  # the lookup before the wait, and it
    assert second.calls[-1].result == second.wait and second.wait.wait_id.startswith("refunds:refund:2:")
    assert [(r.seq, r.outputs[0].output[0]) for r in prod.of(CapturedRun)] == [(1, "paid")]


def test_the_parked_kind_is_a_capture_schema_and_round_trips_every_field():
    assert CAPTURE_SCHEMAS[CAPTURED_PARKED].version == 1
    wait = WaitOpened("w-1", "refund-approval", {"amount": 5, "lines": [1, 2]}, 1_700_000_360_000, 1_700_000_000_000)
    call = CallRecord(3, 1, "ev-2", "refund", 0, "@wait", "args", CallOutcome.RETURNED, wait, "in-3")
    parked = CapturedParked(("tuple", "key"), 3, "in-3", "refund", "ev-2", wait, [call], key_group=1)
    codec = capture_codec(KEY, UID)
    value = codec.encode(SIGNED_KEY, CAPTURED_PARKED, parked, topic="t", partition=None)
    assert b"flink_agents_replay" not in value  # plain data: names no module of the package
    assert CaptureDecoder(KEY, UID).decode(value, topic="t", partition=1) == parked


def test_a_reader_skips_a_capture_kind_it_does_not_know(monkeypatch):
    """What 0.6's reader does with 0.7's parked records: a reader skips a kind it does not know."""
    from flink_agents_replay.storage.capture import reader

    value = capture_codec(KEY, UID).encode(SIGNED_KEY, CAPTURED_PARKED, production(Counter()).of(CapturedParked)[0],
                                           topic="t", partition=None)
    assert isinstance(CaptureDecoder(KEY, UID).decode(value, topic="t"), CapturedParked)
    monkeypatch.delitem(reader._KINDS, CAPTURED_PARKED)
    assert CaptureDecoder(KEY, UID).decode(value, topic="t") is None


def test_the_compat_fixture_of_0_7_0_holds_a_parked_run_that_reads_back():
    fixture = json.loads((Path(__file__).parents[1] / "fixtures/compat/v0_7_0/records.json").read_text())
    entry = fixture["capture"]["captured_parked"]
    codec = capture_codec(base64.b64decode(fixture["signing_key"]), fixture["producer"])
    parked = codec.decode(base64.b64decode(entry["record_key"]), base64.b64decode(entry["value"]),
                          topic=entry["topic"], partition=None).payload
    assert isinstance(parked, CapturedParked)
    assert (parked.key, parked.seq, parked.input_digest, parked.action, parked.event_id) == (
        "customer:1", 2, "in-2", "refund", "ev-2")
    assert parked.wait == WaitOpened("triage:refund:2:1:0123456789abcdef01234567", "refund-approval",
                                     {"order": "O-2", "amount": 240}, 1_700_000_360_000, 1_700_000_000_000)
    assert [call.resource for call in parked.calls] == ["@wait", "@decision", "@wait"]
    assert parked.calls[1].result == Decision(approved=True, reason="ok", by="ana")
    assert parked.blocked[0].resource == "mailer" and parked.key_group == 1


# -- the replay's gate -------------------------------------------------------------------------------------------
def test_a_wait_production_never_decided_in_a_run_it_never_finished_stays_open_in_a_replay():
    gate = ReplayCalls({"*": CallPolicy.LIVE}, {}, production_finished=False)
    result = execute_run(refund_agent(Counter()), RunInput("k", 0, 1, order(1)), {}, gate=gate,
                         report_failures=True)
    assert result.error is None and result.blocked == []
    assert result.waiting is not None and result.waiting.wait.name == "refund-approval"


def test_a_wait_production_finished_the_run_without_is_blocked_in_a_replay():
    gate = ReplayCalls({"*": CallPolicy.LIVE}, {}, production_finished=True)  # the new code asks another question
    result = execute_run(refund_agent(Counter()), RunInput("k", 0, 1, order(1)), {}, gate=gate,
                         report_failures=True)
    assert result.waiting is None and "got no decision: production recorded none" in result.error
    assert [b.resource for b in result.blocked] == ["@decision"]


def test_the_replays_mode_knows_which_runs_production_finished_and_serves_a_parked_runs_calls(monkeypatch):
    mode = replay_mode(production(Counter()), WaitPolicy.RECORDED, monkeypatch)
    finished, parked = mode.gate_for(key_digest("k"), 1), mode.gate_for(key_digest("k"), 2)
    assert finished.production_finished and not parked.production_finished
    assert sorted(call.resource for call in finished.recorded.values()) == ["@decision", "@wait", "lookup",
                                                                            "payments"]
    assert sorted(call.resource for call in parked.recorded.values()) == ["@wait", "lookup"]
    assert not mode.gate_for(key_digest("other"), 1).production_finished


# -- the diff ----------------------------------------------------------------------------------------------------
def test_a_recorded_replay_shows_each_runs_waits_and_decisions_and_the_wait_still_open(monkeypatch):
    prod_calls, replay_calls = Counter(), Counter()
    prod = production(prod_calls)
    replayed = replay(prod, WaitPolicy.RECORDED, replay_calls, monkeypatch)
    assert replay_calls == Counter(), "every call, the lookup before the open wait too, served from production's"
    assert [(p.seq, p.wait.name) for p in replayed.of(CapturedParked)] == [(2, "refund-approval")]
    report = diff(prod, replayed)
    first, second = report.runs
    assert (first.seq, first.status, second.seq, second.status) == (1, "same", 2, "waiting")
    assert [(row.asks, row.production.describe(), row.replay.describe(), row.change) for row in first.waits] == [
        ('refund-approval {"amount": 101, "order": "lookup(\'o-1\',)"}', "approved by ana: fine",
         "approved by ana: fine", "same")]
    assert [(row.production.outcome, row.replay.outcome, row.change) for row in second.waits] == [
        ("still waiting", "still waiting", "still waiting")]
    assert second.open_wait.wait_id == prod.of(CapturedParked)[1].wait.wait_id
    assert second.note == NOTE_PRODUCTION_WAITING and second.replay == [] and second.error is None
    summary = report.summary
    assert (summary["waiting"], summary["waits"], summary["decisions_changed"]) == (1, 2, 0)
    assert not report.has_differences, "production waits at the same question: nothing differs"

    text = report.render_text(max_width=130)
    assert "Still waiting (1)" in text and "Waits and decisions (2)" in text
    still = text.split("Still waiting (1)")[1].split("Waits and decisions")[0]
    assert "refund-approval" in still and second.open_wait.wait_id in still and "still waiting" in still
    assert "approved by ana: fine" in text
    as_json = report.to_json()
    assert as_json["summary"]["waiting"] == 1
    assert [run["status"] for run in as_json["runs"]] == ["same", "waiting"]
    assert as_json["runs"][1]["waits"][0]["replay"]["outcome"] == "still waiting"
    assert as_json["runs"][0]["waits"][0]["production"]["decision"]["by"] == "ana"
    assert json.loads(json.dumps(as_json)) == as_json
    page = report.render_html()
    assert "Still waiting (1)" in page and "status-waiting" in page and "approved by ana: fine" in page


def test_a_replay_that_denies_every_wait_shows_each_changed_decision(monkeypatch):
    prod_calls, replay_calls = Counter(), Counter()
    report = diff(production(prod_calls), replay(production(Counter()), WaitPolicy.DENY, replay_calls, monkeypatch))
    first, second = report.runs
    assert (first.status, second.status) == ("changed", "new"), report.render_text()
    assert [(row.production.describe(), row.replay.describe(), row.change) for row in first.waits] == [
        ("approved by ana: fine", "denied by replay: the replay's wait policy denies every wait", "changed")]
    # Production was still waiting; the replay denied it and finished the run.
    assert [(row.production.outcome, row.replay.outcome, row.change) for row in second.waits] == [
        ("still waiting", "denied", "production waiting")]
    assert second.note == NOTE_PRODUCTION_WAITING
    assert (report.summary["waiting"], report.summary["decisions_changed"]) == (0, 2)
    assert report.has_differences
    text = report.render_text(max_width=150)
    assert "Still waiting (0)" in text and "production waiting" in text and "changed" in text
    assert replay_calls["payments"] == 0


def test_a_run_the_replay_leaves_waiting_where_production_finished_or_asked_otherwise_differs():
    wait = WaitOpened("w-2", "refund-approval", {"amount": 7}, None, 0)
    parked = CapturedParked("k", 1, "d", "refund", "ev", wait, [
        CallRecord(1, 1, "ev", "refund", 0, "@wait", "a", CallOutcome.RETURNED, wait, "d")])
    report = compare([], [parked], [])
    [only] = report.runs
    assert (only.status, [row.change for row in only.waits]) == ("waiting", ["replay only"])
    # Production has no record: it had not finished the run either (found by the review: this failed the diff).
    assert not report.has_differences and report.waiting == [only] and report.differing == []
    finished = CapturedRun("k", 1, "d", [CapturedOutput("o", "done")], [], [], None)
    report = compare([finished], [parked], [])
    assert report.has_differences and [row.change for row in report.runs[0].waits] == ["replay only"]


def test_a_report_without_waits_says_so_in_one_line():
    run = CapturedRun("k", 1, "d")
    text = compare([run], [run], []).render_text()
    assert "Waits: none, no run reached a wait on either side" in text and "Still waiting" not in text


@pytest.mark.parametrize(("decision", "described"), [
    (Decision(timed_out=True, approved=False, reason="no decision in time"), "timed out: no decision in time"),
    (Decision(value={"amount": 60}, by="bo"), 'decided by bo (value {"amount": 60})'),
    (None, "no decision")])
def test_a_wait_describes_its_outcome(decision, described):
    assert WaitEntry("w", "a", "n", {}, decision).describe() == described


def test_waits_pair_by_what_they_ask_in_order():
    def waits(*asked):
        calls = []
        for position, (name, decision) in enumerate(asked):
            wait = WaitOpened(f"w-{name}-{position}", name, {}, None, 0)
            calls.append(CallRecord(1, 0, "ev", "act", 2 * position, "@wait", name, CallOutcome.RETURNED, wait, "d"))
            if decision is not None:
                calls.append(CallRecord(1, 0, "ev", "act", 2 * position + 1, "@decision", name, CallOutcome.RETURNED,
                                        decision, "d"))
        return waits_of(calls)

    rows = pair_waits(waits(("a", ANA), ("b", ANA)), waits(("b", ANA), ("c", Decision.deny())))
    assert [(row.asks, row.change) for row in rows] == [("a {}", "production only"), ("b {}", "same"),
                                                         ("c {}", "replay only")]


def test_the_replays_source_passes_a_parked_record_over():
    """Production's parked record is no input, and no end of a run: a run the savepoint holds parked stays so."""
    from flink_agents_replay.replay.job import CapturedInputParser

    parse = CapturedInputParser(KEY, UID, topic="prod.capture", key_type="STRING", max_parallelism=PARTITIONS)
    prod = production(Counter())
    values = [value for partition in range(PARTITIONS) for _, value in prod.store.records(partition)]
    kinds = [type(parse(value, None)[0]).__name__ for value in values]
    assert kinds == ["CapturedInput", "NoneType", "CapturedRunEnd", "CapturedInput", "NoneType"]
    assert all(parse(value, None)[1] is None for value in values)


def test_the_same_outcome_decided_by_someone_else_is_the_same_decision():
    """Found by the review: production's "approved by ana" against a replay's approve-all counted as changed."""
    production = WaitEntry("w", "a", "n", {}, Decision.approve(by="ana", reason="fine"))
    assert WaitRow(production, WaitEntry("w", "a", "n", {}, Decision.approve(by="replay"))).change == "same"
    assert WaitRow(production, WaitEntry("w", "a", "n", {}, Decision.deny("replay"))).change == "changed"
    timed_out = WaitEntry("w", "a", "n", {}, Decision(timed_out=True, by="timeout"))
    assert WaitRow(production, timed_out).change == "changed"
