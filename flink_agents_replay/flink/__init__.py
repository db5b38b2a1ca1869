"""The Flink layer: the agent operator and everything that knows Flink.

:mod:`.pipeline` (``connect_to_agent``) puts the operator (:mod:`.operator`) into a job. The operator holds keyed
state and timers; what it calls lives beside it: :mod:`.runs` (the runs under way: thread pool, run slots,
closing), :mod:`.input_hold` (backpressure), :mod:`.order` (order restoration after a restore),
:mod:`.mode` and :mod:`.observer` (the job-mode and observer plug-in interfaces; :mod:`.capture_observer` is
the capture's), :mod:`.epochs` (run epochs from checkpoint times), :mod:`.parts` (building those parts from an
``AgentConfig``), :mod:`.metrics` and :mod:`.logs`. Below them: :mod:`.config` (``AgentConfig`` and its checks),
:mod:`.env` (a thread-mode environment), :mod:`.runtime_info` (the subtask's index and job id) and
:mod:`.checkpoint_bridge` (the Java operator that gives the Python function checkpoint hooks and completion
wake-ups).
"""
