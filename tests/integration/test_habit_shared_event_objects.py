"""Attack: objects shared between an action, the events it receives and the other handlers of an event.

- Two actions handle ``InputEvent``: the first changes ``event.input`` in place (adds tags, a nested list
  entry); the second reads the input, charges with it (an external call) and reports what it saw.
- An event carrying a list is handled by two actions; each appends to the list it received and reports it.

Fault: the second ``InputEvent`` handler raises once at one input, after its charge returned, and an
``emit``-side handler raises once at another input: the first handler is then reused (not run), so if the
second handler only saw the first one's changes through a shared object, it now sees another input, makes
another charge request (a new call id: charged twice) and outputs something else.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from flink_agents_replay import Agent, Event, InputEvent, OutputEvent, Tool, action
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import make_inputs
from tests.harness.reference_runs import reference_then_faulty_run

pytestmark = pytest.mark.integration

KEYS, PER_KEY = 4, 10
FAULT_AFTER_CHARGE = {"key": "key-000", "n": 5}
FAULT_IN_SECOND_BASKET_HANDLER = {"key": "key-003", "n": 3}


class Basket(Event):
    pass


def make_agent(counter: InvocationCounter, fault: bool, name: str) -> Agent:
    def charge(key, seq, payload):
        counter.increment(f"charge:{key}:{seq}")
        return f"charged {key}#{seq} {json.dumps(payload, sort_keys=True)}"

    class SharingAgent(Agent):
        @action(InputEvent)
        def tag_input(event, ctx):
            event.input["tags"] = event.input.get("tags", []) + ["tagged"]
            event.input.setdefault("trail", []).append("tag_input")
            ctx.send_event(Basket(items=[event.input["n"]], n=event.input["n"]))

        @action(InputEvent)
        def charge_input(event, ctx):
            receipt = ctx.call("charge", ctx.key, ctx.seq, event.input)
            # By key and n alone: a handler that saw another's changes to the event must still meet its fault.
            if (fault and {k: event.input[k] for k in FAULT_AFTER_CHARGE} == FAULT_AFTER_CHARGE
                    and counter.increment("fault:after-charge") == 1):
                raise RuntimeError("injected fault after the charge")
            ctx.send_event(OutputEvent(output={"what": "charge", "receipt": receipt,
                                               "input_seen": json.dumps(event.input, sort_keys=True)}))

        @action(Basket)
        def add_gift(event, ctx):
            event.items.append("gift")
            ctx.send_event(OutputEvent(output={"what": "gift", "items": list(event.items)}))

        @action(Basket)
        def add_card(event, ctx):
            event.items.append("card")
            if (fault and {"key": ctx.key, "n": event.n} == FAULT_IN_SECOND_BASKET_HANDLER
                    and counter.increment("fault:basket") == 1):
                raise RuntimeError("injected fault in the second Basket handler")
            ctx.send_event(OutputEvent(output={"what": "card", "items": list(event.items)}))

    return SharingAgent(name=name, resources={"charge": Tool(charge, side_effects="external")})


def test_events_shared_between_handlers(kafka_bootstrap, tmp_path):
    inputs = make_inputs(KEYS, PER_KEY)
    run = reference_then_faulty_run(kafka_bootstrap, tmp_path, make_agent, inputs, name_prefix="adv-share",
                                    checkpoint_interval_ms=600_000, restart_attempts=4)
    expected, outputs, counter = run.expected, run.outputs, run.counter
    assert sum(expected.values()) == 3 * len(inputs)
    counts = counter.counts()
    actual = Counter(outputs)
    repeated = {k: v for k, v in counts.items() if not k.startswith("fault:") and v > 1}
    print(f"faults fired {counts.get('fault:after-charge')}x/{counts.get('fault:basket')}x; outputs {len(outputs)} "
          f"expected {sum(expected.values())}; charges {sum(v for k, v in counts.items() if k.startswith('charge:'))} "
          f"expected {len(inputs)}; repeated {repeated}")
    for (key, seq, out) in sorted(set(expected) ^ set(actual))[:8]:
        print("  differs:", key, seq, "expected" if (key, seq, out) in expected else "actual  ", out)
    assert counts.get("fault:after-charge", 0) >= 2 and counts.get("fault:basket", 0) >= 2, counts
    assert repeated == {}, f"calls repeated: {repeated}"
    assert actual == expected, f"outputs differ: missing {expected - actual}, extra {actual - expected}"
