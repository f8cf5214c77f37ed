"""Knowledge bases at work: documents in (extracted, chunked, embedded, stored) and passages
out (the chunks that best answer a query).

A search ranks the chunks by full text in the database (SQLite FTS5, PostgreSQL full-text
search). With the ``embeddings`` extra it also ranks them by vector, and the two rankings
are fused (reciprocal rank fusion): hybrid search, which finds a passage by its meaning
too. Vector search is exact: each base's vectors are held as one matrix, loaded from the
database and kept while the base's revision is unchanged, and scored with one matrix
product. That is milliseconds for tens of thousands of chunks (``make bench``) and needs no
vector extension in the database, so SQLite and PostgreSQL behave the same.

A chunk stored without the extra has no vector: the first search of its base with the
extra computes and stores the missing ones, so a base filled before the extra was
installed becomes hybrid by itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import anyio.to_thread
import numpy as np
import numpy.typing as npt

from agentstream.errors import NotFound, UserError
from agentstream.knowledge.chunking import chunk
from agentstream.knowledge.embedding import Embedder, Vectors
from agentstream.knowledge.extract import extract
from agentstream.knowledge.fusion import reciprocal_rank_fusion
from agentstream.store.knowledge import (
    Citation,
    KnowledgeBase,
    KnowledgeStore,
    NewChunk,
    StoredDocument,
)

__all__ = ["Knowledge"]

_STORED = np.dtype("<f4")
"""How a vector is kept in the database: little-endian float32, whatever the machine."""
CANDIDATES = 50
"""How many chunks each ranking hands to the fusion (at least the ``top_k`` asked for)."""


@dataclass(frozen=True, slots=True)
class _Index:
    revision: int
    chunk_ids: npt.NDArray[np.int64]
    vectors: Vectors


class Knowledge:
    """What the API and the ``knowledge_search`` tool do with knowledge bases.

    ``embedder`` names the model a base's vectors come from; with ``vectors`` False (the
    ``embeddings`` extra is missing) it is never run, and search is full text alone.
    """

    def __init__(self, store: KnowledgeStore, embedder: Embedder, *, vectors: bool) -> None:
        self.store = store
        self.embedder = embedder
        self.vectors = vectors
        self._indexes: dict[str, _Index] = {}

    async def create_base(
        self, name: str, description: str = "", *, kb_id: str | None = None
    ) -> KnowledgeBase:
        return await self.store.create_base(
            kb_id=kb_id,
            name=name,
            description=description,
            embedding_model=self.embedder.name,
            dimensions=self.embedder.dimensions,
        )

    async def base(self, kb_id: str) -> KnowledgeBase:
        base = await self.store.get_base(kb_id)
        if base is None:
            raise NotFound(f"No knowledge base {kb_id!r}", field="knowledge_base_id")
        return base

    async def check_bases(self, kb_ids: Sequence[str]) -> None:
        """Refuse an agent whose knowledge bases do not exist."""
        for kb_id in kb_ids:
            if await self.store.get_base(kb_id) is None:
                raise UserError(
                    f"No knowledge base {kb_id!r} (GET /api/knowledge-bases)",
                    field="knowledge_bases",
                )

    async def add_document(
        self, kb_id: str, *, name: str, media_type: str, data: bytes
    ) -> StoredDocument:
        """Extract, chunk, embed (with the extra) and store the document, all or nothing."""
        base = await self.base(kb_id)
        if self.vectors:
            self._check_model(base.id, base.embedding_model)
        sections = await anyio.to_thread.run_sync(extract, data, media_type)
        chunks = chunk(sections)
        texts = [c.text for c in chunks]
        vectors: Sequence[bytes | None] = (
            await self._stored(texts) if self.vectors else [None] * len(texts)
        )
        document = await self.store.add_document(
            kb_id,
            name=name,
            media_type=media_type,
            characters=sum(len(s.text) for s in sections),
            chunks=[
                NewChunk(
                    position=c.position,
                    start=c.start,
                    end=c.end,
                    page=c.page,
                    text=c.text,
                    embedding=vector,
                )
                for c, vector in zip(chunks, vectors, strict=True)
            ],
        )
        if document is None:
            raise NotFound(f"Knowledge base {kb_id!r} was deleted", field="knowledge_base_id")
        return document

    async def search(self, kb_ids: Sequence[str], query: str, *, top_k: int) -> list[Citation]:
        """The ``top_k`` passages that best answer the query over these bases, best first."""
        if not query.strip():
            raise UserError("The query is empty", field="query")
        revisions = {kb_id: await self._revision(kb_id) for kb_id in kb_ids}
        candidates = max(top_k, CANDIDATES)
        rankings = [await self.store.full_text(kb_ids, query, limit=candidates)]
        if self.vectors:
            rankings.append(await self._nearest(revisions, query, limit=candidates))
        top = reciprocal_rank_fusion(rankings)[:top_k]
        found = await self.store.passages([chunk_id for chunk_id, _ in top])
        citations: list[Citation] = []
        for chunk_id, score in top:
            if chunk_id not in found:  # its document was deleted meanwhile
                continue
            row, document_name = found[chunk_id]
            citations.append(
                Citation(
                    number=len(citations) + 1,
                    knowledge_base_id=row.knowledge_base_id,
                    document_id=row.document_id,
                    document_name=document_name,
                    chunk_id=chunk_id,
                    position=row.position,
                    page=row.page,
                    start=row.start,
                    end=row.end,
                    score=round(score, 6),
                    text=row.text,
                )
            )
        return citations

    async def _nearest(self, revisions: dict[str, int], query: str, *, limit: int) -> list[int]:
        """Ids of the ``limit`` chunks nearest the query by vector, best first."""
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

    async def _stored(self, texts: Sequence[str]) -> list[bytes]:
        """The texts' vectors, as the database keeps them."""
        if not texts:
            return []
        vectors = await self.embedder.embed(texts)
        return [vector.astype(_STORED).tobytes() for vector in vectors]

    async def _revision(self, kb_id: str) -> int:
        """The base's revision, once it is known to exist (and, for vectors, to match the
        embedder)."""
        found = await self.store.model_and_revision(kb_id)
        if found is None:
            self._indexes.pop(kb_id, None)
            raise NotFound(f"No knowledge base {kb_id!r}", field="knowledge_base_id")
        model, revision = found
        if self.vectors:
            self._check_model(kb_id, model)
        return revision

    async def _index(self, kb_id: str, revision: int) -> _Index:
        """The base's vectors, reloaded only when its revision moved on; the vectors of
        chunks stored without the extra are computed and stored first."""
        cached = self._indexes.get(kb_id)
        if cached is not None and cached.revision == revision:
            return cached
        loaded = await self.store.embeddings(kb_id)
        if loaded is None:
            self._indexes.pop(kb_id, None)
            raise NotFound(f"No knowledge base {kb_id!r}", field="knowledge_base_id")
        revision, chunk_ids, blobs = loaded
        stored = dict(zip(chunk_ids, blobs, strict=True))
        if None in blobs:
            missing = await self.store.texts([i for i, blob in stored.items() if blob is None])
            computed = dict(zip(missing, await self._stored([*missing.values()]), strict=True))
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

    def _check_model(self, kb_id: str, model: str) -> None:
        if model != self.embedder.name:
            raise UserError(
                f"Knowledge base {kb_id!r} was embedded with {model}, "
                f"but this server embeds with {self.embedder.name}",
                field="knowledge_base_id",
            )
