"""The Flink layer's parts of the agent operator (:mod:`flink_agents_replay.operator`).

The operator itself holds keyed state, timers, run slots and the thread pool; what it calls lives here:
:mod:`.order` (order restoration after a restore, on keyed state and timers), :mod:`.mode` (the job
mode plug-in interface and production's mode), :mod:`.observer` (the observer interface capture plugs
into), :mod:`.parts` (building those parts from an ``AgentConfig``) and :mod:`.logs` (logging set-up and
the operator's log summaries).
"""
