"""What a user would pick instead, streaming the same "Write N words" agent.

- Pydantic AI: an ``Agent`` on a ``FunctionModel``, served by its own Vercel AI adapter
  (``VercelAIAdapter.dispatch_request``), the UI protocol it ships.
- LangGraph: a one-node ``StateGraph`` calling a fake chat model, its tokens read with
  ``stream_mode="messages"``. The open-source package has no SSE server, so the tokens are
  encoded as the same minimal frames ours sends: LangGraph's cost plus the cheapest framing.

Both models stream natively async, one word per chunk, on the same schedule as ours
(``ticks``).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from typing import Any, cast

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

_WORDS = re.compile(r"write (\d+) words", re.IGNORECASE)


def word_count(prompt: str) -> int:
    match = _WORDS.search(prompt)
    return int(match.group(1)) if match else 0


async def ticks(count: int, delay: float) -> AsyncIterator[int]:
    """1 to ``count``, each due ``delay`` seconds after the one before on a fixed schedule,
    as a provider's tokens arrive on its clock: a busy loop delays a token without slowing
    the ones after it. Unpaced, a bare yield to the loop every 16."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    for index in range(1, count + 1):
        if delay:
            await asyncio.sleep(started + index * delay - loop.time())
        elif index % 16 == 0:
            await asyncio.sleep(0)
        yield index


async def words(count: int, delay: float) -> AsyncIterator[str]:
    async for index in ticks(count, delay):
        yield f" word{index}"


def pydantic_ai_app(delay: float) -> Starlette:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.ui.vercel_ai import VercelAIAdapter

    async def stream(messages: list[ModelMessage], _info: AgentInfo) -> AsyncIterator[str]:
        prompt = " ".join(str(getattr(part, "content", "")) for part in messages[-1].parts)
        async for word in words(word_count(prompt), delay):
            yield word

    agent = Agent(FunctionModel(stream_function=stream))

    async def chat(request: Request) -> Response:
        return await VercelAIAdapter.dispatch_request(request, agent=agent)

    return Starlette(routes=[Route("/api/chat", chat, methods=["POST"])])


def pydantic_ai_request(prompt: str) -> dict[str, Any]:
    """A Vercel AI ``submit-message`` request body."""
    return {
        "trigger": "submit-message",
        "id": "bench",
        "messages": [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": prompt}]}],
    }


def langgraph_app(delay: float) -> Starlette:
    from langchain_core.callbacks import AsyncCallbackManagerForLLMRun
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessageChunk, BaseMessage, HumanMessage
    from langchain_core.outputs import ChatGenerationChunk
    from langgraph.graph import START, MessagesState, StateGraph

    class WordsModel(GenericFakeChatModel):
        """The fake chat model with native async streaming, as real integrations have
        (the stock one streams in a worker thread, chunk by chunk)."""

        async def _astream(
            self,
            messages: list[BaseMessage],
            stop: list[str] | None = None,
            run_manager: AsyncCallbackManagerForLLMRun | None = None,
            **kwargs: Any,
        ) -> AsyncIterator[ChatGenerationChunk]:
            async for word in words(word_count(str(messages[-1].content)), delay):
                yield ChatGenerationChunk(message=AIMessageChunk(content=word))

    model = WordsModel(messages=iter(()))

    async def respond(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState).add_node(respond).add_edge(START, "respond").compile()

    async def stream(request: Request) -> StreamingResponse:
        prompt = (await request.json())["message"]

        async def frames() -> AsyncIterator[str]:
            messages = graph.astream({"messages": [HumanMessage(prompt)]}, stream_mode="messages")
            async for chunk, _meta in cast(AsyncIterator[tuple[AIMessageChunk, Any]], messages):
                data = {"event": "content_delta", "delta": chunk.content}
                yield f"data: {json.dumps(data, separators=(',', ':'))}\n\n"
            yield 'data: {"event":"complete"}\n\n'

        return StreamingResponse(frames(), media_type="text/event-stream")

    return Starlette(routes=[Route("/stream", stream, methods=["POST"])])
