"""The packaged jobs, submitted from an installed wheel with Flink's own client.

* :mod:`flink_agents_replay.jobs.agent_job`: the main job (tickets -> triage agent -> replies, journaled);
  ``flink run -pym flink_agents_replay.jobs.agent_job ...``.
* :mod:`flink_agents_replay.jobs.replay_job`: a (changed) agent replayed from a production savepoint and its
  capture; ``flink run -s <savepoint> -pym flink_agents_replay.jobs.replay_job ...``.

Both take Flink's Kafka connector the way Flink users give it (:mod:`~flink_agents_replay.jobs.connector`)
and send input records they cannot take to a dead-letter topic instead of failing
(:mod:`~flink_agents_replay.jobs.kafka_input`). They run the example agent of
:mod:`flink_agents_replay.examples.support_triage` (the replay job any ``MODULE:FACTORY``), and import none
of the development tooling: an image with the wheel, a JRE and the connector runs them.
"""
