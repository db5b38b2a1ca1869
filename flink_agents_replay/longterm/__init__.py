"""Long-term memory: memories that outlive Flink state, kept in a vector store, with an as-of view for replays.

Built so far (issue #15, in progress): :mod:`.store`, the few operations a vector store must offer
(upserts by id, metadata filters, nearest-neighbour queries) with an in-memory store for unit tests, and
:mod:`.versions`, which keeps every write as a version so the memory can be read as of a checkpoint and a
replay can write into an overlay of its own. The resource agents call (``ctx.call``, journaled like any
other call) and the Chroma adapter come next.
"""
