"""The Vercel AI SDK's chat endpoints for an agent (``docs/ai-sdk.md``): what
``useChat`` with a ``DefaultChatTransport`` pointed at ``/api/agents/{id}/ui-messages``
calls, answered in the UI message stream (``views.ui_messages``).

The chat's id is the agent's session, so the server keeps the conversation and reads only
the new message. A stream only watches its run: a client that drops the connection (a
reload, a network change) reconnects to ``GET .../{chat_id}/stream`` and reads the message
again from its start, so leaving does not stop the run. Stopping is ``POST
.../{chat_id}/stop``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Depends, Path, Response
from pydantic import BaseModel, ConfigDict, Field

from agentstream.errors import Conflict, NotFound, UserError
from agentstream.events import Event
from agentstream.server.agents import agent_or_404
from agentstream.server.auth import require_api_key
from agentstream.server.openapi import CANCELS_RUN, STARTS_RUN, event_stream, refusals
from agentstream.server.routing import Router
from agentstream.server.runs import decide_all
from agentstream.server.services import Services, services
from agentstream.server.streams import DONE, STOP_WAIT, follow
from agentstream.store.store import RunRecord
from agentstream.views.continued import continued
from agentstream.views.ui_messages import HEADERS, UIMessageChunks

__all__ = ["router"]

router = Router(prefix="/api/agents", tags=["ai-sdk"])
Svc = Annotated[Services, Depends(services)]
Caller = Annotated[str, Depends(require_api_key)]
ChatId = Annotated[str, Path(min_length=1, max_length=40)]


class Approval(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str = Field(max_length=100)
    approved: bool
    reason: str | None = Field(default=None, max_length=2_000)


class Part(BaseModel):
    """A part of a UI message: text is read from the user's, decisions on approvals from
    the assistant's; other parts are what the client shows, and are left alone."""

    model_config = ConfigDict(extra="ignore")
    type: str = Field(max_length=200)
    text: str | None = None
    state: str | None = Field(default=None, max_length=100)
    approval: Approval | None = None


class UIMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str = Field(max_length=100)
    role: Literal["system", "user", "assistant"]
    parts: list[Part] = Field(max_length=10_000)


class ChatRequest(BaseModel):
    """What ``DefaultChatTransport`` sends (and what a ``body`` option adds, ignored)."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [
                {
                    "id": "chat-1",
                    "messages": [
                        {
                            "id": "m1",
                            "role": "user",
                            "parts": [{"type": "text", "text": "What is 17 * 23?"}],
                        }
                    ],
                    "trigger": "submit-message",
                }
            ]
        },
    )
    id: str = Field(min_length=1, max_length=40)
    """The chat's id: the agent's session."""
    messages: list[UIMessage] = Field(min_length=1, max_length=10_000)
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    messageId: str | None = Field(default=None, max_length=100)


_STREAM = event_stream(
    "The assistant's message as UI message stream chunks",
    "Server-Sent Events: each frame is one `data:` line holding one JSON chunk, then a blank "
    "line; `: keepalive` comment lines while the run is silent; the stream ends with "
    "`data: [DONE]`. Leaving does not stop the run (`POST .../{chat_id}/stop` does)",
    protocol="the Vercel AI SDK's UI message stream protocol (`x-vercel-ai-ui-message-stream: "
    "v1`; chunks `start`, `start-step`, `text-*`, `reasoning-*`, `tool-*`, `finish-step`, "
    "`finish`, `error`, `abort`)",
    ids=None,
)


@router.post(
    "/{agent_id}/ui-messages",
    response_class=Response,
    responses={
        **_STREAM,
        **refusals(
            {
                409: "The chat has an answer in progress, or the answer the decisions are for "
                "is not waiting for them (or waits for more)"
            },
            STARTS_RUN,
        ),
    },
)
async def send_messages(agent_id: str, body: ChatRequest, svc: Svc, caller: Caller) -> Response:
    """The answer to the chat's last message, or, when the last message is the assistant's
    with decisions on its approvals, the rest of that answer."""
    agent = await agent_or_404(svc, agent_id)
    if body.trigger == "regenerate-message":
        raise UserError(
            "Regenerating an answer is not supported: send a new message", field="trigger"
        )
    last = body.messages[-1]
    if last.role == "assistant":
        run_id, after = await _decide(svc, agent_id, body.id, last, caller)
    else:
        text = "".join(part.text or "" for part in last.parts if part.type == "text")
        if last.role != "user" or not text:
            raise UserError("The last message must be the user's, with text", field="messages")
        started = await svc.runs.start(agent, text, session_id=body.id, create_session=True)
        run_id, after = started.run_id, 0
    return await _stream(svc, run_id, after)


async def _decide(
    svc: Services, agent_id: str, chat_id: str, message: UIMessage, caller: str
) -> tuple[str, int]:
    """Record the decisions the assistant message carries and continue its run: the run,
    and the seq after which its message goes on."""
    run = await svc.store.get_run(message.id)
    if run is None or run.session_id != chat_id or run.agent_id != agent_id:
        raise NotFound(f"No answer {message.id!r} in chat {chat_id!r}", field="messages")
    decisions = [
        (p.approval.id, p.approval.approved, p.approval.reason)
        for p in message.parts
        if p.state == "approval-responded" and p.approval is not None
    ]
    if run.status != "awaiting_approval" or not decisions:
        raise Conflict(
            f"Answer {message.id!r} is not waiting for a decision (status: {run.status})",
            field="messages",
        )
    return run.id, await decide_all(svc, run.id, decisions, caller=caller, field="messages")


async def _stream(svc: Services, run_id: str, after: int) -> Response:
    """The run's message from its start, or, ``after`` a pause, what it goes on with."""
    view = UIMessageChunks(run_id)

    async def persisted() -> list[Event]:
        return await svc.store.run_events(run_id)

    return await follow(
        svc.supervisor,
        run_id,
        persisted,
        continued(view, after, view.opening),
        after=0,
        keepalive=svc.settings.keepalive_seconds,
        trailer=DONE,
        headers=HEADERS,
    )


async def _answering(svc: Services, agent_id: str, chat_id: str) -> RunRecord | None:
    """The chat's answer in progress, if one is."""
    runs = await svc.store.session_runs(chat_id)
    going = [r for r in runs if r.status == "running" and r.agent_id == agent_id]
    return going[-1] if going else None


@router.get(
    "/{agent_id}/ui-messages/{chat_id}/stream",
    responses={**_STREAM, 204: {"description": "No answer is in progress"}},
    dependencies=[Depends(require_api_key)],
)
async def reconnect(agent_id: str, chat_id: ChatId, svc: Svc) -> Any:
    """The answer in progress, from its start (``useChat({resume: true})``); 204 when
    there is none."""
    run = await _answering(svc, agent_id, chat_id)
    if run is None:
        return Response(status_code=204)
    return await _stream(svc, run.id, 0)


@router.post(
    "/{agent_id}/ui-messages/{chat_id}/stop",
    dependencies=[Depends(require_api_key)],
    responses=refusals({409: "The chat has no answer in progress"}, CANCELS_RUN),
)
async def stop(agent_id: str, chat_id: ChatId, svc: Svc) -> dict[str, str]:
    """Stop the answer in progress (the Stop button): it ends ``cancelled``, and its stream
    with an ``abort`` chunk."""
    run = await _answering(svc, agent_id, chat_id)
    if run is None or not await svc.supervisor.stop(run.id, "Stopped", wait=STOP_WAIT):
        raise Conflict(f"Chat {chat_id!r} has no answer in progress", field="chat_id")
    ended = await svc.store.get_run(run.id)
    assert ended is not None
    return {"run_id": run.id, "status": ended.status}
