"""Knowledge bases at work: documents in (extracted, chunked, embedded, stored) and passages
out (the chunks that best answer a query).

A search ranks the chunks by full text in the database (SQLite FTS5, PostgreSQL full-text
search). With the ``embeddings`` extra it also ranks them by vector (``vectors``), and the
two rankings are fused by reciprocal rank fusion: hybrid search, which also finds a passage
by its meaning.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import anyio.to_thread

from agentstream.errors import NotFound, UserError
from agentstream.knowledge.chunking import chunk
from agentstream.knowledge.embedding import Embedder
from agentstream.knowledge.extract import extract
from agentstream.knowledge.fusion import reciprocal_rank_fusion
from agentstream.store.knowledge import (
    Citation,
    KnowledgeBase,
    KnowledgeStore,
    NewChunk,
    StoredDocument,
)

if TYPE_CHECKING:
    from agentstream.knowledge.vectors import VectorSearch

__all__ = ["Knowledge"]

CANDIDATES = 50
"""How many chunks each ranking hands to the fusion (at least the ``top_k`` asked for)."""


class Knowledge:
    """What the API and the ``knowledge_search`` tool do with knowledge bases.

    ``embedder`` names the model a base's vectors come from; with ``vectors`` False (the
    ``embeddings`` extra is missing) it is never run, and search is full text alone.
    """

    def __init__(self, store: KnowledgeStore, embedder: Embedder, *, vectors: bool) -> None:
        self.store = store
        self.embedder = embedder
        self._vectors: VectorSearch | None = None
        if vectors:
            from agentstream.knowledge.vectors import VectorSearch  # numpy: with the extra

            self._vectors = VectorSearch(store, embedder)

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
        if self._vectors is not None:
            self._check_model(base.id, base.embedding_model)
        sections = await anyio.to_thread.run_sync(extract, data, media_type)
        chunks = chunk(sections)
        texts = [c.text for c in chunks]
        vectors: Sequence[bytes | None] = (
            [None] * len(texts) if self._vectors is None else await self._vectors.vectors(texts)
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
        if self._vectors is not None:
            rankings.append(await self._vectors.nearest(revisions, query, limit=candidates))
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

    async def _revision(self, kb_id: str) -> int:
        """The base's revision, once it is known to exist (and, for vectors, to match the
        embedder)."""
        found = await self.store.model_and_revision(kb_id)
        if found is None:
            if self._vectors is not None:
                self._vectors.forget(kb_id)
            raise NotFound(f"No knowledge base {kb_id!r}", field="knowledge_base_id")
        model, revision = found
        if self._vectors is not None:
            self._check_model(kb_id, model)
        return revision

    def _check_model(self, kb_id: str, model: str) -> None:
        if model != self.embedder.name:
            raise UserError(
                f"Knowledge base {kb_id!r} was embedded with {model}, "
                f"but this server embeds with {self.embedder.name}",
                field="knowledge_base_id",
            )
