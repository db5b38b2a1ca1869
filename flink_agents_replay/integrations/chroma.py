"""A :class:`~flink_agents_replay.integrations.vector_store.VectorStore` on a Chroma server (``chromadb-client``, HTTP).

Each namespace is a collection with cosine distance. Collection names allow only ``[A-Za-z0-9._-]`` and
3-512 characters, so a namespace maps to its characters in that set plus a short hash of the whole name:
two namespaces never share a collection, whatever characters they use.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import tenacity

from flink_agents_replay.integrations.vector_store import Metadata, StoredDoc, Where

log = logging.getLogger(__name__)

__all__ = ["ChromaVectorStore", "collection_name"]


def collection_name(namespace: str) -> str:
    """The Chroma collection of ``namespace``: readable, valid, and distinct for distinct namespaces."""
    readable = re.sub(r"[^A-Za-z0-9._-]", "-", namespace).strip("._-")[:80] or "ns"
    digest = hashlib.sha256(namespace.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{readable}-{digest}"


def _not_found() -> type[Exception]:
    from chromadb.errors import NotFoundError

    return NotFoundError


def _where(where: Where) -> dict[str, Any] | None:
    clauses = [{name: {f"${op}": value}} for name, op, value in where.clauses]
    if not clauses:
        return None
    return clauses[0] if len(clauses) == 1 else {"$and": clauses}


class ChromaVectorStore:
    """Namespaces as collections of one Chroma server.

    Args:
        url: the server, e.g. ``http://127.0.0.1:8100`` (``flink-agents-replay local chroma start`` prints it).
        client: a ``chromadb`` client to use instead (tests, a server with authentication); the caller closes it.
        retry_s: how long an operation the server fails with ``InternalError`` is made again (see
            :meth:`_retrying`) before the error is raised to the call (and journaled as its outcome).
    """

    def __init__(self, url: str | None = None, *, client: Any = None, retry_s: float = 15.0):
        if client is None and not url:
            raise ValueError("ChromaVectorStore needs the server's url, e.g. http://127.0.0.1:8100")
        if not 0 <= retry_s < float("inf"):
            raise ValueError(f"retry_s must be a finite number of seconds >= 0, got {retry_s!r}")
        self.url = url
        self.retry_s = retry_s
        self._owns_client = client is None
        self._client = client
        self._collections: dict[str, Any] = {}

    @property
    def client(self) -> Any:
        """The ``chromadb`` client, made on first use in each process (the store travels pickled)."""
        if self._client is None:
            import chromadb  # imported here: the rest of the package does not need the client installed

            parts = urlsplit(self.url or "")
            self._client = chromadb.HttpClient(host=parts.hostname or "127.0.0.1", port=parts.port or 8000,
                                               ssl=parts.scheme == "https")
        return self._client

    def __getstate__(self) -> dict[str, Any]:
        if not self._owns_client:
            raise TypeError("a ChromaVectorStore made with client= stays in its process; give it url= instead")
        return {**self.__dict__, "_client": None, "_collections": {}}

    def close(self) -> None:
        """Release the client and its HTTP connections (a client passed in stays open)."""
        self._collections.clear()
        if self._owns_client and self._client is not None:
            # chromadb 1.5.9's close() stops its Systems but leaves the HTTP sessions of their server APIs open:
            # the client's and its internal admin client's (a System of its own). Their pooled sockets would stay
            # until the process ends (Python reports them as unclosed).
            owners = (self._client, getattr(self._client, "_admin_client", None))
            sessions = [getattr(getattr(owner, "_server", None), "_session", None) for owner in owners]
            self._client.close()
            for session in sessions:
                if session is not None:
                    session.close()
            self._client = None

    def __enter__(self) -> ChromaVectorStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _collection(self, namespace: str, *, create: bool) -> Any:
        found = self._collections.get(namespace)
        if found is None:
            name = collection_name(namespace)
            if create:
                found = self.client.get_or_create_collection(name, metadata={"hnsw:space": "cosine",
                                                                             "namespace": namespace[:500]})
            else:
                try:
                    found = self.client.get_collection(name)
                except _not_found():  # no such namespace (any other error, an unreachable server, is raised)
                    return None
            self._collections[namespace] = found
        return found

    def upsert(self, namespace: str, docs: Sequence[StoredDoc]) -> None:
        if docs:
            collection = self._collection(namespace, create=True)
            self._retrying(namespace, lambda: collection.upsert(
                ids=[d.id for d in docs], embeddings=[list(d.embedding) for d in docs],
                documents=[d.text for d in docs], metadatas=[dict(d.metadata) for d in docs]))

    def _retrying(self, namespace: str, operation: Callable[[], Any]) -> Any:
        """``operation()``, made again while the server answers ``InternalError`` for up to ``retry_s``:
        chromadb 1.5.9 sometimes cannot open a young collection's HNSW index for a few seconds ("Error
        creating hnsw segment reader: Nothing found on disk") although its documents are there."""
        from chromadb.errors import InternalError

        def report(state: tenacity.RetryCallState) -> None:
            log.warning("Chroma failed on %s (%s); trying again in %.2f s", namespace, state.outcome.exception(),
                        state.upcoming_sleep)

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(InternalError), reraise=True, before_sleep=report,
            wait=tenacity.wait_exponential(multiplier=0.05, max=1.0), stop=tenacity.stop_before_delay(self.retry_s))
        return retrying(operation)

    def update_metadata(self, namespace: str, doc_id: str, changes: Metadata) -> None:
        collection = self._collection(namespace, create=False)
        if collection is None:
            return
        if self._retrying(namespace, lambda: collection.get(ids=[doc_id], include=[]))["ids"]:
            self._retrying(namespace, lambda: collection.update(ids=[doc_id], metadatas=[dict(changes)]))

    def get(self, namespace: str, where: Where) -> list[StoredDoc]:
        collection = self._collection(namespace, create=False)
        if collection is None:
            return []
        got = self._retrying(namespace, lambda: collection.get(where=_where(where),
                                                               include=["documents", "metadatas", "embeddings"]))
        docs = [StoredDoc(i, text or "", tuple(float(x) for x in vector), meta or {})
                for i, text, vector, meta in zip(got["ids"], got["documents"], got["embeddings"], got["metadatas"],
                                                 strict=True)]
        return sorted(docs, key=lambda d: d.id)

    def query(self, namespace: str, embedding: Sequence[float], where: Where,
              limit: int) -> list[tuple[StoredDoc, float]]:
        collection = self._collection(namespace, create=False)
        if collection is None or limit <= 0:
            return []
        got = self._retrying(namespace, lambda: collection.query(
            query_embeddings=[list(embedding)], n_results=limit, where=_where(where),
            include=["documents", "metadatas", "embeddings", "distances"]))
        rows = zip(got["ids"][0], got["documents"][0], got["embeddings"][0], got["metadatas"][0],
                   got["distances"][0], strict=True)
        return [(StoredDoc(i, text or "", tuple(float(x) for x in vector), meta or {}), float(distance))
                for i, text, vector, meta, distance in rows]

    def delete(self, namespace: str, doc_ids: Sequence[str]) -> None:
        collection = self._collection(namespace, create=False)
        if collection is not None and doc_ids:
            self._retrying(namespace, lambda: collection.delete(ids=list(doc_ids)))

    def namespaces(self) -> list[str]:
        return sorted(c.metadata["namespace"] for c in self.client.list_collections()
                      if c.metadata and "namespace" in c.metadata)

    def drop(self, namespace: str) -> None:
        self._collections.pop(namespace, None)
        try:
            self.client.delete_collection(collection_name(namespace))
        except _not_found():  # nothing to drop
            return
