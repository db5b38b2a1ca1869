"""``later_inputs_while_waiting="run"`` on the real operator (``flink/operator.py``), driven without Flink by
``tests/harness/operator_sim.py``: fake keyed state and timers, a clock that moves only when a test moves it,
completion wake-ups over a real pipe, and the journal in memory so that it survives simulated failovers.

A run that stops at ``ctx.wait_for`` with no decision is kept aside (its input and the key's memory as it started)
and the key's later inputs run; its decision (or its deadline) resumes it once the key is idle; its memory writes go
over the key's memory then. After a failover, order restoration must put a recorded resume back where it was in the
key's order, so that the later runs see the same memory and reuse their calls. Every external call is counted in the
tools (:class:`Effects`).
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator

import pytest

from flink_agents_replay import Agent, Decision, InputEvent, OutputEvent, Tool, action
from tests.harness.operator_sim import OperatorSim, SimWorld

K = "k"
#: The key's order waits this long for a recorded input or resume after a restore (the default).
ORDER_TIMEOUT_MS = 30_000


# -- the agent and its counted tools ----------------------------------------------------------------------------
class Effects:
    """The tools' side of the world: every call counted by (tool, arguments); ``act`` can be made to block."""

    def __init__(self) -> None:
        self.calls: Counter = Counter()
        self.block_act_of: int | None = None  # the input whose `act` call blocks (after its effect) until released
        self.entered = threading.Event()
        self.proceed = threading.Event()

    def tool(self, name: str):
        def call(n, *rest):
            self.calls[(name, json.dumps([n, *rest], sort_keys=True))] += 1
            if name == "act" and n == self.block_act_of:
                self.entered.set()
                if not self.proceed.wait(10):
                    raise AssertionError("the blocked call was never released")
            return {"tool": name, "n": n, "args": list(rest)}

        return call

    def made(self, name: str, n: int | None = None) -> int:
        """How many times ``name`` was called (for input ``n``), whatever the arguments."""
        return sum(count for (tool, args), count in self.calls.items()
                   if tool == name and (n is None or json.loads(args)[0] == n))

    def repeated(self) -> dict:
        """The calls made more than once with the same arguments."""
        return {call: count for call, count in self.calls.items() if count > 1}


class Approvals(Agent):
    """One action, told by its input what to do:

    ``{"n": 1, "wait": True, "timeout_s": 60, "read": [paths], "write": {path: value}, "delete": [paths]}``:
    call ``lookup``; wait for an approval if asked (a timeout denies); read, write and delete memory (after the
    wait); call ``act`` with what it read, then ``notify``; send one output saying what it saw.
    """

    @action(InputEvent)
    def handle(event, ctx):
        item = event.input
        n = item["n"]
        ctx.call("lookup", n)
        decision = None
        if item.get("wait"):
            decision = ctx.wait_for("approve", {"n": n}, timeout_s=item.get("timeout_s", 3600),
                                    on_timeout=Decision.deny("timed out", by="timeout"))
            ctx.memory.set(f"decided.n{n}", decision.approved)
        seen = {path: ctx.memory.get(path) for path in item.get("read", [])}
        for path, value in item.get("write", {}).items():
            ctx.memory.set(path, value)
        for path in item.get("delete", []):
            ctx.memory.delete(path)
        result = ctx.call("act", n, seen)
        ctx.call("notify", n)
        ctx.send_event(OutputEvent(output={
            "n": n, "approved": None if decision is None else decision.approved,
            "reason": None if decision is None else decision.reason, "seen": seen, "result": result}))


def agent(effects: Effects) -> Approvals:
    return Approvals(name="approvals",
                     resources={name: Tool(effects.tool(name), side_effects="external")
                                for name in ("lookup", "act", "notify")})


def wait_input(n: int, **more) -> dict:
    return {"n": n, "wait": True, **more}


def plain_input(n: int, **more) -> dict:
    return {"n": n, **more}


@pytest.fixture
def world() -> Iterator[SimWorld]:
    with SimWorld() as simulated:
        yield simulated


def run_mode(world: SimWorld, effects: Effects, *, restore=None, **settings) -> OperatorSim:
    """An attempt of the agent with ``later_inputs_while_waiting="run"`` (restored from ``restore``)."""
    return world.operator(agent(effects), world.config(later_inputs_while_waiting="run", **settings), restore=restore)


def ns(outputs) -> list[int]:
    return [output.output["n"] for output in outputs]


def resumed_seqs(sim: OperatorSim) -> list[int]:
    return [event.seq for event in sim.events_of("resumed")]


# -- 1. later inputs run while a run waits ----------------------------------------------------------------------
def test_a_later_input_runs_while_the_first_waits_and_the_first_resumes_after_its_decision(world):
    effects = Effects()
    sim = run_mode(world, effects)
    sim.send(K, wait_input(1))
    sim.send(K, plain_input(2))  # arrives while run 1 is under way: waits in pending until run 1 parks
    sim.pump()
    assert ns(sim.outputs) == [2], "input 2 ran while run 1 waits"
    assert sim.parked(K) == [1] and sim.in_flight_seq(K) is None and sim.pending(K) == []
    assert [event.kind for event in sim.events] == ["opened"] and sim.count("runs_waiting") == 1
    assert effects.made("act", 1) == 0 and effects.made("act", 2) == 1

    sim.decide(K, sim.wait_id(K, 1), Decision.approve(by="ana"))
    sim.pump()
    assert ns(sim.outputs) == [2, 1]
    assert sim.outputs[1].output["approved"] is True and sim.outputs[1].seq == 1
    assert [event.kind for event in sim.events] == ["opened", "resumed", "closed"]
    assert sim.parked(K) == [] and sim.count("runs_waiting") == 0 and sim.accepted_seq(K) == 2
    assert sim.op.hold.total == 0, "no input is left counted toward the input hold"
    for tool in ("lookup", "act", "notify"):
        for n in (1, 2):
            assert effects.made(tool, n) == 1, (tool, n, effects.calls)
    assert sim.count("decisions_applied") == 1 and sim.count("waits_opened") == 1


def test_a_decision_while_a_later_run_is_under_way_resumes_the_run_when_that_one_ends(world):
    effects = Effects()
    sim = run_mode(world, effects)
    sim.send(K, wait_input(1))
    sim.pump()
    effects.block_act_of = 2
    sim.send(K, plain_input(2))
    assert effects.entered.wait(10)
    sim.decide(K, sim.wait_id(K, 1), Decision.approve())  # run 2 holds the key
    assert sim.in_flight_seq(K) == 2 and resumed_seqs(sim) == [1]
    sim.send(K, plain_input(3))  # behind run 2; the decided run 1 goes first
    effects.proceed.set()
    sim.pump()
    assert ns(sim.outputs) == [2, 1, 3]
    assert sim.parked(K) == [] and sim.pending(K) == [] and not effects.repeated()


# -- 2. memory ---------------------------------------------------------------------------------------------------
def test_a_resumed_run_sees_the_memory_it_started_with_and_its_writes_go_over_the_later_runs(world):
    effects = Effects()
    sim = run_mode(world, effects)
    sim.send(K, plain_input(0, write={"base": 0, "shared": 0, "c": 0}))
    sim.send(K, wait_input(1, read=["base", "b", "shared", "c", "profile"],
                           write={"a": 1, "shared": 1, "profile.name": "Ann"}, delete=["c"]))
    sim.send(K, plain_input(2, read=["a", "shared"],
                            write={"b": 2, "shared": 2, "c": 2, "profile.city": "Oslo"}))
    sim.pump()
    assert sim.outputs[-1].output["seen"] == {"a": None, "shared": 0}, "run 2 does not see the parked run's writes"
    assert sim.memory(K) == {"base": 0, "shared": 2, "c": 2, "b": 2, "profile": {"city": "Oslo"}}

    sim.decide(K, sim.wait_id(K, 2), Decision.approve())  # input 0 is the key's seq 1, input 1 its seq 2
    sim.pump()
    resumed = sim.outputs[-1].output
    assert resumed["n"] == 1
    assert resumed["seen"] == {"base": 0, "b": None, "shared": 0, "c": 0, "profile": None}, \
        "the resumed run sees the memory as it started, not run 2's writes"
    # Its writes (and its delete) go over the key's memory as it is now; what it did not write keeps run 2's.
    assert sim.memory(K) == {"base": 0, "shared": 1, "b": 2, "a": 1, "decided": {"n1": True},
                             "profile": {"city": "Oslo", "name": "Ann"}}
    assert not effects.repeated()


def test_a_run_waiting_again_after_its_resume_keeps_the_memory_it_first_started_with(world):
    class TwoWaits(Agent):
        @action(InputEvent)
        def handle(event, ctx):
            n = event.input["n"]
            first = ctx.wait_for("first", {"n": n}, timeout_s=3600) if event.input.get("wait") else None
            seen_between = ctx.memory.get("x")
            second = ctx.wait_for("second", {"n": n}, timeout_s=3600) if event.input.get("wait") else None
            ctx.memory.set("x", n)
            ctx.memory.set(f"log.n{n}", [first is not None, second is not None])
            ctx.send_event(OutputEvent(output={"n": n, "seen": [seen_between, ctx.memory.get("y")]}))
            if not event.input.get("wait"):
                ctx.memory.set("y", n)

    sim = world.operator(TwoWaits(name="two-waits"), world.config(later_inputs_while_waiting="run"))
    sim.send(K, {"n": 1, "wait": True})
    sim.send(K, {"n": 2})
    sim.pump()
    sim.decide(K, sim.wait_id(K, 1), Decision.approve())
    sim.pump()  # resumed, waits again at its second wait: kept aside again
    assert sim.parked(K) == [1] and ns(sim.outputs) == [2]
    sim.send(K, {"n": 3})
    sim.pump()
    sim.decide(K, sim.wait_id(K, 1), Decision.approve())
    sim.pump()
    assert ns(sim.outputs) == [2, 3, 1]
    assert sim.outputs[-1].output["seen"] == [None, None], "the memory as run 1 first started, after both waits"
    assert sim.memory(K) == {"x": 1, "y": 3, "log": {"n1": [True, True], "n2": [False, False],
                                                     "n3": [False, False]}}
    assert sim.count("runs_waiting") == 0 and sim.parked(K) == []


# -- 3. several parked runs, decisions out of order, deadlines -----------------------------------------------
def test_several_runs_of_a_key_park_and_resume_in_the_order_their_decisions_come(world):
    effects = Effects()
    sim = run_mode(world, effects)
    for n in (1, 2, 3):
        sim.send(K, wait_input(n, write={"last": n, f"own.n{n}": n}))
    sim.send(K, plain_input(4, read=["last"]))
    sim.pump()
    assert sim.parked(K) == [1, 2, 3] and ns(sim.outputs) == [4] and sim.count("runs_waiting") == 3
    wait_ids = {n: sim.wait_id(K, n) for n in (1, 2, 3)}
    assert len(set(wait_ids.values())) == 3

    sim.decide(K, wait_ids[3], Decision.approve())  # the key is idle: run 3 resumes at once
    world.advance(1)
    sim.decide(K, wait_ids[2], Decision.approve())  # behind run 3
    world.advance(1)
    sim.decide(K, wait_ids[1], Decision.deny("no"))
    sim.pump()
    assert resumed_seqs(sim) == [3, 2, 1] and ns(sim.outputs) == [4, 3, 2, 1]
    assert [output.output["approved"] for output in sim.outputs[1:]] == [True, True, False]
    assert sim.memory(K)["last"] == 1, "each resumed run's writes went over the memory of the ones before it"
    assert sim.memory(K)["own"] == {"n1": 1, "n2": 2, "n3": 3}
    assert sim.parked(K) == [] and sim.count("runs_waiting") == 0 and not effects.repeated()


def test_decisions_in_the_same_millisecond_resume_their_runs_in_the_order_they_came(world):
    effects = Effects()
    sim = run_mode(world, effects)
    for n in (1, 2, 3):
        sim.send(K, wait_input(n, write={"last": n}))
    sim.pump()
    for n in (3, 2, 1):  # no clock tick between them: one burst of decisions
        sim.decide(K, sim.wait_id(K, n), Decision.approve())
    sim.pump()
    assert resumed_seqs(sim) == [3, 2, 1]  # the resumed events follow arrival: 2 was decided before 1
    assert ns(sim.outputs) == [3, 2, 1], "run 2's decision came before run 1's, so run 2 resumes first"
    assert sim.memory(K)["last"] == 1


def test_deadlines_of_runs_kept_aside_time_them_out(world):
    effects = Effects()
    sim = run_mode(world, effects)
    sim.send(K, wait_input(1, timeout_s=5, write={"x": 1}))
    sim.send(K, wait_input(2, timeout_s=10, write={"x": 2}))
    sim.send(K, plain_input(3))
    sim.pump()
    assert sim.parked(K) == [1, 2] and ns(sim.outputs) == [3]
    sim.advance(4_999)
    assert ns(sim.outputs) == [3]
    sim.advance(1)
    assert ns(sim.outputs) == [3, 1] and sim.outputs[-1].output["reason"] == "timed out"
    sim.advance(5_000)
    assert ns(sim.outputs) == [3, 1, 2] and sim.outputs[-1].output["approved"] is False
    assert [event.decision.timed_out for event in sim.events_of("resumed")] == [True, True]
    assert sim.count("waits_timed_out") == 2 and sim.count("runs_waiting") == 0 and sim.parked(K) == []
    late = sim.decide(K, sim.wait_id(K, 1), Decision.approve())
    assert [event.kind for _, event in late] == ["decision_ignored"]


@pytest.mark.parametrize("applied_by", ["the deadline's own timer", "the run's wake-up"])
def test_a_deadline_due_on_the_timer_that_applies_another_run_of_the_key_still_times_its_run_out(world, applied_by):
    effects = Effects()
    sim = run_mode(world, effects, fallback_check_ms=600_000)  # no check timer before the deadline
    sim.send(K, wait_input(1, timeout_s=5))
    sim.pump()
    deadline = world.clock.now_ms + 5_000
    assert (deadline, K) in sim.backend.processing_timers
    sim.send(K, plain_input(2))
    sim.wait_run_done(K)  # run 2 ended; its wake-up not delivered yet
    world.advance(5_000)
    if applied_by == "the deadline's own timer":
        assert sim.fire_due_timers() >= 1  # applies run 2 (done) and finds run 1's deadline at once
    else:
        assert sim.deliver_wakeups(wait_s=5) == 1  # at the deadline: applies run 2, then the deadline
    assert ns(sim.outputs) == [2] and resumed_seqs(sim) == [1], "run 1's deadline was seen by that very timer"
    sim.pump()
    assert ns(sim.outputs) == [2, 1] and sim.outputs[-1].output["reason"] == "timed out"
    assert sim.count("waits_timed_out") == 1 and sim.parked(K) == []


def test_a_later_runs_check_on_the_deadlines_millisecond_does_not_delete_the_deadline(world):
    effects = Effects()
    sim = run_mode(world, effects, fallback_check_ms=1_000)
    sim.send(K, wait_input(1, timeout_s=1))  # deadline: now + 1000 ms
    sim.pump()
    deadline = world.clock.now_ms + 1_000
    assert (deadline, K) in sim.backend.processing_timers
    sim.send(K, plain_input(2))  # its check: now + fallback_check_ms, the deadline's millisecond
    sim.pump()
    assert ns(sim.outputs) == [2]
    assert (deadline, K) in sim.backend.processing_timers, "run 1's deadline timer is gone"
    sim.advance(1_500)
    assert ns(sim.outputs) == [2, 1] and sim.count("waits_timed_out") == 1


class Payments(Agent):
    """A big payment's ``pay`` call needs approval (a wait of its own); the memory says what each run did."""

    @action(InputEvent)
    def handle(event, ctx):
        n = event.input["n"]
        ctx.memory.set(f"tried.n{n}", True)
        if event.input.get("big"):
            ctx.call("pay", n)
        ctx.memory.set("last", n)
        ctx.send_event(OutputEvent(output={"n": n}))


def test_a_tool_call_waiting_for_approval_is_kept_aside_and_a_denial_ends_its_run_with_the_memory_as_it_is(world):
    effects = Effects()
    payments = Payments(name="payments", resources={"pay": Tool(effects.tool("pay"), needs_approval=True)})
    sim = world.operator(payments, world.config(later_inputs_while_waiting="run"))
    sim.send(K, {"n": 1, "big": True})
    sim.send(K, {"n": 2})
    sim.send(K, {"n": 3, "big": True})
    sim.pump()
    assert ns(sim.outputs) == [2] and sim.parked(K) == [1, 3]
    assert sim.events_of("opened")[0].name == "approve:pay"
    sim.decide(K, sim.wait_id(K, 1), Decision.deny("too much"))
    sim.pump()
    closed = sim.events_of("closed")
    assert [event.seq for event in closed] == [1] and "too much" in closed[0].reason
    assert ns(sim.outputs) == [2], "the denied run ends with no output"
    assert sim.memory(K) == {"tried": {"n2": True}, "last": 2}, "and with no write of its own over the key's memory"
    assert sim.count("runs_ended_at_wait") == 1 and effects.made("pay") == 0
    sim.decide(K, sim.wait_id(K, 3), Decision.approve())
    sim.pump()
    assert ns(sim.outputs) == [2, 3] and effects.made("pay", 3) == 1
    assert sim.memory(K) == {"tried": {"n2": True, "n3": True}, "last": 3}


def test_keys_sharing_one_run_slot_each_keep_their_own_order(world):
    effects = Effects()
    sim = run_mode(world, effects, max_concurrent_runs=1)  # runs wait for the slot: the input hold comes into play
    sim.send("a", wait_input(1, write={"x": 1}))
    sim.send("b", plain_input(11, write={"x": 11}))
    sim.send("a", plain_input(2, read=["x"], write={"x": 2}))
    sim.send("b", wait_input(12, read=["x"]))
    sim.send("a", plain_input(3, read=["x"]))
    sim.pump()
    assert ns(sim.outputs_of("a")) == [2, 3] and ns(sim.outputs_of("b")) == [11]
    assert sim.parked("a") == [1] and sim.parked("b") == [2]
    sim.decide("b", sim.wait_id("b", 2), Decision.approve())
    sim.decide("a", sim.wait_id("a", 1), Decision.approve())
    sim.pump()
    assert ns(sim.outputs_of("a")) == [2, 3, 1] and ns(sim.outputs_of("b")) == [11, 12]
    assert sim.outputs_of("b")[-1].output["seen"] == {"x": 11}
    assert sim.memory("a")["x"] == 1 and sim.memory("b")["x"] == 11
    assert sim.op.hold.total == 0 and not sim.java.held and not effects.repeated()


# -- 4. and 5. failover: the journal's order is reproduced --------------------------------------------------------
def failover_inputs() -> tuple[dict, dict]:
    """Run 1 waits, then writes what was decided and ``x``; run 2 reads both and calls ``act`` with them."""
    return (wait_input(1, write={"x": 1}),
            plain_input(2, read=["decided", "x"], write={"x": 2, "y": 2}))


def clean_reference(**settings) -> tuple[list, dict]:
    """Outputs and memory of the failover scenario without any failure: 1 parks, its decision, then input 2."""
    first, second = failover_inputs()
    with SimWorld() as clean:
        sim = run_mode(clean, Effects(), **settings)
        sim.send(K, first)
        sim.pump()
        sim.decide(K, sim.wait_id(K, 1), Decision.approve(by="ana"))
        sim.pump()
        sim.send(K, second)
        sim.pump()
        return list(sim.outputs), sim.memory(K)


def crash_after_resume_and_input_2(world: SimWorld, effects: Effects):
    """Attempt 1: run 1 parks, checkpoint 1, its decision, run 1 resumes and ends, input 2 runs; then a crash."""
    first, second = failover_inputs()
    sim = run_mode(world, effects)
    sim.send(K, first)
    sim.pump()
    checkpoint = sim.checkpoint(1)
    wait_id = sim.wait_id(K, 1)
    sim.decide(K, wait_id, Decision.approve(by="ana"))
    sim.pump()
    sim.send(K, second)
    sim.pump()
    before = (list(sim.outputs), sim.memory(K))
    sim.crash()
    return checkpoint, wait_id, before


def restore_input_2_before_the_decision(world: SimWorld, effects: Effects, checkpoint, wait_id) -> OperatorSim:
    """A restored attempt fed input 2 first, then the decision (another interleaving of the two sources)."""
    _, second = failover_inputs()
    restored = run_mode(world, effects, restore=checkpoint)
    assert restored.parked(K) == [1] and restored.accepted_seq(K) == 1
    restored.send(K, second)
    restored.pump()
    assert restored.outputs == [], "input 2 waits: the journal recorded run 1 resuming before it"
    assert restored.pending(K) == [second]
    restored.decide(K, wait_id, Decision.approve(by="ana"))
    restored.pump()
    return restored


def test_after_a_failover_a_recorded_resume_runs_before_the_later_input_it_preceded(world):
    effects = Effects()
    checkpoint, wait_id, (outputs_before, memory_before) = crash_after_resume_and_input_2(world, effects)
    assert ns(outputs_before) == [1, 2] and outputs_before[1].output["seen"] == {"decided": {"n1": True}, "x": 1}

    restored = restore_input_2_before_the_decision(world, effects, checkpoint, wait_id)
    assert restored.count("runs_waiting") == 0, "1 at the restore (from the marker), 0 once resumed and ended"
    assert restored.outputs == outputs_before, "the same outputs, ids included"
    assert restored.memory(K) == memory_before
    assert not effects.repeated(), f"calls made again: {effects.repeated()}"
    assert effects.made("act", 2) == 1, "run 2 saw the same memory, so its act call was reused"
    assert restored.count("actions_reused") == 2 and restored.count("actions_executed") == 0
    assert restored.count("divergences") == 0
    restored.advance(ORDER_TIMEOUT_MS + 1_000)  # nothing was left waiting
    assert restored.outputs == outputs_before and restored.count("order_restore_timeouts") == 0
    assert (restored.outputs, restored.memory(K)) == clean_reference()
    duplicate = restored.decide(K, wait_id, Decision.approve(by="ana"))
    assert [event.kind for _, event in duplicate] == ["decision_ignored"]


def test_after_a_failover_the_decision_first_resumes_the_run_and_the_later_input_follows(world):
    effects = Effects()
    checkpoint, wait_id, (outputs_before, memory_before) = crash_after_resume_and_input_2(world, effects)
    _, second = failover_inputs()
    restored = run_mode(world, effects, restore=checkpoint)
    restored.decide(K, wait_id, Decision.approve(by="ana"))
    restored.send(K, second)
    restored.pump()
    assert restored.outputs == outputs_before and restored.memory(K) == memory_before
    assert not effects.repeated()


def test_a_crash_in_a_resumed_run_after_its_external_call_reuses_the_call(world):
    effects = Effects()
    first, second = failover_inputs()
    sim = run_mode(world, effects)
    sim.send(K, first)
    sim.pump()
    checkpoint = sim.checkpoint(1)
    wait_id = sim.wait_id(K, 1)
    effects.block_act_of = 1  # run 1's act call, after the wait, blocks once it took effect
    sim.decide(K, wait_id, Decision.approve(by="ana"))
    assert effects.entered.wait(10)
    sim.send(K, second)  # waits behind the resumed run
    sim.op.runs.closing.set()  # the task is failing: the run stops at its next boundary (notify is never made)
    effects.proceed.set()
    sim.crash()
    assert effects.made("act", 1) == 1 and effects.made("notify", 1) == 0 and sim.outputs == []

    effects.block_act_of = None
    restored = restore_input_2_before_the_decision(world, effects, checkpoint, wait_id)
    assert ns(restored.outputs) == [1, 2]
    assert effects.made("act", 1) == 1, "the resumed run's act call was reused, not made again"
    assert effects.made("notify", 1) == 1 and effects.made("act", 2) == 1
    assert not effects.repeated()
    outputs, memory = clean_reference()
    assert restored.outputs == outputs and restored.memory(K) == memory


def test_a_second_failover_behind_the_same_checkpoint_reuses_everything_too(world):
    effects = Effects()
    checkpoint, wait_id, (outputs_before, memory_before) = crash_after_resume_and_input_2(world, effects)
    second_attempt = restore_input_2_before_the_decision(world, effects, checkpoint, wait_id)
    assert second_attempt.outputs == outputs_before and not effects.repeated()
    second_attempt.crash()  # before any further checkpoint

    _, second = failover_inputs()
    third_attempt = run_mode(world, effects, restore=checkpoint)
    third_attempt.send(K, second)
    third_attempt.decide(K, wait_id, Decision.approve(by="ana"))
    third_attempt.pump()
    third_attempt.advance(ORDER_TIMEOUT_MS + 1_000)
    assert not effects.repeated(), f"calls made again: {effects.repeated()}"
    assert third_attempt.outputs == outputs_before and third_attempt.memory(K) == memory_before
    assert third_attempt.count("order_restore_timeouts") == 0


def test_a_run_parked_after_the_checkpoint_resumes_after_the_later_inputs_it_followed(world):
    effects = Effects()
    first = wait_input(1, write={"x": 1})
    second = plain_input(2, write={"x": 2})
    third = plain_input(3, read=["x"])
    sim = run_mode(world, effects)
    sim.send(K, first)
    sim.wait_run_done(K)  # run 1 ended at its wait, not applied (parked) yet
    checkpoint = sim.checkpoint(1)  # run 1 is the key's run in flight here
    sim.pump()
    sim.send(K, second)
    sim.pump()
    wait_id = sim.wait_id(K, 1)
    sim.decide(K, wait_id, Decision.approve())
    sim.pump()
    sim.send(K, third)
    sim.pump()
    outputs_before, memory_before = list(sim.outputs), sim.memory(K)
    assert ns(outputs_before) == [2, 1, 3] and outputs_before[2].output["seen"] == {"x": 1}
    sim.crash()

    restored = run_mode(world, effects, restore=checkpoint)
    assert restored.in_flight_seq(K) == 1
    restored.send(K, second)
    restored.decide(K, wait_id, Decision.approve())
    restored.send(K, third)
    restored.pump()
    restored.advance(1_000)  # the restored run in flight is submitted again at its check timer
    restored.advance(ORDER_TIMEOUT_MS + 1_000)
    assert not effects.repeated(), f"calls made again: {effects.repeated()}"
    assert restored.outputs == outputs_before
    assert restored.memory(K) == memory_before


def test_after_a_failover_a_decision_first_waits_for_the_recorded_input_the_resume_followed(world):
    effects = Effects()
    first, second = wait_input(1, write={"x": 1}), plain_input(2, read=["x"], write={"x": 2})
    sim = run_mode(world, effects)
    sim.send(K, first)
    sim.pump()
    checkpoint = sim.checkpoint(1)
    sim.send(K, second)  # runs while 1 waits
    sim.pump()
    wait_id = sim.wait_id(K, 1)
    sim.decide(K, wait_id, Decision.approve())
    sim.pump()
    outputs_before, memory_before = list(sim.outputs), sim.memory(K)
    assert ns(outputs_before) == [2, 1] and memory_before["x"] == 1
    sim.crash()

    restored = run_mode(world, effects, restore=checkpoint)
    restored.decide(K, wait_id, Decision.approve())
    restored.pump()
    assert restored.outputs == [], "the journal recorded input 2 before the resume"
    restored.send(K, second)
    restored.pump()
    assert restored.outputs == outputs_before and restored.memory(K) == memory_before
    assert not effects.repeated()


def test_a_decided_run_held_back_for_a_recorded_input_that_never_comes_back_resumes_after_the_order_timeout(world):
    effects = Effects()
    sim = run_mode(world, effects)
    sim.send(K, wait_input(1))
    sim.pump()
    checkpoint = sim.checkpoint(1)
    sim.send(K, plain_input(2))
    sim.pump()
    wait_id = sim.wait_id(K, 1)
    sim.decide(K, wait_id, Decision.approve())
    sim.pump()
    sim.crash()

    restored = run_mode(world, effects, restore=checkpoint)
    restored.decide(K, wait_id, Decision.approve())  # input 2 never comes back (a filter changed, say)
    restored.pump()
    assert restored.outputs == []
    restored.advance(ORDER_TIMEOUT_MS + 1_000)
    assert ns(restored.outputs) == [1], "the order wait is bounded: run 1 resumes once it timed out"
    assert restored.count("order_restore_timeouts") == 1


def test_a_run_decided_during_a_replayed_run_resumes_when_the_next_recorded_input_never_comes_back(world):
    effects = Effects()
    sim = run_mode(world, effects)
    sim.send(K, wait_input(1))
    sim.pump()
    checkpoint = sim.checkpoint(1)
    sim.send(K, plain_input(2))
    sim.send(K, plain_input(3))
    sim.pump()
    wait_id = sim.wait_id(K, 1)
    sim.decide(K, wait_id, Decision.approve())  # resumed after input 3
    sim.pump()
    sim.crash()

    restored = run_mode(world, effects, restore=checkpoint)
    restored.send(K, plain_input(2))
    assert restored.in_flight_seq(K) == 2
    restored.decide(K, wait_id, Decision.approve())  # while run 2 replays (not applied yet); input 3 never comes back
    restored.pump()
    assert ns(restored.outputs) == [2]
    restored.advance(ORDER_TIMEOUT_MS + 1_000)
    assert ns(restored.outputs) == [2, 1], "the wait for input 3 is bounded: run 1 resumes once it timed out"



def test_a_later_input_that_ran_while_a_run_parked_after_the_checkpoint_is_reused(world):
    effects = Effects()
    first, second = wait_input(1, write={"x": 1}), plain_input(2, write={"x": 2})
    sim = run_mode(world, effects)
    sim.send(K, first)
    sim.wait_run_done(K)
    checkpoint = sim.checkpoint(1)  # run 1 in flight: it parks after the checkpoint
    sim.pump()
    sim.send(K, second)
    sim.pump()
    outputs_before = list(sim.outputs)
    assert ns(outputs_before) == [2] and effects.made("act", 2) == 1
    sim.crash()  # no decision at all

    restored = run_mode(world, effects, restore=checkpoint)
    restored.send(K, second)
    restored.advance(1_000)  # run 1 is submitted again at its check timer: it parks again, input 2 follows
    assert restored.parked(K) == [1] and restored.outputs == outputs_before
    assert not effects.repeated(), f"calls made again: {effects.repeated()}"
    assert restored.count("divergences") == 0


def test_a_crash_after_a_run_parked_and_its_later_input_ran_keeps_their_order(world):
    """The checkpoint holds run 1 in flight (before it parked); after it, run 1 parks, input 2 runs, run 1 resumes
    and is cut short after its act call. The restored attempt must park run 1 again and resume it after input 2."""
    effects = Effects()
    first, second = wait_input(1, write={"x": 1}), plain_input(2, write={"x": 2})
    sim = run_mode(world, effects)
    sim.send(K, first)
    sim.wait_run_done(K)
    checkpoint = sim.checkpoint(1)
    sim.pump()
    sim.send(K, second)
    sim.pump()
    wait_id = sim.wait_id(K, 1)
    effects.block_act_of = 1
    sim.decide(K, wait_id, Decision.approve())
    assert effects.entered.wait(10)
    sim.op.runs.closing.set()
    effects.proceed.set()
    sim.crash()
    assert ns(sim.outputs) == [2] and effects.made("act", 1) == 1

    effects.block_act_of = None
    restored = run_mode(world, effects, restore=checkpoint)
    restored.send(K, second)
    restored.decide(K, wait_id, Decision.approve())
    restored.advance(1_000)  # the run in flight at the checkpoint is submitted again
    restored.advance(ORDER_TIMEOUT_MS + 1_000)
    assert ns(restored.outputs) == [2, 1] and restored.memory(K)["x"] == 1
    assert not effects.repeated(), f"calls made again: {effects.repeated()}"
    assert restored.count("order_restore_timeouts") == 0


class TwoApprovals(Agent):
    """Waits twice (``first``, then ``second``), with an external call after each wait and memory writes."""

    @action(InputEvent)
    def handle(event, ctx):
        n = event.input["n"]
        seen = {"before": ctx.memory.get("x")}
        if event.input.get("wait"):
            first = ctx.wait_for("first", {"n": n}, timeout_s=3600)
            ctx.call("act", n, "first", first.approved)
            seen["between"] = ctx.memory.get("x")
            second = ctx.wait_for("second", {"n": n}, timeout_s=3600)
            ctx.call("act", n, "second", second.approved)
        ctx.memory.set("x", n)
        ctx.memory.set(f"seen.n{n}", seen)
        ctx.call("notify", n, seen)
        ctx.send_event(OutputEvent(output={"n": n, "seen": seen}))


def test_after_a_failover_a_run_that_resumed_twice_resumes_twice_where_the_journal_recorded(world):
    effects = Effects()

    def attempt(restore=None) -> OperatorSim:
        two = TwoApprovals(name="two", resources={name: Tool(effects.tool(name)) for name in ("act", "notify")})
        return world.operator(two, world.config(later_inputs_while_waiting="run"), restore=restore)

    sim = attempt()
    sim.send(K, {"n": 1, "wait": True})
    sim.pump()
    checkpoint = sim.checkpoint(1)
    sim.send(K, {"n": 2})
    sim.pump()
    first_wait = sim.wait_id(K, 1)
    sim.decide(K, first_wait, Decision.approve())
    sim.pump()  # resumed after input 2, parked again at its second wait
    second_wait = sim.wait_id(K, 1)
    assert second_wait != first_wait and sim.parked(K) == [1]
    sim.send(K, {"n": 3})
    sim.pump()
    sim.decide(K, second_wait, Decision.approve())
    sim.pump()  # resumed after input 3, done
    sim.send(K, {"n": 4})
    sim.pump()
    outputs_before, memory_before = list(sim.outputs), sim.memory(K)
    assert ns(outputs_before) == [2, 3, 1, 4]
    assert outputs_before[1].output["seen"] == {"before": 2} and outputs_before[3].output["seen"] == {"before": 1}
    sim.crash()

    restored = attempt(checkpoint)  # every input and decision again, all at once, decisions first
    restored.decide(K, second_wait, Decision.approve())
    restored.decide(K, first_wait, Decision.approve())
    for n in (4, 3, 2):  # and the inputs in reverse
        restored.send(K, {"n": n})
    restored.pump()
    restored.advance(ORDER_TIMEOUT_MS + 1_000)
    assert not effects.repeated(), f"calls made again: {effects.repeated()}"
    assert restored.outputs == outputs_before and restored.memory(K) == memory_before
    assert restored.parked(K) == [] and restored.count("order_restore_timeouts") == 0


def test_a_resumed_run_under_way_at_the_checkpoint_is_submitted_again_and_reuses_its_calls(world):
    effects = Effects()
    first, second = failover_inputs()
    sim = run_mode(world, effects)
    sim.send(K, first)
    sim.pump()
    wait_id = sim.wait_id(K, 1)
    effects.block_act_of = 1
    sim.decide(K, wait_id, Decision.approve(by="ana"))
    assert effects.entered.wait(10)
    checkpoint = sim.checkpoint(1)  # the resumed run is under way (in its act call, which took effect)
    effects.proceed.set()
    sim.pump()
    sim.send(K, second)
    sim.pump()
    outputs_before, memory_before = list(sim.outputs), sim.memory(K)
    sim.crash()

    effects.block_act_of = None
    restored = run_mode(world, effects, restore=checkpoint)
    assert restored.in_flight_seq(K) == 1 and restored.parked(K) == [1]
    restored.send(K, second)
    restored.pump()
    assert restored.outputs == [], "input 2 waits behind the restored run in flight"
    restored.advance(1_000)  # its check timer: submitted again, resumed with the decision kept in state
    assert restored.outputs == outputs_before and restored.memory(K) == memory_before
    assert not effects.repeated() and restored.parked(K) == [] and restored.count("runs_waiting") == 0
    assert (restored.outputs, restored.memory(K)) == clean_reference()


def test_a_run_decided_behind_the_run_in_flight_at_the_checkpoint_resumes_after_it(world):
    effects = Effects()
    first, second = wait_input(1, write={"x": 1}), plain_input(2, write={"x": 2})
    sim = run_mode(world, effects)
    sim.send(K, first)
    sim.pump()
    effects.block_act_of = 2
    sim.send(K, second)
    assert effects.entered.wait(10)
    wait_id = sim.wait_id(K, 1)
    sim.decide(K, wait_id, Decision.approve())  # decided while run 2 holds the key
    checkpoint = sim.checkpoint(1)
    sim.op.runs.closing.set()
    effects.proceed.set()
    sim.crash()  # before run 2 ended: no resume was journaled

    effects.block_act_of = None
    restored = run_mode(world, effects, restore=checkpoint)
    restored.advance(1_000)  # run 2 is submitted again at its check timer; then the decided run 1
    assert ns(restored.outputs) == [2, 1] and restored.memory(K)["x"] == 1
    assert not effects.repeated() and restored.parked(K) == []


def test_at_the_end_of_a_bounded_input_a_decided_run_kept_aside_still_runs(world):
    effects = Effects()
    sim = run_mode(world, effects)
    sim.send(K, wait_input(1))
    sim.send(K, wait_input(2))
    sim.pump()
    effects.block_act_of = 3
    sim.send(K, plain_input(3))
    assert effects.entered.wait(10)
    sim.decide(K, sim.wait_id(K, 1), Decision.approve())  # behind run 3
    effects.proceed.set()
    sim.end_of_input()  # the final watermark: the drain waits for run 3, then for the resumed run 1
    assert ns(sim.outputs) == [3, 1]
    assert sim.parked(K) == [2] and sim.backend.event_timers == set(), "run 2 stays parked, nothing left to drain"


# -- 6. "hold" is unchanged --------------------------------------------------------------------------------------
def test_in_hold_mode_a_later_input_waits_behind_the_parked_run(world):
    effects = Effects()
    sim = world.operator(agent(effects), world.config())  # later_inputs_while_waiting="hold", the default
    sim.send(K, wait_input(1, write={"x": 1}))
    sim.send(K, plain_input(2, read=["x"]))
    sim.pump()
    assert sim.outputs == [] and sim.parked(K) == [1]
    assert sim.op.hold.total == 0, "inputs behind a parked run do not count toward the input hold"
    assert sim.in_flight_seq(K) == 1 and sim.pending(K) == [plain_input(2, read=["x"])]
    assert effects.made("lookup", 2) == 0
    sim.send(K, plain_input(3))
    sim.pump()
    assert sim.outputs == [] and len(sim.pending(K)) == 2
    sim.decide(K, sim.wait_id(K, 1), Decision.approve())
    sim.pump()
    assert ns(sim.outputs) == [1, 2, 3]
    assert sim.outputs[1].output["seen"] == {"x": 1}, "run 2 ran after run 1, on its memory"
    assert sim.parked(K) == [] and sim.pending(K) == [] and not effects.repeated()


# -- 7. decisions for unknown waits, duplicates, early ones, unreadable ones -------------------------------------
def test_decisions_unknown_duplicate_early_and_unreadable_with_several_parked_runs(world):
    with SimWorld() as other:  # where input 3's wait id is known before it opens here (ids are derived)
        elsewhere = run_mode(other, Effects())
        for n in (1, 2, 3):
            elsewhere.send(K, wait_input(n))
        elsewhere.pump()
        early_wait_id = elsewhere.wait_id(K, 3)

    effects = Effects()
    sim = run_mode(world, effects, early_decision_ttl_s=60)
    sim.send(K, wait_input(1))
    sim.send(K, wait_input(2))
    sim.pump()
    assert sim.parked(K) == [1, 2]
    wait_1, wait_2 = sim.wait_id(K, 1), sim.wait_id(K, 2)

    unknown = sim.decide(K, "approvals:handle:9:0:no-such-wait", Decision.approve(), signal_id="s-unknown")
    assert [event.kind for _, event in unknown] == ["decision_early"] and resumed_seqs(sim) == []
    sim.decide(K, wait_2, Decision.approve(by="bo"), signal_id="s2")  # resumes run 2, not run 1
    duplicate = sim.decide(K, wait_2, Decision.deny(by="eve"), signal_id="s2-again")  # run 2 under way
    assert [event.kind for _, event in duplicate] == ["decision_ignored"]
    sim.pump()
    assert ns(sim.outputs) == [2] and sim.outputs[0].output["approved"] is True
    late_duplicate = sim.decide(K, wait_2, Decision.approve(), signal_id="s2")  # its run finished
    assert [event.kind for _, event in late_duplicate] == ["decision_ignored"]
    unreadable = sim.decide_raw(K, b"not json")
    assert [event.kind for _, event in unreadable] == ["decision_rejected"]

    early = sim.decide(K, early_wait_id, Decision.deny("early"), signal_id="s3")  # before run 3 exists
    assert [event.kind for _, event in early] == ["decision_early"]
    sim.send(K, wait_input(3))
    sim.pump()  # run 3 opens its wait, takes the early decision, resumes at once (the key is idle)
    assert ns(sim.outputs) == [2, 3] and sim.outputs[-1].output["approved"] is False
    assert sim.parked(K) == [1]

    sim.decide(K, wait_1, Decision.deny("no"), signal_id="s1")
    sim.pump()
    assert ns(sim.outputs) == [2, 3, 1] and sim.parked(K) == []
    assert sim.events_of("decision_unmatched") == []
    sim.advance(60_000)  # the unknown decision's time is up
    assert [event.wait_id for event in sim.events_of("decision_unmatched")] == [
        "approvals:handle:9:0:no-such-wait"]
    counts = {name: sim.count(name) for name in ("decisions_applied", "decisions_early", "decisions_ignored",
                                                 "decisions_rejected", "decisions_unmatched", "runs_waiting")}
    assert counts == {"decisions_applied": 3, "decisions_early": 2, "decisions_ignored": 2, "decisions_rejected": 1,
                      "decisions_unmatched": 1, "runs_waiting": 0}
    assert not effects.repeated()


def test_a_decided_run_whose_recorded_predecessor_resume_never_comes_back_resumes_after_the_order_timeout(world):
    """The journal recorded run 2 resuming before run 1; after the restore only run 1's decision comes back (found
    by the review: it waited for ever, holding the key's recovered history and pruning)."""
    effects = Effects()
    sim = run_mode(world, effects)
    sim.send(K, wait_input(1))
    sim.send(K, wait_input(2))
    sim.pump()
    checkpoint = sim.checkpoint(1)
    first, second = sim.wait_id(K, 1), sim.wait_id(K, 2)
    sim.decide(K, second, Decision.approve())
    sim.pump()
    sim.decide(K, first, Decision.approve())
    sim.pump()
    assert ns(sim.outputs) == [2, 1]
    sim.crash()

    restored = run_mode(world, effects, restore=checkpoint)
    restored.decide(K, first, Decision.approve())  # run 2's decision never comes back
    restored.pump()
    assert restored.outputs == []  # the journal recorded run 2 resuming first: run 1 waits for it
    restored.advance(ORDER_TIMEOUT_MS + 1_000)
    assert ns(restored.outputs) == [1], "the wait for the recorded resume is bounded"
    assert restored.count("order_restore_timeouts") == 1
