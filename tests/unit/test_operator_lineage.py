"""The job lineage a run's trace id derives from (``flink/operator.py``), on the real operator driven without Flink
(``tests/harness/operator_sim.py``): the same through every restart and restore of a job, and new for every fresh
start, also where each fresh start gets the same Flink job id (HA application mode without an explicit job id)."""

from __future__ import annotations

import cloudpickle

from flink_agents_replay import Agent, InputEvent, OutputEvent, action
from tests.harness.operator_sim import SimWorld

#: The job id Flink gives every start of an HA application without an explicit one.
FIXED_JOB_ID = "00000000000000000000000000000000"


class Echo(Agent):
    name = "echo"

    @action(InputEvent)
    def handle(event, ctx):
        ctx.send_event(OutputEvent(event.input))


def test_a_fresh_start_under_a_reused_job_id_is_a_new_lineage_and_restores_keep_theirs():
    with SimWorld(job_id=FIXED_JOB_ID) as world:
        # Tracing on (no run is sent: no exporter process starts): the spans' lineage must be the operator's.
        agent, config = Echo(), world.config(tracing={"endpoint": "http://127.0.0.1:9"})
        first = world.operator(agent, config)
        saved = first.checkpoint(1)
        first.crash()
        restarted = world.operator(agent, config)  # the same submission, restarted before its first checkpoint
        restarted.crash()
        world.resubmit()
        fresh = world.operator(agent, config)  # deployed again with nothing to restore: the same job id
        fresh.crash()
        restored = world.operator(agent, config, restore=saved)  # a new submission restoring the first's state
    assert FIXED_JOB_ID in first.op.lineage
    assert restarted.op.lineage == first.op.lineage
    assert fresh.op.lineage != first.op.lineage  # else its runs would get the first deployment's trace ids
    assert restored.op.lineage == first.op.lineage
    assert all(sim.op.tracer.lineage == sim.op.lineage for sim in (first, restarted, fresh, restored))


def test_the_submission_id_is_made_where_the_job_is_built_and_travels_with_the_operator():
    """Every subtask and restart unpickles the operator the job graph holds; building it again is a new submission."""
    from flink_agents_replay.flink.config import AgentConfig
    from flink_agents_replay.flink.operator import ActionExecutionOperator

    config = AgentConfig(kafka={"bootstrap.servers": "k:9092"}, signing_key="0123456789abcdef0123")
    built = ActionExecutionOperator(Echo(), config, "STRING")
    assert cloudpickle.loads(cloudpickle.dumps(built)).submission == built.submission
    assert ActionExecutionOperator(Echo(), config, "STRING").submission != built.submission
