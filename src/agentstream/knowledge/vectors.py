"""Exact vector search over knowledge chunks, with the ``embeddings`` extra (which brings
numpy and the model).

Each base's vectors are held as one matrix, loaded from the database and kept while the
base's revision is unchanged (also across processes), and scored with one matrix product.
That is milliseconds for tens of thousands of chunks (``make bench``) and needs no vector
extension in the database, so SQLite and PostgreSQL behave the same.

A chunk stored without the extra has no vector: loading its base computes and stores the
missing ones, so a base filled before the extra was installed becomes hybrid by itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from agentstream.errors import NotFound
from agentstream.knowledge.embedding import Embedder
from agentstream.store.knowledge import KnowledgeStore

__all__ = ["VectorSearch"]

_STORED = np.dtype("<f4")
"""How a vector is kept in the database: little-endian float32, whatever the machine."""


@dataclass(frozen=True, slots=True)
class _Index:
    revision: int
    chunk_ids: npt.NDArray[np.int64]
    vectors: npt.NDArray[np.float32]


class VectorSearch:
    """The chunks nearest a query, base by base, and the vectors of new chunks."""

    def __init__(self, store: KnowledgeStore, embedder: Embedder) -> None:
        self.store = store
        self.embedder = embedder
        self._indexes: dict[str, _Index] = {}

    async def vectors(self, texts: Sequence[str]) -> list[bytes]:
        """The texts' vectors, as the database keeps them."""
        if not texts:
            return []
        vectors = await self.embedder.embed(texts)
        return [vector.astype(_STORED).tobytes() for vector in vectors]

    async def nearest(self, revisions: Mapping[str, int], query: str, *, limit: int) -> list[int]:
        """Ids of the ``limit`` chunks of these bases (at these revisions) nearest the query,
        best first."""
        (vector,) = await self.embedder.embed([query])
        scored: list[tuple[float, int]] = []
        for kb_id, revision in revisions.items():
            index = await self._index(kb_id, revision)
            scores = index.vectors @ vector
            best = (
                np.argpartition(-scores, limit)[:limit]
                if len(scores) > limit
                else np.arange(len(scores))
            )
            scored += [(float(scores[i]), int(index.chunk_ids[i])) for i in best]
        scored.sort(reverse=True)
        return [chunk_id for _, chunk_id in scored[:limit]]

    def forget(self, kb_id: str) -> None:
        self._indexes.pop(kb_id, None)

    async def _index(self, kb_id: str, revision: int) -> _Index:
        """The base's vectors, reloaded only when its revision moved on; the vectors of
        chunks stored without the extra are computed and stored first."""
        cached = self._indexes.get(kb_id)
        if cached is not None and cached.revision == revision:
            return cached
        loaded = await self.store.embeddings(kb_id)
        if loaded is None:
            self.forget(kb_id)
            raise NotFound(f"No knowledge base {kb_id!r}", field="knowledge_base_id")
        revision, chunk_ids, blobs = loaded
        stored = dict(zip(chunk_ids, blobs, strict=True))
        if None in blobs:
            missing = await self.store.texts([i for i, blob in stored.items() if blob is None])
            computed = dict(zip(missing, await self.vectors([*missing.values()]), strict=True))
            await self.store.set_embeddings(computed)
            stored.update(computed)
        kept = {i: blob for i, blob in stored.items() if blob is not None}  # else deleted since
        vectors = np.frombuffer(b"".join(kept.values()), dtype=_STORED).astype(np.float32)
        index = self._indexes[kb_id] = _Index(
            revision,
            np.fromiter(kept, dtype=np.int64, count=len(kept)),
            vectors.reshape(len(kept), self.embedder.dimensions),
        )
        return index
