"""Knowledge bases, their documents and chunks (ranked by full text in the database, see
``full_text``), and the context handlers (the citations) that knowledge searches leave
behind."""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    delete,
    func,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from agentstream.errors import Conflict
from agentstream.store.clock import now, utc
from agentstream.store.database import Database
from agentstream.store.full_text import full_text_ranking, query_words
from agentstream.store.tables import (
    ChunkRow,
    ContextHandlerRow,
    DocumentRow,
    KnowledgeBaseRow,
)

__all__ = [
    "Citation",
    "ContextHandler",
    "KnowledgeBase",
    "KnowledgeStore",
    "NewChunk",
    "StoredDocument",
]


@dataclass(frozen=True, slots=True)
class KnowledgeBase:
    id: str
    name: str
    description: str
    embedding_model: str
    dimensions: int
    revision: int
    documents: int
    chunks: int
    created_at: datetime


@dataclass(frozen=True, slots=True)
class StoredDocument:
    id: str
    knowledge_base_id: str
    name: str
    media_type: str
    characters: int
    chunk_count: int
    created_at: datetime


@dataclass(frozen=True, slots=True)
class NewChunk:
    position: int
    start: int
    end: int
    page: int | None
    text: str
    embedding: bytes | None
    """Its vector (little-endian float32), or None where the ``embeddings`` extra is missing."""


@dataclass(frozen=True, slots=True)
class Citation:
    """A retrieved passage, numbered as the answer cites it (``[1]`` is number 1)."""

    number: int
    knowledge_base_id: str
    document_id: str
    document_name: str
    chunk_id: int
    position: int
    """The chunk's place in its document, from 0."""
    page: int | None
    start: int
    end: int
    score: float
    """Its reciprocal rank fusion score: the sum of ``1 / (60 + rank)`` over the rankings
    that found it (full text, and vectors with the ``embeddings`` extra); higher is better."""
    text: str


@dataclass(frozen=True, slots=True)
class ContextHandler:
    id: str
    run_id: str
    call_id: str
    query: str
    citations: list[Citation]
    created_at: datetime


class KnowledgeStore:
    """Reads and writes of the knowledge tables, on the store's database."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def create_base(
        self,
        *,
        kb_id: str | None,
        name: str,
        description: str,
        embedding_model: str,
        dimensions: int,
    ) -> KnowledgeBase:
        row = KnowledgeBaseRow(
            id=kb_id or f"kb_{secrets.token_hex(16)}",
            name=name,
            description=description,
            embedding_model=embedding_model,
            dimensions=dimensions,
            revision=0,
            created_at=now(),
        )
        try:
            async with self._db.write() as db:
                db.add(row)
        except IntegrityError:
            raise Conflict(f"Knowledge base {row.id!r} exists", field="id") from None
        return _base(row, documents=0, chunks=0)

    async def get_base(self, kb_id: str) -> KnowledgeBase | None:
        bases = await self._bases(KnowledgeBaseRow.id == kb_id)
        return bases[0] if bases else None

    async def list_bases(self) -> list[KnowledgeBase]:
        return await self._bases()

    async def _bases(self, *where: Any) -> list[KnowledgeBase]:
        documents = (
            select(func.count(DocumentRow.id))
            .where(DocumentRow.knowledge_base_id == KnowledgeBaseRow.id)
            .scalar_subquery()
        )
        chunks = (
            select(func.coalesce(func.sum(DocumentRow.chunk_count), 0))
            .where(DocumentRow.knowledge_base_id == KnowledgeBaseRow.id)
            .scalar_subquery()
        )
        async with self._db.session() as db:
            rows = await db.execute(
                select(KnowledgeBaseRow, documents, chunks)
                .where(*where)
                .order_by(KnowledgeBaseRow.created_at)
            )
            return [_base(row, documents=d, chunks=c) for row, d, c in rows]

    async def delete_base(self, kb_id: str) -> bool:
        async with self._db.write() as db:
            result = await db.execute(delete(KnowledgeBaseRow).where(KnowledgeBaseRow.id == kb_id))
        return bool(result.rowcount)  # type: ignore[attr-defined]

    async def add_document(
        self,
        kb_id: str,
        *,
        name: str,
        media_type: str,
        characters: int,
        chunks: Sequence[NewChunk],
    ) -> StoredDocument | None:
        """The document with all its chunks, or nothing (None if the base is gone)."""
        row = DocumentRow(
            id=f"doc_{secrets.token_hex(16)}",
            knowledge_base_id=kb_id,
            name=name,
            media_type=media_type,
            characters=characters,
            chunk_count=len(chunks),
            created_at=now(),
        )
        async with self._db.write() as db:
            if not await _bump(db, kb_id):
                return None
            db.add(row)
            await db.flush()
            db.add_all(
                ChunkRow(knowledge_base_id=kb_id, document_id=row.id, **asdict(chunk))
                for chunk in chunks
            )
        return _document(row)

    async def list_documents(self, kb_id: str) -> list[StoredDocument]:
        async with self._db.session() as db:
            rows = await db.scalars(
                select(DocumentRow)
                .where(DocumentRow.knowledge_base_id == kb_id)
                .order_by(DocumentRow.created_at, DocumentRow.id)
            )
            return [_document(row) for row in rows]

    async def delete_document(self, kb_id: str, document_id: str) -> bool:
        async with self._db.write() as db:
            result = await db.execute(
                delete(DocumentRow).where(
                    DocumentRow.id == document_id, DocumentRow.knowledge_base_id == kb_id
                )
            )
            if not result.rowcount:  # type: ignore[attr-defined]
                return False
            await _bump(db, kb_id)
        return True

    async def model_and_revision(self, kb_id: str) -> tuple[str, int] | None:
        """The base's embedding model and revision: what a search checks, in one query."""
        async with self._db.session() as db:
            row = (
                await db.execute(
                    select(KnowledgeBaseRow.embedding_model, KnowledgeBaseRow.revision).where(
                        KnowledgeBaseRow.id == kb_id
                    )
                )
            ).first()
        return None if row is None else (row.embedding_model, row.revision)

    async def embeddings(self, kb_id: str) -> tuple[int, list[int], list[bytes | None]] | None:
        """The base's revision, and its chunks' ids and embeddings as of that revision (None
        for a chunk stored without one)."""
        async with self._db.session() as db, db.begin():
            revision = await db.scalar(
                select(KnowledgeBaseRow.revision).where(KnowledgeBaseRow.id == kb_id)
            )
            if revision is None:
                return None
            rows = (
                await db.execute(
                    select(ChunkRow.id, ChunkRow.embedding)
                    .where(ChunkRow.knowledge_base_id == kb_id)
                    .order_by(ChunkRow.id)
                )
            ).all()
        return revision, [row.id for row in rows], [row.embedding for row in rows]

    async def texts(self, chunk_ids: Sequence[int]) -> dict[int, str]:
        """The text of these chunks, by id (a deleted one is left out)."""
        async with self._db.session() as db:
            rows = await db.execute(
                select(ChunkRow.id, ChunkRow.text).where(ChunkRow.id.in_(chunk_ids))
            )
            return {row.id: row.text for row in rows}

    async def set_embeddings(self, embeddings: Mapping[int, bytes]) -> None:
        """Store vectors, by chunk id, for chunks stored without one. The chunks themselves
        are unchanged, so the base's revision is too (and another process computing the
        same vectors at the same time writes the same bytes)."""
        if not embeddings:
            return
        async with self._db.write() as db:
            await db.execute(
                update(ChunkRow), [{"id": i, "embedding": v} for i, v in embeddings.items()]
            )

    async def full_text(self, kb_ids: Sequence[str], query: str, *, limit: int) -> list[int]:
        """Ids of the chunks of these bases that share words with the query, best first."""
        words = query_words(query)
        if not words:
            return []
        async with self._db.session() as db:
            ranked = full_text_ranking(db.get_bind().dialect.name, words)
            rows = await db.scalars(
                ranked.where(ChunkRow.knowledge_base_id.in_(kb_ids)).limit(limit)
            )
            return list(rows)

    async def passages(self, chunk_ids: Sequence[int]) -> dict[int, tuple[ChunkRow, str]]:
        """Chunks by id, each with its document's name."""
        async with self._db.session() as db:
            rows = await db.execute(
                select(ChunkRow, DocumentRow.name)
                .join(DocumentRow, DocumentRow.id == ChunkRow.document_id)
                .where(ChunkRow.id.in_(chunk_ids))
            )
            return {chunk.id: (chunk, name) for chunk, name in rows}

    async def create_handler(
        self, *, run_id: str, call_id: str, query: str, citations: Sequence[Citation]
    ) -> ContextHandler:
        row = ContextHandlerRow(
            id=f"ctx_{secrets.token_hex(16)}",
            run_id=run_id,
            call_id=call_id,
            query=query,
            citations=[asdict(c) for c in citations],
            created_at=now(),
        )
        async with self._db.write() as db:
            db.add(row)
        return _handler(row)

    async def get_handler(self, handler_id: str) -> ContextHandler | None:
        async with self._db.session() as db:
            row = await db.get(ContextHandlerRow, handler_id)
            return None if row is None else _handler(row)


async def _bump(db: Any, kb_id: str) -> bool:
    """Mark the base changed (and lock it against a concurrent delete); False if it is gone."""
    result = await db.execute(
        update(KnowledgeBaseRow)
        .where(KnowledgeBaseRow.id == kb_id)
        .values(revision=KnowledgeBaseRow.revision + 1)
    )
    return bool(result.rowcount)


def _base(row: KnowledgeBaseRow, *, documents: int, chunks: int) -> KnowledgeBase:
    return KnowledgeBase(
        id=row.id,
        name=row.name,
        description=row.description,
        embedding_model=row.embedding_model,
        dimensions=row.dimensions,
        revision=row.revision,
        documents=documents,
        chunks=chunks,
        created_at=utc(row.created_at),
    )


def _document(row: DocumentRow) -> StoredDocument:
    return StoredDocument(
        id=row.id,
        knowledge_base_id=row.knowledge_base_id,
        name=row.name,
        media_type=row.media_type,
        characters=row.characters,
        chunk_count=row.chunk_count,
        created_at=utc(row.created_at),
    )


def _handler(row: ContextHandlerRow) -> ContextHandler:
    return ContextHandler(
        id=row.id,
        run_id=row.run_id,
        call_id=row.call_id,
        query=row.query,
        citations=[Citation(**c) for c in row.citations],
        created_at=utc(row.created_at),
    )
