"""``LongTermMemory``: the resource an agent calls to remember across inputs, months and restarts.

An action uses it like any resource, through ``ctx.call`` (Mem0's verbs, without its fact extraction)::

    found = ctx.call("memory", "search", "late delivery", limit=3)["results"]
    added = ctx.call("memory", "add", "Customer prefers e-mail", metadata={"topic": "contact"})
    ctx.call("memory", "update", added["results"][0]["id"], "Customer prefers phone calls")
    ctx.call("memory", "delete", memory_id)
    everything = ctx.call("memory", "get_all")["results"]

Every result is plain data (dicts, lists, strings, numbers) and, being a call's result, journaled: after a
failover a run reuses what its searches found the first time, and a write that completed is not made again.
A write made again (it was in doubt, or its action failed and is retried) derives the same ids from the call
(:attr:`~flink_agents_replay.api.call_site.CallSite.stable_id`), so it replaces itself instead of adding a memory.

Scope: by default each key has its own memories (the key's digest); ``shared=True`` gives every key of the
agent one set. ``namespace`` names the store's collection (default ``<agent>/<resource name>``).

In a replay, calls are live by default (the resource declares ``idempotent`` side effects) and see memory
*as of the savepoint*; what the replay writes goes to its overlay namespace, ``<namespace>@replay:<name>``,
never into production's (docs/design.md §13).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flink_agents_replay.api.call_site import CallSite, current_call_site
from flink_agents_replay.api.resources import Resource, SideEffects
from flink_agents_replay.integrations.vector_store import VectorStore
from flink_agents_replay.longterm.embeddings import Embedder
from flink_agents_replay.longterm.versions import Position, VersionedMemory

__all__ = ["LongTermMemory", "overlay_namespace"]

_WRITES = frozenset({"add", "update", "delete"})  # the operations that change what a search or get finds

Scalar = str | int | float | bool


def overlay_namespace(namespace: str, replay: str) -> str:
    """The namespace a replay named ``replay`` writes instead of production's ``namespace``."""
    return f"{namespace}@replay:{replay}"


class LongTermMemory(Resource):
    """Memories kept in a vector store, versioned so replays can read them as of a savepoint.

    Args:
        store: the vector store (:class:`~flink_agents_replay.integrations.chroma.ChromaVectorStore` for a
            Chroma server; any :class:`~flink_agents_replay.integrations.vector_store.VectorStore`).
        embeddings: what turns texts into vectors
            (:class:`~flink_agents_replay.longterm.embeddings.OpenAIEmbeddings`).
        namespace: the store namespace of production's memories (default ``<agent>/<resource name>``).
        shared: one set of memories for every key (default: one per key).
        search_limit: how many memories ``search`` returns unless told (``limit=``).
    """

    def __init__(self, store: VectorStore, embeddings: Embedder, *, namespace: str | None = None,
                 shared: bool = False, search_limit: int = 5):
        super().__init__(side_effects=SideEffects.IDEMPOTENT)
        if search_limit <= 0:
            raise ValueError(f"search_limit must be positive, got {search_limit!r}")
        if namespace is not None and not namespace.strip():
            raise ValueError("namespace must not be empty")
        self.store = store
        self.embeddings = embeddings
        self.namespace = namespace
        self.shared = shared
        self.search_limit = search_limit
        self._operations: dict[str, Callable[..., Any]] = {
            "add": self._add, "search": self._search, "get_all": self._get_all, "get": self._get,
            "update": self._update, "delete": self._delete}

    def writes(self, args: tuple, kwargs: dict) -> bool:
        """``add``, ``update`` and ``delete`` write; searches and gets only read (and wait for nothing)."""
        return bool(args) and args[0] in _WRITES

    def close(self) -> None:
        """Close the store's client when it has one to close (:meth:`ChromaVectorStore.close`)."""
        close = getattr(self.store, "close", None)
        if callable(close):
            close()

    def invoke(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        site = current_call_site()
        if site is None:
            raise RuntimeError("LongTermMemory is called through ctx.call(name, operation, ...) inside an action")
        method = self._operations.get(operation)
        if method is None:
            raise ValueError(f"long-term memory has no operation {operation!r}; one of {sorted(self._operations)}")
        return method(_Call(self, site), *args, **kwargs)

    def production_namespace(self, agent: str, resource: str) -> str:
        """Production's namespace for this resource, named ``resource`` in agent ``agent``."""
        return self.namespace or f"{agent}/{resource}"

    # -- operations (each gets the call's view of the memory first)

    def _add(self, call: _Call, memory: str | Sequence[str] | Sequence[Mapping[str, Any]], *,
             metadata: Mapping[str, Scalar] | None = None) -> dict[str, Any]:
        texts = _texts(memory)
        vectors = self.embeddings.embed(texts)
        results = []
        for index, (text, vector) in enumerate(zip(texts, vectors, strict=True)):
            memory_id = call.view.add(call.scope, text, vector, call.position, metadata=metadata, index=index)
            results.append({"id": memory_id, "memory": text, "event": "ADD"})
        return {"results": results}

    def _search(self, call: _Call, query: str, *, limit: int | None = None,
                filters: Mapping[str, Scalar] | None = None) -> dict[str, Any]:
        if not isinstance(query, str):
            raise TypeError(f"search takes a text query, got {type(query).__name__}")
        vector = self.embeddings.embed([query])[0]
        found = call.view.search(call.scope, vector, limit or self.search_limit, filters=filters)
        return {"results": found}

    def _get_all(self, call: _Call, *, filters: Mapping[str, Scalar] | None = None) -> dict[str, Any]:
        return {"results": call.view.get_all(call.scope, filters=filters)}

    def _get(self, call: _Call, memory_id: str) -> dict[str, Any] | None:
        return next((item for item in call.view.get_all(call.scope) if item["id"] == memory_id), None)

    def _update(self, call: _Call, memory_id: str, memory: str, *,
                metadata: Mapping[str, Scalar] | None = None) -> dict[str, Any]:
        vector = self.embeddings.embed([_text(memory)])[0]
        call.view.update(call.scope, memory_id, memory, vector, call.position, metadata=metadata)
        return {"id": memory_id, "memory": memory, "event": "UPDATE"}

    def _delete(self, call: _Call, memory_id: str) -> dict[str, Any]:
        call.view.delete(call.scope, memory_id, call.position)
        return {"id": memory_id, "event": "DELETE"}

    def __repr__(self) -> str:
        return f"LongTermMemory(namespace={self.namespace!r}, shared={self.shared})"


class _Call:
    """One call's view of the memory: production now, or production as of the savepoint plus an overlay."""

    def __init__(self, resource: LongTermMemory, site: CallSite):
        namespace = resource.production_namespace(site.agent, site.resource)
        if site.fork is None:
            self.view = VersionedMemory(resource.store, namespace)
        else:
            self.view = VersionedMemory(resource.store, namespace, as_of=site.fork.as_of,
                                        overlay=overlay_namespace(namespace, site.fork.name))
        self.scope = "shared" if resource.shared else f"key:{site.key_digest}"
        event_time = site.event_time_ms if site.event_time_ms is not None else -1
        self.position = Position(site.epoch, site.key_digest, site.seq, event_time, site.call_id,
                                 stable_id=site.stable_id, step=site.step)


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"a memory is a non-empty text, got {value!r:.80}")
    return value


def _texts(memory: str | Sequence[str] | Sequence[Mapping[str, Any]]) -> list[str]:
    """The texts to remember: one text, several, or chat messages (each message's content)."""
    if isinstance(memory, str):
        return [_text(memory)]
    texts = [_text(item["content"] if isinstance(item, Mapping) else item) for item in memory]
    if not texts:
        raise ValueError("add needs at least one memory")
    return texts
