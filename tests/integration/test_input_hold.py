"""A fast source under slow calls: inputs waiting behind their keys' runs stay within max_waiting_inputs, and the
source is held back instead (issue #14). Without the hold, every input the source can read moves into the keys'
``pending`` state (checkpoints grow with the backlog; each key's list is rewritten whenever its next input
starts). Checked: every input answered once, equal to a failure-free reference; the operator's closing line says
the input was held, and the most inputs ever waiting equals the bound, not the backlog."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from flink_agents_replay.testing.agents import chain_agent
from flink_agents_replay.testing.jobs import make_inputs, produce_inputs, reference_outputs, run_agent_job

pytestmark = pytest.mark.integration

SIGNING_KEY = "input-hold-signing-key-0123456789"
_HOLD = re.compile(r"closing: .*inputs waiting at most (\d+), input held (\d+) times")
BOUND = 4


def test_a_backlog_waits_in_the_source_not_in_keyed_state(kafka_bootstrap, invocation_counter, operator_log):
    # All in the topic before the job starts, each key's inputs one after another: behind the first input of a
    # key, its next eleven can only wait.
    inputs = sorted(make_inputs(keys=6, per_key=12), key=lambda record: record["key"])
    topic = produce_inputs(kafka_bootstrap, inputs)
    agent = chain_agent(invocation_counter, name="input-hold", call_delay_s=0.02)
    config = {"kafka": {"bootstrap.servers": kafka_bootstrap}, "signing_key": SIGNING_KEY, "max_concurrent_runs": 2,
              "max_waiting_inputs": BOUND}
    outputs = run_agent_job(kafka_bootstrap, topic, agent, config, until_outputs=len(inputs), timeout_s=120)

    assert Counter(outputs) == reference_outputs(agent, inputs)
    closing = [tuple(map(int, match.groups())) for line in operator_log(closing_of=agent.name)
               if (match := _HOLD.search(line))]
    assert closing, "no closing line"
    most, holds = max(most for most, _ in closing), sum(holds for _, holds in closing)
    assert most == BOUND and holds > 0, closing
