"""The Flink layer's parts of the agent operator (:mod:`flink_agents_replay.flink.operator`).

The operator itself holds keyed state and timers; what it calls lives here: :mod:`.runs` (the runs under way:
thread pool, run slots, closing), :mod:`.order` (order restoration after a restore, on keyed state and
timers), :mod:`.mode` (the job mode plug-in interface and production's mode), :mod:`.observer` (the observer
interface capture plugs into), :mod:`.parts` (building those parts from an ``AgentConfig``) and :mod:`.logs`
(logging set-up and the operator's log summaries)."""
