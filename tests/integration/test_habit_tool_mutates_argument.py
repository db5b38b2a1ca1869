"""A tool that changes its argument in place, and that argument lives in memory (found by an adversarial
review).

A chat wrapper that appends its reply to the conversation it is given is a common pattern::

    history = ctx.memory.get("chat")          # a list in memory
    history.append({"role": "user", ...})
    reply = ctx.call("llm", history, question) # the tool appends {"role": "assistant", ...} to history

A reused call returns its result without running the tool, so it cannot append again: the runtime hands
every resource a copy of its arguments, in a failure-free run too, so both runs see the same
conversation (only what the action itself put in memory). The fault cuts the action short after the call
returned; the next attempt reuses the call; memory, outputs and later requests must equal the
failure-free run's.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from flink_agents_replay import Agent, InputEvent, OutputEvent, Tool, action
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import make_inputs
from tests.harness.reference_runs import reference_then_faulty_run

pytestmark = pytest.mark.integration

KEYS, PER_KEY = 4, 10
FAULT_AFTER_LLM = {"key": "key-002", "n": 6}


def make_agent(counter: InvocationCounter, fault: bool, name: str) -> Agent:
    def llm(key, history, question):
        counter.increment(f"llm:{key}:{question}")
        counter.increment(f"llm-request:{key}:{question}:history-len-{len(history)}")
        reply = f"answer to {question} after {len(history)} messages"
        history.append({"role": "assistant", "content": reply})   # the wrapper keeps the conversation
        return reply

    class ChatAgent(Agent):
        @action(InputEvent)
        def chat(event, ctx):
            history = ctx.memory.get("chat")
            if history is None:
                history = []
                ctx.memory.set("chat", history)
            question = f"q{event.input['n']}"
            history.append({"role": "user", "content": question})
            reply = ctx.call("llm", ctx.key, history, question)
            if fault and event.input == FAULT_AFTER_LLM and counter.increment("fault:after-llm") == 1:
                raise RuntimeError("injected fault after the model call returned")
            ctx.send_event(OutputEvent(output={"reply": reply, "chat": json.dumps(ctx.memory.get("chat"))}))

    return ChatAgent(name=name, resources={"llm": Tool(llm, side_effects="none")})


def test_tool_that_appends_to_memory_list(kafka_bootstrap, tmp_path):
    inputs = make_inputs(KEYS, PER_KEY)
    run = reference_then_faulty_run(kafka_bootstrap, tmp_path, make_agent, inputs, name_prefix="adv-chat",
                                    checkpoint_interval_ms=600_000, restart_attempts=3)
    expected, outputs, counter, ref_counter = run.expected, run.outputs, run.counter, run.reference_counter
    counts = counter.counts()
    actual = Counter(outputs)
    repeated = {k: v for k, v in counts.items() if k.startswith("llm:") and v > 1}
    ref_requests = {k for k in ref_counter.counts() if k.startswith("llm-request:")}
    job_requests = {k for k in counts if k.startswith("llm-request:")}
    print(f"fault fired {counts.get('fault:after-llm')}x; outputs {len(outputs)} expected {sum(expected.values())}; "
          f"differing outputs {len(set(expected) - set(actual))}; repeated {repeated}")
    print("model requests only in the failed-over job:", sorted(job_requests - ref_requests))
    print("model requests only in the failure-free run:", sorted(ref_requests - job_requests))
    for (key, seq, out) in sorted(set(expected) ^ set(actual))[:2]:
        print("  differs:", key, seq, "expected" if (key, seq, out) in expected else "actual  ", out)
    assert counts.get("fault:after-llm", 0) >= 2, counts
    assert repeated == {}, f"calls repeated: {repeated}"
    assert job_requests == ref_requests, "the model was asked other questions than in a failure-free run"
    assert actual == expected, f"outputs differ: missing {expected - actual}, extra {actual - expected}"
