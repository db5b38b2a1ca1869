"""Attack: memory changed in place in the ways real users write it, reused after restarts.

Every input of a key runs two actions: ``mutate`` (InputEvent) changes memory in place, ``emit`` (the
event it sends) reports the whole memory as output. Patterns in ``mutate``:

1. ``state``: a dict of lists, a set inside the dict and an object of a user class with a list
   attribute; on the first input it is ``set`` first and changed *after* the ``set``, later inputs change
   it in place through ``get``;
2. the same list stored under two paths (``x`` and ``y``), then appended to through ``x``;
3. a nested path: ``get("profile.tags").append(...)``;
4. an object taken from memory is sent in an event, and the handler changes the event's copy.

Faults: ``emit`` raises at two inputs (restart during recovery: the second fault fires in a later
attempt or in the same one), so the ``mutate`` actions of everything processed so far are reused from
their journaled memory updates. Runs without checkpoints (restart before the first checkpoint: all of
the history is reused) and with frequent checkpoints.
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

KEYS, PER_KEY = 4, 12
FAULTS = ({"key": "key-001", "n": 4}, {"key": "key-003", "n": 8})


class Profile:
    def __init__(self, name):
        self.name = name
        self.visits = 0
        self.history = []
        self.seen = set()


class Emitted(Event):
    pass


class Peek(Event):
    pass


def plain(value):
    """JSON-able, canonical form of memory values (sets sorted, objects as their attributes)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(plain(v) for v in value)
    if isinstance(value, Profile):
        return {"Profile": plain(vars(value))}
    return value


def make_agent(counter: InvocationCounter, fault: bool, name: str) -> Agent:
    def enrich(key, n):
        counter.increment(f"enrich:{key}:{n}")
        return f"e{n}"

    class MemoryAgent(Agent):
        @action(InputEvent)
        def mutate(event, ctx):
            key, n = event.input["key"], event.input["n"]
            tag = ctx.call("enrich", key, n)
            state = ctx.memory.get("state")
            if state is None:
                state = {"lists": {"a": [], "b": []}, "tags": set(), "profile": Profile(key)}
                ctx.memory.set("state", state)                      # set, then changed after the set
                shared = []
                ctx.memory.set("x", shared)
                ctx.memory.set("y", shared)                         # one object under two paths
                ctx.memory.set("profile", {"tags": [], "meta": {"created_at": n}})
            state["lists"]["a"].append(n)
            state["lists"]["b"].append(tag)
            state["tags"].add(f"t{n % 3}")
            state["profile"].visits += 1
            state["profile"].history.append(tag)
            state["profile"].seen.add(n % 4)
            ctx.memory.get("x").append(n)
            ctx.memory.get("profile.tags").append(tag)
            ctx.memory.get("profile.meta")["last"] = n
            ctx.send_event(Peek(profile=state["profile"]))
            ctx.send_event(Emitted(n=n))

        @action(Peek)
        def peek(event, ctx):
            event.profile.visits += 1000                           # the event's copy, not memory

        @action(Emitted)
        def emit(event, ctx):
            fired = None
            for i, target in enumerate(FAULTS):
                if fault and {"key": ctx.key, "n": event.n} == target and counter.increment(f"fault{i}:fired") == 1:
                    fired = i
            if fired is not None:
                raise RuntimeError(f"injected fault {fired}")
            ctx.send_event(OutputEvent(output={"n": event.n, "memory": json.dumps(plain(ctx.memory.to_dict()),
                                                                                   sort_keys=True)}))

    return MemoryAgent(name=name, resources={"enrich": Tool(enrich, side_effects="none")})


# A restart before the first checkpoint runs on the engine (tests/unit/test_habits_on_the_engine.py: it restarts
# before a checkpoint whatever the interval); restarts after checkpoints run here, as a Flink job.
@pytest.mark.parametrize("checkpoint_interval_ms", [200], ids=["checkpoints"])
def test_in_place_memory_changes_survive_restarts(kafka_bootstrap, tmp_path, checkpoint_interval_ms):
    inputs = make_inputs(KEYS, PER_KEY)
    run = reference_then_faulty_run(kafka_bootstrap, tmp_path, make_agent, inputs, name_prefix="adv-mem",
                                    checkpoint_interval_ms=checkpoint_interval_ms, restart_attempts=4)
    expected, outputs, counter = run.expected, run.outputs, run.counter
    assert sum(expected.values()) == len(inputs)

    counts = counter.counts()
    actual = Counter(outputs)
    repeated = {k: v for k, v in counts.items() if k.startswith("enrich:") and v > 1}
    print(f"faults fired {counts.get('fault0:fired')}x/{counts.get('fault1:fired')}x; outputs {len(outputs)} "
          f"expected {sum(expected.values())}; enrich repeated {repeated}")
    for (key, seq, out) in sorted(set(expected) ^ set(actual))[:6]:
        print("  differs:", key, seq, "expected" if (key, seq, out) in expected else "actual", out)
    assert counts.get("fault0:fired", 0) >= 2 and counts.get("fault1:fired", 0) >= 2, f"faults did not fire: {counts}"
    assert repeated == {}, f"calls repeated: {repeated}"
    assert actual == expected, f"outputs differ: missing {expected - actual}, extra {actual - expected}"
