"""An action that catches a flaky tool's exception and retries in a loop, then charges a card, and then
crashes (an exception escapes the action) once, after the charge (found by an adversarial review).

A real user writes exactly this retry loop around a transiently failing service. The charge's result was
journaled before the crash, so it must be reused, not repeated. The caught failures of the flaky tool were
handled by the action: they are reused as raised (only a call whose exception left the action is made
again), so the next attempt takes the same path and the charge stays at its place among the calls. Were
they made again, the recovered service would end the loop earlier and the charge would run twice.
"""

from __future__ import annotations

from collections import Counter

import pytest

from flink_agents_replay import Agent, InputEvent, OutputEvent, Tool, action, current_call_id
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import make_inputs
from tests.harness.reference_runs import reference_then_faulty_run

pytestmark = pytest.mark.integration

KEYS, PER_KEY = 4, 10          # 40 inputs
TARGET = {"key": "key-002", "n": 5}


class ServiceUnavailable(Exception):
    """A transient error with a keyword-only constructor, as client libraries raise them."""

    def __init__(self, *, service: str, retry_after: float):
        super().__init__(f"{service} unavailable, retry after {retry_after}s")
        self.service = service
        self.retry_after = retry_after


def make_agent(counter: InvocationCounter, fault: bool, name: str, fails_before_success: int) -> Agent:
    def lookup_token(key, n):               # flaky: fails the first N times per request
        if counter.increment(f"flaky:{key}:{n}") <= fails_before_success:
            raise ServiceUnavailable(service="tokens", retry_after=0.0)
        return f"tok-{key}-{n}"

    def charge(key, n, token):              # the external effect we must not repeat
        counter.increment(f"charge:{key}:{n}")
        counter.increment("charge:total")
        counter.increment(f"callid:{key}:{n}:{current_call_id()}")   # the Idempotency-Key a service would see
        return f"receipt-{key}-{n}-{token}"

    class RetryingPayer(Agent):
        @action(InputEvent)
        def pay(event, ctx):
            key, n = event.input["key"], event.input["n"]
            token = None
            for _attempt in range(10):
                try:
                    token = ctx.call("tokens", key, n)
                    break
                except ServiceUnavailable:
                    continue
            receipt = ctx.call("charge", key, n, token)
            if fault and event.input == TARGET and counter.increment("fault:fired") == 1:
                raise RuntimeError("injected crash after the charge")
            ctx.send_event(OutputEvent(output={"receipt": receipt}))

    return RetryingPayer(name=name, resources={
        "tokens": Tool(lookup_token, side_effects="none"),
        "charge": Tool(charge, side_effects="external"),
    })


# 0: control (no transient failure, the charge stays the action's 2nd call); 2: the attack. Both run on the
# engine (tests/unit/test_habits_on_the_engine.py); the attack also as a Flink job.
@pytest.mark.parametrize("fails_before_success", [2])
def test_retry_loop_then_crash_does_not_repeat_charge(kafka_bootstrap, tmp_path, fails_before_success):
    inputs = make_inputs(KEYS, PER_KEY)
    assert TARGET in inputs
    run = reference_then_faulty_run(
        kafka_bootstrap, tmp_path, lambda c, fault, name: make_agent(c, fault, name, fails_before_success), inputs,
        name_prefix="adv-retry", checkpoint_interval_ms=300, restart_attempts=3)
    expected, outputs, counter = run.expected, run.outputs, run.counter

    counts = counter.counts()
    assert counts.get("fault:fired", 0) >= 2, f"the injected fault did not fire: {counts}"
    repeated = {k: v for k, v in counts.items() if k.startswith("charge:") and k != "charge:total" and v != 1}
    missing = [r for r in inputs if counts.get(f"charge:{r['key']}:{r['n']}", 0) == 0]
    actual = Counter(outputs)
    print("charges total", counts.get("charge:total"), "expected", len(inputs), "repeated", repeated,
          "flaky calls", sum(v for k, v in counts.items() if k.startswith("flaky:")))
    print("outputs", sum(actual.values()), "expected", sum(expected.values()),
          "missing", expected - actual, "extra", actual - expected)
    ids = sorted(k for k in counts if k.startswith(f"callid:{TARGET['key']}:{TARGET['n']}:"))
    print("call ids of the target's charges", ids)
    assert not missing
    assert repeated == {}, f"charges repeated after the crash: {repeated}"
    assert actual == expected, f"outputs differ: missing {expected - actual}, extra {actual - expected}"


class NotFound(Exception):
    pass


def make_get_or_create_agent(counter: InvocationCounter, fault: bool, name: str) -> Agent:
    """The get-or-create pattern: look the account up; if it is missing (caught NotFound), create it; then
    charge. Deterministic: the lookup fails only until the account was created."""

    def lookup(key, n):
        counter.increment(f"lookup:{key}:{n}")
        if counter.count(f"created:{key}:{n}") == 0:
            raise NotFound(f"no account for {key}#{n}")
        return f"acct-{key}-{n}"

    def create(key, n):
        counter.increment(f"created:{key}:{n}")
        return f"acct-{key}-{n}"

    def charge(key, n, account):
        counter.increment(f"charge:{key}:{n}")
        counter.increment("charge:total")
        return f"receipt-{account}"

    class Onboarder(Agent):
        @action(InputEvent)
        def pay(event, ctx):
            key, n = event.input["key"], event.input["n"]
            try:
                account, created = ctx.call("lookup", key, n), False
            except NotFound:
                account, created = ctx.call("create", key, n), True
            receipt = ctx.call("charge", key, n, account)
            if fault and event.input == TARGET and counter.increment("fault:fired") == 1:
                raise RuntimeError("injected crash after the charge")
            ctx.send_event(OutputEvent(output={"receipt": receipt, "created": created}))

    return Onboarder(name=name, resources={
        "lookup": Tool(lookup, side_effects="none"),
        "create": Tool(create, side_effects="external"),
        "charge": Tool(charge, side_effects="external"),
    })


def get_or_create_then_crash_does_not_repeat_charge(kafka_bootstrap, tmp_path):
    """Run on the engine only (tests/unit/test_habits_on_the_engine.py): the Flink-level case of this habit is
    the retry loop's above."""
    inputs = make_inputs(KEYS, PER_KEY)
    run = reference_then_faulty_run(kafka_bootstrap, tmp_path, make_get_or_create_agent, inputs,
                                    name_prefix="adv-getcreate", checkpoint_interval_ms=300, restart_attempts=3)
    expected, outputs, counter = run.expected, run.outputs, run.counter
    counts = counter.counts()
    actual = Counter(outputs)
    repeated = {k: v for k, v in counts.items()
                if (k.startswith("charge:") or k.startswith("created:")) and k != "charge:total" and v != 1}
    print("charges total", counts.get("charge:total"), "expected", len(inputs), "repeated", repeated,
          "fault fired", counts.get("fault:fired"))
    print("outputs", sum(actual.values()), "expected", sum(expected.values()),
          "missing", expected - actual, "extra", actual - expected)
    assert counts.get("fault:fired", 0) >= 2, f"the injected fault did not fire: {counts}"
    assert repeated == {}, f"effects repeated after the crash: {repeated}"
    assert actual == expected, f"outputs differ: missing {expected - actual}, extra {actual - expected}"
