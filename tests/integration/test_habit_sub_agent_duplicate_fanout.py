"""Attack: a fan-out to the same sub-agent with identical inputs (two identical items in a basket are
charged twice, on purpose), then a crash of the parent action after the fan-out returned.

Checks: each logical child charge runs exactly once (3 per input, 2 of them with identical arguments),
the identical requests get different call ids (README: "call ids differ between different requests";
a service that honours idempotency keys would otherwise answer the second with the first's result), the
ids differ between keys and inputs, and outputs equal a failure-free run. The parent crashes twice at
one input (once after the fan-out, once more in the next attempt after the fan-out is reused) and once
at another input, with no checkpoint completed (restart before the first checkpoint, twice).
"""

from __future__ import annotations

from collections import Counter

import pytest

from flink_agents_replay import Agent, InputEvent, OutputEvent, Tool, action, current_call_id
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import make_inputs
from tests.harness.reference_runs import reference_then_faulty_run

pytestmark = pytest.mark.integration

KEYS, PER_KEY = 3, 8
TWICE = {"key": "key-001", "n": 3}     # the parent crashes here in two consecutive attempts
ONCE = {"key": "key-002", "n": 6}


def make_agent(counter: InvocationCounter, fault: bool, name: str) -> Agent:
    def charge(item):
        counter.increment(f"charge:{item['key']}:{item['n']}")
        counter.increment(f"callid:{current_call_id()}")
        # The call id in the receipt: identical requests get different receipts, so a journaled result handed to
        # two of them (one record taken twice) changes the outputs.
        return f"charged {item['sku']} x{item['amount']} for {item['key']}#{item['n']} id {current_call_id()}"

    class Charger(Agent):
        @action(InputEvent)
        def run(event, ctx):
            receipt = ctx.call("charge", event.input)
            ctx.memory.set("charged", ctx.memory.get("charged", 0) + 1)
            ctx.send_event(OutputEvent(output=receipt))

    class Shop(Agent):
        @action(InputEvent)
        def checkout(event, ctx):
            key, n = event.input["key"], event.input["n"]
            item = {"key": key, "n": n, "sku": "mug", "amount": 1}
            results = ctx.call_agents([("charger", item), ("charger", dict(item)),
                                       ("charger", dict(item, sku="tea"))])
            if fault:
                if event.input == TWICE and counter.increment("fault:twice") <= 2:
                    raise RuntimeError("injected crash after the fan-out")
                if event.input == ONCE and counter.increment("fault:once") == 1:
                    raise RuntimeError("injected crash after the fan-out")
            ctx.send_event(OutputEvent(output={"receipts": results}))

    return Shop(name=name, sub_agents=[Charger(name="charger",
                                               resources={"charge": Tool(charge, side_effects="external")})])


def test_duplicate_fanout_to_sub_agent(kafka_bootstrap, tmp_path):
    inputs = make_inputs(KEYS, PER_KEY)
    run = reference_then_faulty_run(kafka_bootstrap, tmp_path, make_agent, inputs, name_prefix="adv-fan",
                                    checkpoint_interval_ms=600_000, restart_attempts=5)
    expected, outputs, counter, ref_counter = run.expected, run.outputs, run.counter, run.reference_counter
    assert sum(expected.values()) == len(inputs)

    counts = counter.counts()
    actual = Counter(outputs)
    wrong_charges = {f"{r['key']}:{r['n']}": counts.get(f"charge:{r['key']}:{r['n']}", 0) for r in inputs}
    wrong_charges = {k: v for k, v in wrong_charges.items() if v != 3}
    ids = {k: v for k, v in counts.items() if k.startswith("callid:")}
    ref_ids = {k for k in ref_counter.counts() if k.startswith("callid:")}
    print(f"faults fired twice-target {counts.get('fault:twice')}x, once-target {counts.get('fault:once')}x; "
          f"outputs {len(outputs)} expected {sum(expected.values())}; charges "
          f"{sum(v for k, v in counts.items() if k.startswith('charge:'))} expected {3 * len(inputs)}; "
          f"inputs not charged 3x {wrong_charges}; distinct call ids {len(ids)} (failure-free run: {len(ref_ids)}) "
          f"expected {3 * len(inputs)}; ids used more than once {[k for k, v in ids.items() if v > 1][:4]}")
    assert counts.get("fault:twice", 0) >= 3 and counts.get("fault:once", 0) >= 2, counts
    assert len(ref_ids) == 3 * len(inputs), "identical child requests share a call id (failure-free run)"
    assert wrong_charges == {}, f"child charges not made exactly once: {wrong_charges}"
    assert len(ids) == 3 * len(inputs) and all(v == 1 for v in ids.values()), ids
    assert actual == expected, f"outputs differ: missing {expected - actual}, extra {actual - expected}"
