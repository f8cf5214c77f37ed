"""The ``knowledge_search`` tool an agent gets for its knowledge bases.

Each call keeps what it retrieved as a context handler and says so mid-run with
``context_handler_created``, so a client can open the citation panel while the answer is
still streaming; the passages are numbered as the answer cites them.

A tool like any other: the server hands it to the run manager, so the runtime knows nothing
of knowledge bases.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import Field

from agentstream.events import ContextHandlerCreated
from agentstream.knowledge.service import Knowledge
from agentstream.runtime.context import current_tool_call
from agentstream.runtime.tools import Tool

__all__ = ["TOOL_NAME", "knowledge_search_tool"]

TOOL_NAME = "knowledge_search"


def knowledge_search_tool(knowledge: Knowledge, kb_ids: Sequence[str]) -> Tool:
    """The tool, searching these knowledge bases."""

    async def knowledge_search(
        query: Annotated[str, Field(min_length=1, max_length=2_000)],
        top_k: Annotated[int, Field(ge=1, le=20)] = 5,
    ) -> dict[str, Any]:
        """Search the knowledge base for passages about a question. Answer from them and cite
        each passage you use by its number in square brackets, like [1].

        Args:
            query: What to look for, in plain words.
            top_k: How many passages to return.
        """
        call = current_tool_call.get()
        citations = await knowledge.search(kb_ids, query, top_k=top_k)
        handler = await knowledge.store.create_handler(
            run_id=call.ctx.run_id, call_id=call.call_id, query=query, citations=citations
        )
        await call.ctx.emit(
            ContextHandlerCreated,
            step=call.step,
            call_id=call.call_id,
            context_handler_id=handler.id,
        )
        return {
            "context_handler_id": handler.id,
            "passages": [
                {"number": c.number, "document": c.document_name, "page": c.page, "text": c.text}
                for c in citations
            ],
        }

    return Tool(knowledge_search, name=TOOL_NAME)
