"""A run that can be applied wakes its key (checkpoint bridge -> task mailbox); no key polls for it (issue #14).

Each key's inputs run one after the other: its next input starts only once the run before it was applied. The
key's fallback check is set to ten minutes and the input is unbounded (no end-of-input drain), so a job whose
runs were not woken could not produce a key's second output within the test's timeout. Checked: every input
answered once, equal to a failure-free reference; the operator's closing line says the runs were applied by
wake-ups, none by a check or a drain. Each durability mode wakes at its own point (per_run: the last
acknowledgement, from the producer's thread; at_checkpoint: the run's end; journal off: the run's end).
"""

from __future__ import annotations

import re
from collections import Counter

import pytest

from flink_agents_replay.testing.agents import chain_agent
from flink_agents_replay.testing.jobs import make_inputs, produce_inputs, reference_outputs, run_agent_job

pytestmark = pytest.mark.integration

SIGNING_KEY = "completion-wakeups-signing-key-0123"
_APPLIED = re.compile(r"closing: .*runs applied: woken (\d+), checked (\d+), drained (\d+)")


@pytest.mark.parametrize("durability", ["per_run", "at_checkpoint", "per_action", "journal off"])
def test_every_run_is_applied_by_its_wake_up_not_by_polling(kafka_bootstrap, invocation_counter, operator_log,
                                                            durability):
    inputs = make_inputs(keys=4, per_key=5)
    topic = produce_inputs(kafka_bootstrap, inputs)
    agent = chain_agent(invocation_counter, name=f"wakeups-{durability.replace(' ', '-')}")
    config = {"kafka": {"bootstrap.servers": kafka_bootstrap}, "signing_key": SIGNING_KEY, "max_concurrent_runs": 2,
              "fallback_check_ms": 600_000}  # a key waiting for its check would wait ten minutes
    if durability == "journal off":
        config["journal_enabled"] = False
    else:
        config["durability"] = durability
    outputs = run_agent_job(kafka_bootstrap, topic, agent, config, until_outputs=len(inputs), timeout_s=90)

    assert Counter(outputs) == reference_outputs(agent, inputs)
    applied = [tuple(map(int, match.groups())) for line in operator_log(closing_of=agent.name)
               if (match := _APPLIED.search(line))]
    assert applied, "no closing line with the runs applied"
    woken, checked, drained = (sum(column) for column in zip(*applied, strict=True))
    assert (checked, drained) == (0, 0) and woken >= len(inputs), applied


def test_runs_whose_wake_ups_are_lost_are_applied_by_their_keys_checks(kafka_bootstrap, invocation_counter,
                                                                       operator_log):
    """Every other wake-up dropped, as a full pipe drops them: a run whose wake-up is lost is applied by its key's
    check, also one that started while the check registered for the key's previous run (applied by its wake-up)
    was still pending: the check is reused, not registered again."""

    def drop_every_other_wake_up() -> str:  # runs inside the job's interpreter, in the first action of every run
        from flink_agents_replay.flink.checkpoint_bridge import wakeups

        if getattr(wakeups.CompletionWakeups.wake, "drops", False):
            return "wake-ups dropped"
        delivered = wakeups.CompletionWakeups.wake

        def wake(self, token: int) -> None:
            if token % 2:
                delivered(self, token)
                return
            with self._lock:
                self._dropped.add(token)
                self.dropped += 1

        wake.drops = True
        wakeups.CompletionWakeups.wake = wake
        return "wake-ups dropped"

    inputs = make_inputs(keys=4, per_key=8)
    topic = produce_inputs(kafka_bootstrap, inputs)
    agent = chain_agent(invocation_counter, name="wakeups-lost", memory_value=drop_every_other_wake_up)
    config = {"kafka": {"bootstrap.servers": kafka_bootstrap}, "signing_key": SIGNING_KEY, "max_concurrent_runs": 2,
              "fallback_check_ms": 300}
    outputs = run_agent_job(kafka_bootstrap, topic, agent, config, until_outputs=len(inputs), timeout_s=90)

    assert Counter(outputs) == reference_outputs(agent, inputs)
    applied = [tuple(map(int, match.groups())) for line in operator_log(closing_of=agent.name)
               if (match := _APPLIED.search(line))]
    assert applied, "no closing line with the runs applied"
    woken, checked, drained = (sum(column) for column in zip(*applied, strict=True))
    # The fault hit: about half the runs were applied by checks (the runs submitted before the first action
    # dropped anything, up to two slots and two queued, kept their wake-ups).
    assert checked >= 8 and woken >= 8 and woken + checked + drained >= len(inputs), applied
