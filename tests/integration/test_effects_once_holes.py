"""The every-effect-once guarantee where ordinary situations used to break it (real Kafka, real MiniCluster).

* A restart before the first completed checkpoint, twice: earlier attempts' records are reused.
* A model that is down longer than its client's retries, and an action that does not catch the error: the
  failed call is made again by the next attempt, not replayed as a failure forever.
* A child agent that fails once inside a fan-out that its parent does not catch: the same.
* ``ctx.memory.get("log").append(x)`` without ``set``: the in-place change survives reuse.

Real invocations are counted outside the Flink worker (a SQLite file, or the local model service's own
counters), and each test checks that its fault hit where it was meant to.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter

import pytest

from flink_agents_replay.api.agent import Agent, Event, InputEvent, OutputEvent, action
from flink_agents_replay.api.chat_model import ChatModel
from flink_agents_replay.api.resources import Tool
from flink_agents_replay.testing.agents import InjectedFailure, logical_call_counts
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import (
    canonical_output,
    make_inputs,
    produce_inputs,
    reference_outputs,
    run_agent_job,
)

pytestmark = pytest.mark.integration

SIGNING_KEY = "effects-once-holes-signing-key"


class Classified(Event):
    pass


#: Checkpointing on (the collect sink then delivers exactly once across restarts) but no checkpoint in the test:
#: the first one is due after min-pause, and finished tasks do not wait for one.
NO_CHECKPOINT_MS = 600_000
NO_CHECKPOINT_CONFIG = {"execution.checkpointing.min-pause": "600 s",
                        "execution.checkpointing.checkpoints-after-tasks-finish": "false"}


def _config(bootstrap: str, **overrides) -> dict:
    return {"kafka": {"bootstrap.servers": bootstrap}, "journal_topic": f"journal-{uuid.uuid4().hex[:8]}",
            "signing_key": SIGNING_KEY, "max_concurrent_runs": 8, **overrides}


def _fail_once_past(counter: InvocationCounter, thresholds: tuple[int, ...]) -> None:
    """Raise InjectedFailure once per threshold, the first time ``calls`` reaches it (claimed in the file)."""
    for index, threshold in enumerate(thresholds):
        if counter.count("calls") >= threshold and not counter.count(f"fault_{index}"):
            if counter.increment(f"claim_{index}") == 1:
                counter.increment(f"fault_{index}")
                raise InjectedFailure(f"injected failure {index} after {counter.count('calls')} calls")


def _tool(counter: InvocationCounter, name: str, side_effects: str = "none") -> Tool:
    def invoke(argument: str) -> str:
        counter.increment(f"call:{name}:{argument}")
        counter.increment("calls")
        return f"{name}({argument})"
    return Tool(invoke, side_effects=side_effects)


def _repeated(counter: InvocationCounter) -> dict[str, int]:
    return {name: n for name, n in logical_call_counts(counter).items() if n > 1}


# -- 1. restarts before the first completed checkpoint ----------------------------------------------------------
def two_step_agent(counter: InvocationCounter, faults: tuple[int, ...] = ()) -> Agent:
    class TwoStep(Agent):
        @action(InputEvent)
        def classify(event, ctx):
            label = ctx.call("classifier", f"{ctx.key}|{ctx.seq}|{event.input['n']}")
            _fail_once_past(counter, faults)  # between the run's calls: the classifier call is journaled
            ctx.send_event(Classified(label=label))

        @action(Classified)
        def reply(event, ctx):
            receipt = ctx.call("sender", event.label)
            ctx.send_event(OutputEvent(output={"receipt": receipt}))

    return TwoStep(name="two-step", resources={"classifier": _tool(counter, "classifier"),
                                               "sender": _tool(counter, "sender", "external")})


def test_restarts_before_the_first_checkpoint_reuse_earlier_attempts(kafka_bootstrap, tmp_path, operator_log):
    keys, per_key = 24, 10
    inputs = make_inputs(keys, per_key)
    input_topic = produce_inputs(kafka_bootstrap, inputs)
    reference_counter = InvocationCounter(tmp_path / "reference.db")
    reference = reference_outputs(two_step_agent(reference_counter), inputs)
    counter = InvocationCounter(tmp_path / "calls.db")
    outputs = run_agent_job(kafka_bootstrap, input_topic, two_step_agent(counter, faults=(60, 200)),
                            _config(kafka_bootstrap), checkpoint_interval_ms=NO_CHECKPOINT_MS, restart_attempts=3,
                            flink_config=NO_CHECKPOINT_CONFIG)
    assert (counter.count("fault_0"), counter.count("fault_1")) == (1, 1), "the failures were not injected"
    restarts = [line for line in operator_log() if "restarted before its first completed checkpoint" in line]
    assert len(restarts) == 2, restarts
    assert all(int(line.split(": read ")[1].split()[0]) > 0 for line in restarts), restarts
    assert Counter(outputs) == reference
    assert _repeated(counter) == {}
    assert logical_call_counts(counter).keys() == logical_call_counts(reference_counter).keys()


# -- 2. failed calls are made again ----------------------------------------------------------------------------
def llm_agent(base_url: str) -> Agent:
    class Answer(Agent):
        @action(InputEvent)
        def answer(event, ctx):
            # Not caught: a ChatModelError past the client's retries fails the task.
            reply = ctx.call("llm", prompt=f"Answer ticket {event.input['n']} of {ctx.key}")
            ctx.send_event(OutputEvent(output={"reply": reply}))

    return Answer(name="answer", resources={"llm": ChatModel("stub-model", base_url=base_url, retries=3)})


def test_a_model_outage_longer_than_its_retries_is_survived(kafka_bootstrap, model_server, operator_log):
    inputs = make_inputs(12, 4)
    input_topic = produce_inputs(kafka_bootstrap, inputs)
    reference = reference_outputs(llm_agent(model_server().base_url), inputs)
    server = model_server()
    # ChatModel's retries wait 0.25 + 0.5 + 1 s: a 4 s outage outlasts them.
    server.schedule_outage(after_chat=15, seconds=4)
    outputs = run_agent_job(kafka_bootstrap, input_topic, llm_agent(server.base_url), _config(kafka_bootstrap),
                            checkpoint_interval_ms=300, restart_attempts=20)
    stats = server.stats()
    assert stats.unavailable >= 4, f"the outage did not hit a call past its retries: {stats}"
    assert Counter(outputs) == reference
    assert (stats.chat, stats.repeated) == (len(inputs), 0), stats
    retried = [line for line in operator_log() if "failed its action in an earlier attempt; made again" in line]
    assert retried, "no call was made again after its action failed"


class Fanned(Event):
    pass


def fan_out_agent(counter: InvocationCounter, fail_child_input: str | None = None) -> Agent:
    class Lookup(Agent):
        @action(InputEvent)
        def look_up(event, ctx):
            found = ctx.call("lookup", event.input)
            if event.input == fail_child_input and counter.increment("child_fault_claims") == 1:
                counter.increment("child_fault")
                raise InjectedFailure(f"transient failure in the child for {event.input}")
            ctx.send_event(OutputEvent(output=found))

    child = Lookup(name="lookup-agent", resources={"lookup": _tool(counter, "lookup")})

    class Parent(Agent):
        @action(InputEvent)
        def fan_out(event, ctx):
            base = f"{ctx.key}|{ctx.seq}"
            results = ctx.call_agents([(child, f"{base}|a"), (child, f"{base}|b"), (child, f"{base}|c")])
            ctx.send_event(Fanned(results=results))

        @action(Fanned)
        def answer(event, ctx):
            summary = ctx.call("summarize", json.dumps(event.results))
            ctx.send_event(OutputEvent(output={"summary": summary}))

    return Parent(name="fan-out", resources={"summarize": _tool(counter, "summarize")}, sub_agents=[child])


def test_a_child_failing_once_inside_a_fan_out_is_run_again(kafka_bootstrap, tmp_path, operator_log):
    inputs = make_inputs(8, 4)
    input_topic = produce_inputs(kafka_bootstrap, inputs)
    reference_counter = InvocationCounter(tmp_path / "reference.db")
    reference = reference_outputs(fan_out_agent(reference_counter), inputs)
    counter = InvocationCounter(tmp_path / "calls.db")
    agent = fan_out_agent(counter, fail_child_input="key-003|2|b")
    outputs = run_agent_job(kafka_bootstrap, input_topic, agent, _config(kafka_bootstrap, max_concurrent_child_calls=2),
                            checkpoint_interval_ms=300, restart_attempts=5)
    assert counter.count("child_fault") == 1, "the child's failure was not injected"
    assert Counter(outputs) == reference
    assert _repeated(counter) == {}
    assert logical_call_counts(counter).keys() == logical_call_counts(reference_counter).keys()
    retried = [line for line in operator_log() if "call 1 to 'agent:lookup-agent' failed its action" in line]
    assert retried, "the failed child call was not made again"


# -- 3. in-place changes to memory -----------------------------------------------------------------------------
def logging_agent(counter: InvocationCounter, faults: tuple[int, ...] = ()) -> Agent:
    class Logbook(Agent):
        @action(InputEvent)
        def remember(event, ctx):
            if ctx.memory.get("log") is None:
                ctx.memory.set("log", [])
            entry = ctx.call("note", f"{ctx.key}|{ctx.seq}|{event.input['n']}")
            ctx.memory.get("log").append(entry)  # the ordinary habit: no set()
            seen = ctx.memory.get("seen")
            if seen is None:
                ctx.memory.set("seen", {event.input["n"]})
            else:
                seen.add(event.input["n"])  # a set, changed in place too
            ctx.send_event(Classified(label=entry))

        @action(Classified)
        def answer(event, ctx):
            _fail_once_past(counter, faults)  # after the key's memory was changed in place by `remember`
            ctx.send_event(OutputEvent(output={"log": list(ctx.memory.get("log")),
                                               "seen": sorted(ctx.memory.get("seen"))}))

    return Logbook(name="logbook", resources={"note": _tool(counter, "note")})


def test_in_place_changes_to_memory_values_survive_reuse(kafka_bootstrap, tmp_path, operator_log):
    inputs = make_inputs(12, 8)
    input_topic = produce_inputs(kafka_bootstrap, inputs)
    reference = reference_outputs(logging_agent(InvocationCounter(tmp_path / "reference.db")), inputs)
    counter = InvocationCounter(tmp_path / "calls.db")
    outputs = run_agent_job(kafka_bootstrap, input_topic, logging_agent(counter, faults=(30, 70)),
                            _config(kafka_bootstrap), checkpoint_interval_ms=300, restart_attempts=3)
    assert (counter.count("fault_0"), counter.count("fault_1")) == (1, 1), "the failures were not injected"
    # Each fault hit a run after its `remember` action had appended in place, and that action was reused
    # (its call ran once), not run again.
    assert _repeated(counter) == {}
    assert any(" restored: " in line or "restarted before" in line for line in operator_log())
    assert Counter(outputs) == reference


# -- 7. limits that are clear errors, not loops ------------------------------------------------------------------
def growing_agent(counter: InvocationCounter) -> Agent:
    class Growing(Agent):
        @action(InputEvent)
        def grow(event, ctx):
            counter.increment(f"grow:{ctx.key}:{ctx.seq}")
            pages = [*ctx.memory.get("pages", []), "p" * 300_000]  # the fourth input passes Kafka's 1 MB
            ctx.memory.set("pages", pages)
            ctx.send_event(OutputEvent(output=len(pages)))

    return Growing(name="growing")


def test_a_record_larger_than_kafka_accepts_fails_once_with_a_clear_error(kafka_bootstrap, tmp_path):
    input_topic = produce_inputs(kafka_bootstrap, [{"key": "big", "n": n} for n in range(5)])
    counter = InvocationCounter(tmp_path / "calls.db")
    with pytest.raises(Exception) as failure:  # noqa: B017 - the job's failure arrives as a Py4J error
        run_agent_job(kafka_bootstrap, input_topic, growing_agent(counter), _config(kafka_bootstrap),
                      checkpoint_interval_ms=300, restart_attempts=3)
    message = str(failure.value)
    assert "JournalRecordTooLargeError" in message and "the result of action grow is 1,20" in message, message[-3000:]
    assert "memory path 'pages'" in message and "message.max.bytes" in message
    # Not a restart loop: the input that cannot be journaled ran once, and nothing after it.
    assert counter.count("grow:big:4") == 1 and counter.count("grow:big:5") == 0, counter.counts()


def hanging_agent(counter: InvocationCounter, hang_s: float) -> Agent:
    def hang(text: str) -> str:
        counter.increment("hang_started")
        time.sleep(hang_s)  # the hung service (the fault itself, not a synchronisation)
        counter.increment("hang_returned")
        return text

    class Hanging(Agent):
        @action(InputEvent)
        def call(event, ctx):
            ctx.send_event(OutputEvent(output=ctx.call("hang", event.input["key"])))

    return Hanging(name="hanging", resources={"hang": Tool(hang, side_effects="external")})


def test_cancelling_while_a_call_hangs_takes_a_bounded_time(kafka_bootstrap, tmp_path, operator_log):
    from flink_agents_replay.flink.env import create_environment
    from flink_agents_replay.flink.pipeline import connect_to_agent
    from flink_agents_replay.local.jars import kafka_connector_jar
    from flink_agents_replay.testing.jobs import job_ended, keyed_json_inputs, running_job, wait_until

    input_topic = produce_inputs(kafka_bootstrap, [{"key": "stuck", "n": 0}])
    counter = InvocationCounter(tmp_path / "calls.db")
    env = create_environment(parallelism=1, checkpoint_interval_ms=300, jars=[kafka_connector_jar()])
    outputs = connect_to_agent(keyed_json_inputs(env, kafka_bootstrap, input_topic),
                               hanging_agent(counter, hang_s=90), _config(kafka_bootstrap, close_timeout_s=2))
    outputs.filter(lambda output: False).print()
    with running_job(env, "hanging") as client:
        wait_until(client, lambda: counter.count("hang_started") == 1, "the call to hang", timeout_s=60)
        cancelled = time.monotonic()
        client.cancel().result()
        wait_until(client, lambda: job_ended(client), "the job's end", timeout_s=60)
        took = time.monotonic() - cancelled
    assert took < 20, f"cancelling took {took:.1f} s while a call hung"
    assert counter.count("hang_returned") == 0, "the call did not hang through the cancellation"
    assert any("runs still had a call under way" in line for line in operator_log())


# -- 6. call ids identify the request ------------------------------------------------------------------------------
def stamped(counter: InvocationCounter):
    """An upstream that is not deterministic across attempts (it stamps each record with how often it saw it)."""

    def stamp(record: dict) -> dict:
        return {**record, "version": counter.increment(f"seen:{record['key']}:{record['n']}")}

    return stamp


def asking_agent(counter: InvocationCounter, base_url: str) -> Agent:
    class Asking(Agent):
        @action(InputEvent)
        def ask(event, ctx):
            reply = ctx.call("llm", prompt=f"{ctx.key} ticket {event.input['n']} version {event.input['version']}")
            if counter.increment("fault_claims") == 1:  # after the call: its record is in the journal
                raise InjectedFailure("after the model call of the first run")
            ctx.send_event(OutputEvent(output={"version": event.input["version"], "reply": reply}))

    return Asking(name="asking", resources={"llm": ChatModel("stub-model", base_url=base_url, retries=0)})


def test_another_input_at_the_same_seq_gets_another_call_id(kafka_bootstrap, tmp_path, model_server, operator_log):
    """The restarted attempt gets other inputs than the first (a changed upstream): the order restore gives up on
    the recorded ones and runs the new inputs at the same seqs. Their model calls must not carry the abandoned
    calls' idempotency keys, or the service answers them with the old requests' replies and skips them."""
    from pyflink.common import Types

    from flink_agents_replay.flink.env import create_environment
    from flink_agents_replay.flink.pipeline import connect_to_agent
    from flink_agents_replay.local.jars import kafka_connector_jar
    from flink_agents_replay.local.model_server import draft_reply
    from flink_agents_replay.testing.jobs import keyed_json_inputs

    keys = ("ana", "bo", "cy")
    input_topic = produce_inputs(kafka_bootstrap, [{"key": key, "n": 0} for key in keys])
    counter, server = InvocationCounter(tmp_path / "calls.db"), model_server()
    env = create_environment(parallelism=1, checkpoint_interval_ms=NO_CHECKPOINT_MS, restart_attempts=2,
                             jars=[kafka_connector_jar()], config=NO_CHECKPOINT_CONFIG)
    keyed = keyed_json_inputs(env, kafka_bootstrap, input_topic, bounded=True)
    keyed = keyed.map(stamped(counter), output_type=Types.PICKLED_BYTE_ARRAY()).key_by(
        lambda record: record["key"], key_type=Types.STRING())
    outputs = connect_to_agent(keyed, asking_agent(counter, server.base_url),
                               _config(kafka_bootstrap, order_restore_timeout_s=1.0))
    rows = outputs.map(canonical_output, output_type=Types.PICKLED_BYTE_ARRAY())
    with rows.execute_and_collect("asking") as results:
        got = list(results)
    assert counter.count("fault_claims") >= 2, "the failure was not injected"
    assert sorted((key, seq) for key, seq, _ in got) == [(key, 1) for key in keys]
    stats = server.stats()
    wrong = [(key, json.loads(output)) for key, _, output in got if json.loads(output)["reply"] != draft_reply(
        [{"role": "user", "content": f"{key} ticket 0 version 2"}])]
    assert (wrong, stats.idempotent_replays) == ([], 0), f"answered with another request's reply: {wrong}; {stats}"
    assert all(json.loads(output)["version"] == 2 for _, _, output in got)  # the restarted attempt's inputs
    abandoned = [line for line in operator_log() if "recorded history from there on is invalidated" in line]
    assert len(abandoned) == len(keys), "the recorded inputs were not abandoned"
