"""Knowledge bases (create, add documents, search) and the context handlers that knowledge
searches leave behind, for a citation panel."""

from __future__ import annotations

import re
from dataclasses import asdict
from datetime import datetime
from typing import Annotated

from fastapi import Depends, File, Form, Response, UploadFile
from pydantic import BaseModel, ConfigDict, Field

from agentstream.agents import AgentId
from agentstream.errors import NotFound
from agentstream.inputs import InputModel
from agentstream.knowledge.extract import media_type_for
from agentstream.server.auth import require_api_key
from agentstream.server.openapi import refusals
from agentstream.server.routing import Router
from agentstream.server.services import Services, services
from agentstream.store.knowledge import Citation, KnowledgeBase, StoredDocument

__all__ = ["DOCUMENT_UPLOADS", "router"]

router = Router(tags=["knowledge"], dependencies=[Depends(require_api_key)])
Svc = Annotated[Services, Depends(services)]

DOCUMENT_UPLOADS = re.compile(r"/api/knowledge-bases/[^/]+/documents")
"""Where larger bodies are accepted (``AGENTSTREAM_MAX_DOCUMENT_BYTES``)."""


class KnowledgeBaseCreate(InputModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"id": "handbook", "name": "Handbook", "description": "How we work, in full"}
            ]
        }
    )

    id: AgentId | None = None
    """Optional: a readable id to name it by in agent definitions; default ``kb_…``."""
    name: str = Field(min_length=1, max_length=200)
    description: str = Field(default="", max_length=10_000)


class KnowledgeBaseOut(BaseModel):
    id: str
    name: str
    description: str
    embedding_model: str
    dimensions: int
    documents: int
    chunks: int
    created_at: datetime


class KnowledgeBaseDetail(KnowledgeBaseOut):
    document_list: list[StoredDocument]


class SearchRequest(InputModel):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"query": "How many days of leave?", "top_k": 3}]}
    )

    query: str = Field(min_length=1, max_length=2_000)
    top_k: int = Field(default=5, ge=1, le=50)


class SearchResults(BaseModel):
    query: str
    results: list[Citation]


class ContextHandlerOut(BaseModel):
    id: str
    run_id: str
    tool_call_id: str
    query: str
    citations: list[Citation]
    created_at: datetime


@router.post(
    "/api/knowledge-bases",
    status_code=201,
    responses=refusals({409: "A knowledge base with this id exists"}),
)
async def create_knowledge_base(body: KnowledgeBaseCreate, svc: Svc) -> KnowledgeBaseOut:
    base = await svc.knowledge.create_base(body.name, body.description, kb_id=body.id)
    return _base(base)


@router.get("/api/knowledge-bases")
async def list_knowledge_bases(svc: Svc) -> list[KnowledgeBaseOut]:
    return [_base(base) for base in await svc.knowledge.store.list_bases()]


@router.get("/api/knowledge-bases/{kb_id}")
async def get_knowledge_base(kb_id: str, svc: Svc) -> KnowledgeBaseDetail:
    base = await svc.knowledge.base(kb_id)
    documents = await svc.knowledge.store.list_documents(kb_id)
    return KnowledgeBaseDetail(**_base(base).model_dump(), document_list=documents)


@router.delete("/api/knowledge-bases/{kb_id}", status_code=204)
async def delete_knowledge_base(kb_id: str, svc: Svc) -> Response:
    if not await svc.knowledge.store.delete_base(kb_id):
        raise NotFound(f"No knowledge base {kb_id!r}", field="knowledge_base_id")
    return Response(status_code=204)


@router.post("/api/knowledge-bases/{kb_id}/documents", status_code=201)
async def add_document(
    kb_id: str,
    svc: Svc,
    file: Annotated[
        UploadFile, File(description="A .txt, .md or .pdf file", examples=["leave.md"])
    ],
    name: Annotated[str | None, Form(max_length=300, examples=["Leave policy"])] = None,
) -> StoredDocument:
    """Upload a document (multipart ``file``): it is extracted, chunked and embedded, and is
    searchable once this returns."""
    filename = name or file.filename or "document"
    media_type = media_type_for(file.filename or filename, file.content_type)
    data = await file.read()
    document = await svc.knowledge.add_document(
        kb_id, name=filename, media_type=media_type, data=data
    )
    return document


@router.delete("/api/knowledge-bases/{kb_id}/documents/{document_id}", status_code=204)
async def delete_document(kb_id: str, document_id: str, svc: Svc) -> Response:
    if not await svc.knowledge.store.delete_document(kb_id, document_id):
        raise NotFound(f"No document {document_id!r} in {kb_id!r}", field="document_id")
    return Response(status_code=204)


@router.post("/api/knowledge-bases/{kb_id}/search")
async def search(kb_id: str, body: SearchRequest, svc: Svc) -> SearchResults:
    citations = await svc.knowledge.search([kb_id], body.query, top_k=body.top_k)
    return SearchResults(query=body.query, results=citations)


@router.get("/api/context-handlers/{handler_id}")
async def get_context_handler(handler_id: str, svc: Svc) -> ContextHandlerOut:
    """What a ``knowledge_search`` call retrieved (see ``context_handler_created``)."""
    handler = await svc.knowledge.store.get_handler(handler_id)
    if handler is None:
        raise NotFound(f"No context handler {handler_id!r}", field="context_handler_id")
    return ContextHandlerOut(**asdict(handler), tool_call_id=handler.call_id)


def _base(base: KnowledgeBase) -> KnowledgeBaseOut:
    return KnowledgeBaseOut(**asdict(base))
