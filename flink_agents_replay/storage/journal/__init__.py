"""The journal: every action and call an agent runs, as Kafka records, partitioned by Flink key group.

The records themselves are in :mod:`flink_agents_replay.storage.records`. One module per concern here:
:mod:`.store` (the store interface) with :mod:`.kafka_store` (confluent-kafka) and :mod:`.memory_store` (unit
tests), :mod:`.writer` (durability modes), :mod:`.recovery` and :mod:`.index` (reading it back and the
divergence rule), :mod:`.history` (a key's recovered history and the reuse rules), :mod:`.markers` (recovery
markers and pruning), :mod:`.attempts` and :mod:`.fencing` (restarts before the first checkpoint, older
attempts), :mod:`.checkpoints` (a subtask's journal across Flink checkpoints, without Flink), :mod:`.transfer`
(moving a topic with its offsets) and :mod:`.inspect` (what a journal topic holds).
"""
