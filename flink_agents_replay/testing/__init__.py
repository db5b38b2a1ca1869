"""Test your own agent: run it on a Flink MiniCluster with a real Kafka broker, fail it over, read what it did.

In the spirit of ``temporalio.testing``: a small public surface here, the machinery in private modules::

    from flink_agents_replay.testing import AgentTestEnvironment, FailOver

    with AgentTestEnvironment.start_local() as env:          # a throwaway Kafka broker (or $KAFKA_BOOTSTRAP_SERVERS)
        agent = make_my_agent(counter=env.counter)           # let its tools count real calls in env.counter
        result = env.run(agent, inputs=tickets, key=lambda t: t["customer"], fail_over=FailOver(after_outputs=5))
        assert result.failure is None and result.failed_over
        assert result.duplicate_outputs() == []               # read_committed: what a downstream consumer sees
        assert all(n == 1 for n in result.call_counts.values())   # nothing ran twice across the fail-over

- :class:`AgentTestEnvironment`: ``start_local()`` / ``from_bootstrap(...)`` (context managers), ``run(...)``.
- :class:`FailOver`: fail the job over once (Flink restarts it in the MiniCluster, no process is killed).
- :class:`AgentRunResult`: the committed outputs (:class:`CommittedOutput`), the calls counted during the
  run, whether the fail-over fired, the job's failure as a value (``None``: it finished), and the runs left
  waiting at ``ctx.wait_for`` (:class:`OpenWait`: the environment sends no decisions).
- :class:`InvocationCounter`: named counters in a SQLite file, safe across threads, processes and restarts.
- :class:`CommittedReader`: read any topic as a ``read_committed`` consumer.

Building blocks the project's own tests use stay importable under their module names
(``flink_agents_replay.testing.jobs``, ``.agents``, ``.counter``, ``.kafka``, ``.committed``); they are
less stable than the names above. The suite's internal harnesses live in the repository's ``tests/harness/``.
"""

from flink_agents_replay.testing._environment import (
    AgentRunResult,
    AgentTestEnvironment,
    CommittedOutput,
    FailOver,
    InjectedFailover,
    OpenWait,
)
from flink_agents_replay.testing.committed import CommittedReader
from flink_agents_replay.testing.counter import InvocationCounter

__all__ = [
    "AgentRunResult",
    "AgentTestEnvironment",
    "CommittedOutput",
    "CommittedReader",
    "FailOver",
    "InjectedFailover",
    "InvocationCounter",
    "OpenWait",
]
