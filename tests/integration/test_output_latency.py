"""A run's output leaves once its records are acknowledged, not when a slot frees for the next run (issue 33).

One run slot (``max_concurrent_runs=1``), three keys A, B and C arriving at once, each run one 1 s call, and every
broker reply (journal acknowledgements included) 200 ms late through a delay proxy. A's run ends at about 1 s
and B's run starts in its slot; A's records are acknowledged at about 1.2 s, while B's call is under way. A's
output must leave then: before B's call returns. Before the fix the task thread sat blocked waiting for a slot
for C, so A's wake-up waited in the mailbox until B's run ended, a whole run later.

Order, not time: each event takes the next number of one counter outside the Flink worker. The guarantee is
checked too: no output leaves before its run's records are acknowledged, so each output leaves at least the
proxy's delay after its run's call returned (the completion record is written after it).
"""

from __future__ import annotations

import time

import pytest

from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action
from flink_agents_replay.api.resources import Tool
from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.pipeline import connect_to_agent
from flink_agents_replay.local.kafka_broker import LocalKafkaBroker
from flink_agents_replay.local.processes import free_port
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.delay_proxy import DelayProxy

pytestmark = pytest.mark.integration

ACK_DELAY_S = 0.2
CALL_S = 1.0


def _stamp(events: InvocationCounter, what: str) -> None:
    """Record ``what`` with its place in the order of all events and its wall time (ms)."""
    events.increment(f"{what}@order", events.increment("events"))
    events.increment(f"{what}@ms", int(time.time() * 1000))


def _slow_agent(events: InvocationCounter) -> Agent:
    def call(key: str) -> str:
        _stamp(events, f"called:{key}")
        time.sleep(CALL_S)
        _stamp(events, f"returned:{key}")
        return f"answer for {key}"

    class OneSlowCall(Agent):
        @action(InputEvent)
        def answer(event, ctx):
            ctx.send_event(OutputEvent(output=ctx.call("model", ctx.key)))

    return OneSlowCall(name="one-slow-call", resources={"model": Tool(call, side_effects="none")})


@pytest.fixture(scope="module")
def delayed_broker(tmp_path_factory):
    """A broker whose every reply reaches the clients ``ACK_DELAY_S`` late (it advertises the proxy)."""
    proxy_port = free_port()
    broker = LocalKafkaBroker(tmp_path_factory.mktemp("broker"), port=free_port(), advertised_port=proxy_port)
    broker.start()
    try:
        with DelayProxy(upstream_port=broker.port, delay_s=ACK_DELAY_S, port=proxy_port) as proxy:
            yield f"127.0.0.1:{proxy_port}", proxy
    finally:
        broker.discard()


def _run(bootstrap: str, keys: str, slots: int, tmp_path) -> dict[str, int]:
    """Run ``keys`` (one input each, all at once) with ``slots`` run slots; the events recorded."""
    from pyflink.common import Types

    events = InvocationCounter(tmp_path / "events.db")
    env = create_environment(parallelism=1)
    keyed = env.from_collection(list(keys), type_info=Types.STRING()).key_by(lambda k: k, key_type=Types.STRING())
    config = {"kafka": {"bootstrap.servers": bootstrap}, "signing_key": "output-latency-signing-key-0123",
              "journal_topic": f"output-latency-{tmp_path.name[-8:]}", "max_concurrent_runs": slots,
              "durability": "per_run", "fallback_check_ms": 60_000}  # only wake-ups apply runs (or end holds)
    outputs = connect_to_agent(keyed, _slow_agent(events), config)

    def emitted(output):
        _stamp(events, f"emitted:{output.key}")
        return output.key

    outputs.map(emitted, output_type=Types.STRING())
    env.execute("output latency")
    return events.counts()


def test_runs_of_free_slots_start_together(delayed_broker, tmp_path):
    """Two slots, two keys: the second run starts while the first calls (a free slot never holds the input)."""
    bootstrap, _ = delayed_broker
    got = _run(bootstrap, "AB", 2, tmp_path)
    first, second = sorted("AB", key=lambda key: got[f"called:{key}@order"])
    assert got[f"called:{second}@order"] < got[f"returned:{first}@order"], got


def test_an_acknowledged_runs_output_leaves_while_the_next_run_is_still_calling(delayed_broker, tmp_path):
    bootstrap, proxy = delayed_broker
    got = _run(bootstrap, "ABC", 1, tmp_path)
    assert proxy.bytes_delayed > 0
    assert all(f"emitted:{key}@order" in got for key in "ABC"), got
    assert got["emitted:A@order"] < got["returned:B@order"], (
        "A's output waited for B's run to end: " + ", ".join(f"{name} {n}" for name, n in sorted(got.items())
                                                             if name.endswith("@order")))
    for key in "ABC":
        waited_ms = got[f"emitted:{key}@ms"] - got[f"returned:{key}@ms"]
        assert waited_ms >= ACK_DELAY_S * 1000 - 5, f"{key}'s output left {waited_ms} ms after its call returned"
