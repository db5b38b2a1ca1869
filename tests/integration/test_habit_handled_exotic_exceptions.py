"""Attack: a tool raises an exception the way real client libraries do, the action catches it and carries
on (falls back), and a crash at a later input restarts the job before its first checkpoint completed, so
every earlier action must be reused from the journal records that hold those exceptions.

Exceptions used (each a separate job):
- ``positional``: ``QuotaExceeded(user, limit)`` — two required positional arguments, ``args`` is the
  formatted message (``pickle`` re-creates exceptions as ``cls(*args)``, which raises TypeError here);
- ``unpicklable``: ``ClientError(msg)`` holding its HTTP connection (a ``threading.Lock``), like
  ``requests``' errors carry their response;
- ``kwonly``: keyword-only constructor, which the README says is handled (control).

In a failure-free run (no journal) all of them are harmless: the action catches them.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from flink_agents_replay import Agent, InputEvent, OutputEvent, Tool, action
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import make_inputs
from tests.harness.reference_runs import reference_then_faulty_run

pytestmark = pytest.mark.integration

KEYS, PER_KEY = 4, 10
TARGET = {"key": "key-001", "n": 6}


class QuotaExceeded(Exception):
    def __init__(self, user, limit):
        super().__init__(f"{user} is over its quota of {limit}")
        self.user = user
        self.limit = limit


class _Connection:
    def __init__(self):
        self.lock = threading.Lock()


class ClientError(Exception):
    def __init__(self, message):
        super().__init__(message)
        self.connection = _Connection()      # what a real HTTP error drags along


class Throttled(Exception):
    def __init__(self, *, user, limit):
        super().__init__(f"{user} throttled at {limit}")
        self.user = user
        self.limit = limit


def raise_exotic(kind: str, key: str):
    if kind == "positional":
        raise QuotaExceeded(key, 3)
    if kind == "unpicklable":
        raise ClientError(f"503 for {key}")
    raise Throttled(user=key, limit=3)


def make_agent(counter: InvocationCounter, fault: bool, name: str, kind: str) -> Agent:
    def quota(key, n):
        counter.increment(f"quota:{key}:{n}")
        if n % 2 == 1:
            raise_exotic(kind, key)
        return "within quota"

    def notify(key, n, status):
        counter.increment(f"notify:{key}:{n}")
        return f"sent-{key}-{n}-{status}"

    class QuotaAgent(Agent):
        @action(InputEvent)
        def handle(event, ctx):
            key, n = event.input["key"], event.input["n"]
            try:
                status = ctx.call("quota", key, n)
            except (QuotaExceeded, ClientError, Throttled) as error:
                status = f"fallback: {type(error).__name__}"
            receipt = ctx.call("notify", key, n, status)
            history = ctx.memory.get("history")
            if history is None:
                history = []
                ctx.memory.set("history", history)
            history.append(status)
            if fault and event.input == TARGET and counter.increment("fault:fired") == 1:
                raise RuntimeError("injected crash")
            ctx.send_event(OutputEvent(output={"receipt": receipt, "history": list(history)}))

    return QuotaAgent(name=name, resources={"quota": Tool(quota, side_effects="none"),
                                            "notify": Tool(notify, side_effects="external")})


#: Every kind runs on the engine (tests/unit/test_habits_on_the_engine.py); this one also as a Flink job.
KINDS = ["kwonly", "positional", "unpicklable"]


@pytest.mark.parametrize("kind", ["unpicklable"])
def test_handled_exotic_exceptions_survive_restart_before_checkpoint(kafka_bootstrap, tmp_path, kind):
    inputs = make_inputs(KEYS, PER_KEY)
    run = reference_then_faulty_run(kafka_bootstrap, tmp_path, lambda c, fault, name: make_agent(c, fault, name, kind),
                                    inputs, name_prefix=f"adv-exc-{kind}", checkpoint_interval_ms=600_000,
                                    restart_attempts=3, keep_job_error=True)  # report what the user would see
    expected, outputs, counter, error = run.expected, run.outputs, run.counter, run.error
    assert sum(expected.values()) == len(inputs)
    counts = counter.counts()
    notify_repeats = {k: v for k, v in counts.items() if k.startswith("notify:") and v > 1}
    actual = Counter(outputs)
    print(f"[{kind}] fault fired {counts.get('fault:fired', 0)}x; outputs {len(outputs)} "
          f"expected {sum(expected.values())}; "
          f"notify repeated {notify_repeats}; job error: {str(error)[-600:] if error else None}")
    assert error is None, f"the job failed: {error}"
    assert counts.get("fault:fired", 0) >= 2, f"the injected fault did not fire: {counts}"
    assert notify_repeats == {}, f"external calls repeated: {notify_repeats}"
    assert actual == expected, f"outputs differ: missing {expected - actual}, extra {actual - expected}"
