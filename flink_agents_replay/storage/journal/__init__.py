"""The journal: every action and call an agent runs, as Kafka records, partitioned by Flink key group.

One module per concern: :mod:`.records` (what a record says and its key), :mod:`.codec` (the signed,
versioned envelope), :mod:`.store` (the store interface) with :mod:`.kafka_store` (confluent-kafka) and
:mod:`.memory_store` (unit tests), :mod:`.writer` (durability modes), :mod:`.recovery` and :mod:`.index`
(reading it back and the divergence rule), :mod:`.markers` (recovery markers and pruning),
:mod:`.checkpoints` (a subtask's journal across Flink checkpoints, without Flink).
"""
