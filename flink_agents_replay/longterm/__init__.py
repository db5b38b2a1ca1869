"""Long-term memory: memories that outlive Flink state, in a vector store, with an as-of view for replays.

An agent declares a :class:`LongTermMemory` resource and calls it through ``ctx.call`` (``add``, ``search``,
``get_all``, ``get``, ``update``, ``delete``), so each operation is journaled like any call: a recovered run
reuses what its searches found, and a write made again after a crash or a failed action is the same memory.
Every write is a *version* stamped with its epoch (the checkpoint it belongs to), and a delete is a
tombstone: a replay from a savepoint reads production's memory as it was at that checkpoint and writes into
an overlay namespace of its own (docs/design.md §13).

The parts: :mod:`flink_agents_replay.integrations.vector_store` (what a vector store must offer, and an
in-memory one for tests), :mod:`flink_agents_replay.integrations.chroma` (a Chroma server over HTTP;
``flink-agents-replay local chroma start`` runs one), :mod:`.embeddings` (an OpenAI-compatible embeddings
endpoint), :mod:`.versions` (versions, the as-of view and the overlay) and :mod:`.resource` (the resource agents
call).
"""

from flink_agents_replay.integrations.chroma import ChromaVectorStore
from flink_agents_replay.integrations.vector_store import InMemoryVectorStore, VectorStore
from flink_agents_replay.longterm.embeddings import Embedder, OpenAIEmbeddings
from flink_agents_replay.longterm.resource import LongTermMemory, overlay_namespace

__all__ = ["ChromaVectorStore", "Embedder", "InMemoryVectorStore", "LongTermMemory", "OpenAIEmbeddings",
           "VectorStore", "overlay_namespace"]
