"""Action fingerprints: the same code gives the same fingerprint in every Python process, other code another.

A restore or a replay compares the fingerprint journaled with each completed action against the fingerprint
of the code running now, in another process (a resubmitted job, a replay job). Set constants (``x in {...}``
compiles to a frozenset), frozenset defaults and sets in closures iterate in an order that depends on the
process's hash seed; none of that may reach the fingerprint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action

#: Agents whose code holds sets in every place a set can hide: a set literal, a frozenset default, a set
#: inside a dict literal, and a helper function (with a set in its closure) in the action's closure.
PINNED_PLAIN_ENCODING = "c788373617c349592156299e6e27e5578f3b3f4fdb2e72c61dc4d7c5a2099db3"


SEEDED_AGENTS = '''
from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action

WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")


class SetLiteral(Agent):
    @action(InputEvent)
    def route(event, ctx):
        label = "known" if event.input in {"alpha", "beta", "gamma", "delta", "epsilon", "zeta"} else "other"
        ctx.send_event(OutputEvent(output=label))


class FrozensetDefault(Agent):
    @action(InputEvent)
    def route(event, ctx, allowed=frozenset({"alpha", "beta", "gamma", "delta", "epsilon", "zeta"})):
        ctx.send_event(OutputEvent(output=event.input in allowed))


class DictLiteral(Agent):
    @action(InputEvent)
    def route(event, ctx):
        table = {"alpha": 1, "beta": {"gamma", "delta", "epsilon", "zeta"}, "eta": [1.5, None]}
        ctx.send_event(OutputEvent(output=table.get(event.input)))


def closure_agent():
    stop_words = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta"}
    config = {"mode": "strict", "skip": frozenset({"eta", "theta", "iota"})}

    def clean(text):
        return [word for word in text.split() if word not in stop_words and word not in config["skip"]]

    class ClosureOverHelper(Agent):
        @action(InputEvent)
        def route(event, ctx):
            ctx.send_event(OutputEvent(output=clean(event.input)))

    return ClosureOverHelper()


AGENTS = [SetLiteral(), FrozensetDefault(), DictLiteral(), closure_agent()]
'''

_REPORT = """
import json, sys
sys.path.insert(0, sys.argv[1])
import seeded_agents
print(json.dumps({"order": list(frozenset(seeded_agents.WORDS)),
                  "fingerprints": {agent.name: [spec.fingerprint for spec in agent.actions]
                                   for agent in seeded_agents.AGENTS}}))
"""

SEEDS = ("0", "1", "2", "3", "4", "5")


def test_fingerprints_are_equal_under_every_hash_seed(tmp_path):
    (tmp_path / "seeded_agents.py").write_text(SEEDED_AGENTS)
    runs = {seed: subprocess.Popen([sys.executable, "-c", _REPORT, str(tmp_path)], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONHASHSEED": seed})
            for seed in SEEDS}
    reports = {}
    for seed, process in runs.items():
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        reports[seed] = json.loads(out)
    # The seeds really give sets other iteration orders, so equal fingerprints below mean something.
    assert len({tuple(report["order"]) for report in reports.values()}) > 1
    distinct = {agent: len({tuple(report["fingerprints"][agent]) for report in reports.values()})
                for agent in reports[SEEDS[0]]["fingerprints"]}
    assert distinct == dict.fromkeys(distinct, 1), f"distinct fingerprints from {len(SEEDS)} hash seeds: {distinct}"


# -- what counts as the action's code ------------------------------------------------------------------
ROUTING = '''
from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action


def make(threshold=0.5):
    def score(text):
        return len(text) / 10

    class Routing(Agent):
        @action(InputEvent)
        def route(event, ctx, labels=frozenset({"alpha", "beta"})):
            label = "known" if event.input in {"alpha", "beta"} else "other"
            if score(event.input) > threshold:
                label = ctx.call("llm", event.input)
            ctx.send_event(OutputEvent(output=(label, event.input in labels)))

    return Routing()


agent = make()
'''


def fingerprint_of(source: str, *, first_line: int = 1, filename: str = "<agent>") -> str:
    """The fingerprint of the one action of ``agent`` defined by ``source`` starting at line ``first_line``."""
    namespace: dict = {}
    exec(compile("\n" * (first_line - 1) + textwrap.dedent(source), filename, "exec"), namespace)
    [spec] = namespace["agent"].actions
    return spec.fingerprint


def changed(old: str, new: str) -> str:
    assert ROUTING.count(old) == 1, old
    return ROUTING.replace(old, new)


def test_moving_the_code_to_other_lines_or_another_file_keeps_the_fingerprint():
    assert fingerprint_of(ROUTING) == fingerprint_of(ROUTING)
    assert fingerprint_of(ROUTING, first_line=300, filename="elsewhere.py") == fingerprint_of(ROUTING)
    # Blank lines inside the action and its helper move their lines relative to each other.
    spread = ROUTING.replace("        return len(text) / 10\n", "\n\n        return len(text) / 10\n")
    spread = spread.replace("            ctx.send_event(", "\n\n            ctx.send_event(")
    assert fingerprint_of(spread) == fingerprint_of(ROUTING)


def test_a_genuine_code_change_changes_the_fingerprint():
    original = fingerprint_of(ROUTING)
    variants = {
        "another constant in the set literal": changed('in {"alpha", "beta"}', 'in {"alpha", "gamma"}'),
        "another function called": changed("if score(event.input)", "if len(event.input)"),
        "another resource called": changed('ctx.call("llm"', 'ctx.call("search"'),
        "a changed helper in the closure": changed("len(text) / 10", "len(text) / 20"),
        "another default value": changed('labels=frozenset({"alpha", "beta"})', 'labels=frozenset({"alpha"})'),
        "another value in the closure": changed("agent = make()", "agent = make(threshold=0.7)"),
    }
    fingerprints = {what: fingerprint_of(source) for what, source in variants.items()}
    assert [what for what, fingerprint in fingerprints.items() if fingerprint == original] == []
    assert len(set(fingerprints.values())) == len(variants)


class _Client:
    """An object whose repr holds its address, like most objects'."""

    def get(self, value):
        return value


class _OtherClient(_Client):
    pass


def _client_agent(client) -> Agent:
    class UsesClient(Agent):
        @action(InputEvent)
        def act(event, ctx):
            ctx.send_event(OutputEvent(output=client.get(event.input)))

    return UsesClient()


def test_other_objects_in_a_closure_count_by_their_type_only():
    first, second = _Client(), _Client()
    assert repr(first) != repr(second)
    assert _client_agent(first).actions[0].fingerprint == _client_agent(second).actions[0].fingerprint
    assert _client_agent(_OtherClient()).actions[0].fingerprint != _client_agent(first).actions[0].fingerprint


def _cyclic_agent(tail: int) -> Agent:
    data: list = [1, tail]
    data.append(data)  # a list holding itself

    def walk(n):  # a closure over itself
        return 0 if n == 0 else walk(n - 1) + len(data)

    def plus_one(inner):
        def call(x):
            return inner(x) + 1
        return call

    chained = len  # a chain of closures far deeper than the recursion limit
    for _ in range(5000):
        chained = plus_one(chained)

    class Cyclic(Agent):
        @action(InputEvent)
        def act(event, ctx):
            ctx.send_event(OutputEvent(output=walk(3) + chained([])))

    return Cyclic()


def test_cyclic_and_deep_closures_are_fingerprinted_without_endless_recursion():
    assert _cyclic_agent(2).actions[0].fingerprint == _cyclic_agent(2).actions[0].fingerprint
    assert _cyclic_agent(2).actions[0].fingerprint != _cyclic_agent(3).actions[0].fingerprint


def test_the_encoding_of_plain_values_is_pinned_across_versions():
    """Fingerprints are persisted in every completion: an encoding change would make an upgrade see every
    journaled action as changed code. Plain values only (code objects are the running Python's)."""
    import hashlib

    from flink_agents_replay.api.agent import _CodeEncoder

    values = [None, ..., True, False, 0, -5, 10**50, 1.5, 2j, "héllo", b"\x00", (1, 2), [3], {1, 2},
              frozenset({3}), {"a": [1, {"b": None}]}, int, len, object()]
    encoded = b"".join(_CodeEncoder().encode(value) for value in values)
    # Written by 0.1.0's encoder (the same bytes since).
    assert hashlib.sha256(encoded).hexdigest() == PINNED_PLAIN_ENCODING


#: Where each public class and function of the package lived in 0.5.1, the name a fingerprint gives it when an
#: action's default, closure or constant holds it. Moving a module must not change these names: completions
#: journaled under 0.5.1 would no longer match the same code (fingerprint_policy would warn, or fail the job).
NAMES_IN_0_5_1 = {
    "Agent": "flink_agents_replay.agent.Agent",
    "AgentConfig": "flink_agents_replay.config.AgentConfig",
    "AgentOutput": "flink_agents_replay.operator.AgentOutput",
    "Argument": "flink_agents_replay.tools.Argument",
    "CallBlocked": "flink_agents_replay.errors.CallBlocked",
    "ChatModel": "flink_agents_replay.chat_model.ChatModel",
    "ChatModelError": "flink_agents_replay.errors.ChatModelError",
    "ChatResult": "flink_agents_replay.records.chat.ChatResult",
    "Event": "flink_agents_replay.events.Event",
    "InDoubtPolicy": "flink_agents_replay.resources.InDoubtPolicy",
    "InputEvent": "flink_agents_replay.events.InputEvent",
    "OutputEvent": "flink_agents_replay.events.OutputEvent",
    "Resource": "flink_agents_replay.resources.Resource",
    "RunnerContext": "flink_agents_replay.agent.RunnerContext",
    "SideEffects": "flink_agents_replay.resources.SideEffects",
    "Tool": "flink_agents_replay.resources.Tool",
    "ToolCall": "flink_agents_replay.records.chat.ToolCall",
    "ToolLoopLimitError": "flink_agents_replay.errors.ToolLoopLimitError",
    "ToolLoopResult": "flink_agents_replay.tool_loop.ToolLoopResult",
    "Usage": "flink_agents_replay.records.chat.Usage",
    "action": "flink_agents_replay.agent.action",
    "connect_to_agent": "flink_agents_replay.pipeline.connect_to_agent",
    "current_call_id": "flink_agents_replay.call_site.current_call_id",
    "run_tool_loop": "flink_agents_replay.tool_loop.run_tool_loop",
    "tool": "flink_agents_replay.tools.tool",
}


def test_a_fingerprint_names_package_objects_by_their_0_5_1_module_wherever_they_live_now():
    import flink_agents_replay
    from flink_agents_replay.api.agent import _qualified_name
    from flink_agents_replay.storage.formats.package_values import (
        PACKAGE_EXCEPTIONS,
        PERSISTED_CLASSES,
        package_class_from_id,
    )

    found = {name: package_class_from_id(["flink-agents-replay", "class", name]) for name in PERSISTED_CLASSES}
    found.update(PACKAGE_EXCEPTIONS)
    found.update({name: getattr(flink_agents_replay, name) for name in NAMES_IN_0_5_1 if name not in found})
    found = {name: value for name, value in found.items() if name in NAMES_IN_0_5_1}
    assert set(found) == set(NAMES_IN_0_5_1)
    assert {name: _qualified_name(value).decode() for name, value in found.items()} == NAMES_IN_0_5_1



PINNED_IN_0_5_1 = '''
from flink_agents_replay import Agent, InputEvent, OutputEvent, SideEffects, Tool, action


class Pinned(Agent):
    @action(InputEvent)
    def route(event, ctx, effects=SideEffects.NONE, kinds=(Tool, OutputEvent)):
        ctx.send_event(OutputEvent(output=[effects.value, [kind.__name__ for kind in kinds]]))


print(Pinned(name="pinned").actions_for(InputEvent(input=1))[0].fingerprint)
'''


def test_an_action_holding_package_objects_has_the_fingerprint_0_5_1_gave_it():
    # 5965a2d1752b6147: this agent's fingerprint under 0.5.1 (b7fb4cc, before the modules moved), Python 3.11.
    shown = subprocess.run([sys.executable, "-c", PINNED_IN_0_5_1], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == "5965a2d1752b6147"
