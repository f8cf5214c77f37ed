"""OpenAI-compatible endpoints: an agent is a model, for the official ``openai`` clients
and everything built on them (``docs/openai.md``).

- ``GET /v1/models`` lists the agents; ``POST /v1/chat/completions`` runs one on the
  conversation the client sends (a new session each time: this API is stateless), streamed
  or not.
- ``POST /v1/responses`` runs one as a *response*, whose id is the run's:
  ``previous_response_id`` continues that run's session, ``background`` lets it go on
  without the client, ``GET /v1/responses/{id}?stream=true&starting_after=N`` follows it
  from after event N, and ``POST /v1/responses/{id}/cancel`` stops it.

Authentication is the native API's (``Authorization: Bearer KEY``); errors have OpenAI's
shape (``server.errors``). The frames are ``views.openai``'s.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal

import anyio
from fastapi import Depends, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from agentstream.agents import StoredAgent
from agentstream.errors import Conflict, NotFound, UserError
from agentstream.events import Event, RunCompleted, RunFailed, RunPaused
from agentstream.providers.base import Message
from agentstream.runtime.supervisor import Supervisor
from agentstream.server.auth import require_api_key
from agentstream.server.openapi import CANCELS_RUN, STARTS_RUN, event_stream, refusals
from agentstream.server.routing import Router
from agentstream.server.runs import cancel
from agentstream.server.services import Services, services
from agentstream.server.streams import CLIENT_CANCELLED, DONE, follow, stream_started
from agentstream.server.validation import MessageText
from agentstream.store.store import RunRecord
from agentstream.views.frames import Frame, as_dict
from agentstream.views.openai import (
    NUMBERS_PER_EVENT,
    ChatCompletionChunks,
    ResponseEvents,
    awaiting_approval,
    chat_completion,
    chat_error,
)

__all__ = ["router"]

router = Router(prefix="/v1", tags=["openai"], dependencies=[Depends(require_api_key)])
Svc = Annotated[Services, Depends(services)]


FAILED_STATUS = {"error": 500, "interrupted": 503, "timeout": 504, "cancelled": 400}
"""The HTTP status of a non-streamed answer whose run failed, by how it ended."""

NO_RETRY = {"x-should-retry": "false"}
"""On the answer of a run that ran: the official clients retry a 409 or a 5xx by
themselves, which would run the agent (and its tools) again."""


class _Lenient(BaseModel):
    """What OpenAI's clients send: the fields this server uses are checked; the sampling
    parameters and other settings it leaves to the agent are accepted and ignored."""

    model_config = ConfigDict(extra="ignore")


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "input_text", "output_text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    """No ``tool``: the agent's tools run on the server, the client has no results to send."""
    content: MessageText | list[TextPart]

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def as_message(self) -> Message:
        role = "system" if self.role == "developer" else self.role
        return Message(role=role, content=self.text)


def _conversation(messages: Sequence[ChatMessage], field: str) -> tuple[list[Message], str]:
    """The turns before the last message, and the last message, which must be the user's."""
    if not messages or messages[-1].role != "user" or not messages[-1].text:
        raise UserError("The last message must be the user's, with text", field=field)
    return [m.as_message() for m in messages[:-1]], messages[-1].text


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class ChatCompletionRequest(_Lenient):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "model": "demo",
                    "messages": [{"role": "user", "content": "What is 17 * 23?"}],
                    "stream": True,
                }
            ]
        }
    )

    model: str = Field(min_length=1, max_length=200)
    """The agent's id."""
    messages: list[ChatMessage] = Field(min_length=1, max_length=1_000)
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: None = None
    """Refused: the agent's tools are its own and run on the server."""


class InputMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: MessageText | list[TextPart]


class ResponseRequest(_Lenient):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"model": "demo", "input": "What is 17 * 23?", "stream": True},
                {"model": "demo", "input": "What time is it?", "background": True},
            ]
        }
    )

    model: str = Field(min_length=1, max_length=200)
    """The agent's id."""
    input: MessageText | list[InputMessage] = Field(min_length=1)
    instructions: str | None = Field(default=None, max_length=200_000)
    """Added to the agent's own instructions, for this response only (as OpenAI's: a
    response that continues it with ``previous_response_id`` does not inherit them)."""
    previous_response_id: str | None = Field(default=None, max_length=40)
    stream: bool = False
    background: bool = False
    tools: None = None
    """Refused: the agent's tools are its own and run on the server."""

    def conversation(self) -> tuple[list[Message], str]:
        if isinstance(self.input, str):
            earlier: list[Message] = []
            text = self.input
        else:
            messages = [ChatMessage(role=m.role, content=m.content) for m in self.input]
            earlier, text = _conversation(messages, "input")
        if earlier and self.previous_response_id is not None:
            raise UserError(
                "With previous_response_id, send only the new user message: the "
                "conversation so far is the earlier response's",
                field="input",
            )
        return earlier, text


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "agentstream"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


def _model(agent: StoredAgent) -> Model:
    return Model(id=agent.spec.id, created=int(agent.created_at.timestamp()))


async def _agent(svc: Services, model: str) -> StoredAgent:
    agent = await svc.store.get_agent(model)
    if agent is None:
        raise NotFound(f"The model {model!r} does not exist: it is no agent's id", field="model")
    return agent


OPENAI_FRAMING = (
    "Server-Sent Events: each frame is one `data:` line holding one JSON object, then a "
    "blank line; `: keepalive` comment lines while the run is silent; a stream of chat "
    "completion chunks ends with `data: [DONE]`"
)


MODEL_NOT_FOUND = {404: "No agent has the id `model`"}


def _stream(what: str, protocol: str) -> dict[int | str, dict[str, Any]]:
    """Streamed or not: the 200 of an OpenAI-compatible operation."""
    return event_stream(
        what, OPENAI_FRAMING, protocol=protocol, ids=None, json={"schema": {"type": "object"}}
    )


@router.post(
    "/chat/completions",
    responses={
        **_stream(
            "A `chat.completion`, or, with `stream`, `chat.completion.chunk` frames",
            "OpenAI's Chat Completions API (streaming: `chat.completion.chunk`)",
        ),
        **refusals(
            STARTS_RUN,
            MODEL_NOT_FOUND,
            {
                400: "The body cannot be read (not JSON, or not UTF-8); or, not streamed, the "
                "run was cancelled (`cancelled`)",
                409: "Not streamed: the run waits for an approval (`approval_required`)",
                500: "Not streamed: the run failed (`error`)",
                504: "Not streamed: the run timed out (`timeout`)",
            },
            {503: STARTS_RUN[503] + "; or, not streamed, the run was interrupted"},
        ),
    },
)
async def chat_completions(body: ChatCompletionRequest, request: Request, svc: Svc) -> Response:
    """Run the agent on the conversation. Streamed, leaving cancels the run."""
    agent = await _agent(svc, body.model)
    earlier, message = _conversation(body.messages, "messages")
    run = await svc.runs.start(agent, message, earlier=earlier)
    created = int(time.time())
    completion_id = f"chatcmpl-{run.run_id.removeprefix('run_')}"
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        chunks = ChatCompletionChunks(completion_id, agent.spec.id, created, include_usage)
        return stream_started(
            svc.supervisor,
            run.run_id,
            chunks,
            keepalive=svc.settings.keepalive_seconds,
            trailer=DONE,
        )
    events = await _to_end(svc.supervisor, run.run_id, request)
    match events[-1]:
        case RunCompleted():
            return JSONResponse(
                chat_completion(
                    events, completion_id=completion_id, model=agent.spec.id, created=created
                )
            )
        case RunPaused(awaiting=awaiting):
            body_ = chat_error(awaiting_approval(run.run_id, awaiting), "approval_required")
            return JSONResponse(body_, status_code=409, headers=NO_RETRY)
        case RunFailed(status=status, message=message):
            status_code = FAILED_STATUS[status]
            return JSONResponse(chat_error(message, status), status_code, headers=NO_RETRY)
    raise AssertionError(f"run {run.run_id} ended with {events[-1]!r}")


@router.get("/models")
async def list_models(svc: Svc) -> ModelList:
    """The agents, as models: ``model`` in a request is an agent's id."""
    return ModelList(data=[_model(agent) for agent in await svc.store.list_agents()])


@router.get("/models/{model}")
async def get_model(model: str, svc: Svc) -> Model:
    return _model(await _agent(svc, model))


async def _to_end(runs: Supervisor, run_id: str, request: Request) -> list[Event]:
    """Every event of a run just started here, once it has ended (or paused); a client that
    leaves meanwhile cancels it."""
    subscription = runs.log.subscribe(run_id)
    events: list[Event] = []

    async def watch_disconnect() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        runs.cancel(run_id, CLIENT_CANCELLED)

    async with anyio.create_task_group() as group:
        group.start_soon(watch_disconnect)
        try:
            while batch := await subscription.next_batch():
                events += batch
        finally:
            subscription.close()
            group.cancel_scope.cancel()
    return events


@router.post(
    "/responses",
    responses={
        **_stream(
            "A `response`, or, with `stream`, its events",
            "OpenAI's Responses API (streaming events: `response.created` ... "
            "`response.completed`, each with `type` and `sequence_number`)",
        ),
        **refusals(
            MODEL_NOT_FOUND,
            {404: MODEL_NOT_FOUND[404] + ", or no response is `previous_response_id`"},
            {409: "The previous response's session has a run in progress or waiting"},
            STARTS_RUN,
        ),
    },
)
async def create_response(body: ResponseRequest, request: Request, svc: Svc) -> Response:
    """Run the agent as a response: streamed (leaving cancels it, unless ``background``),
    or answered once it has ended, or at once with ``background``."""
    agent = await _agent(svc, body.model)
    earlier, message = body.conversation()
    session_id = None
    if body.previous_response_id is not None:
        previous = await _response_run(svc, body.previous_response_id, "previous_response_id")
        if previous.agent_id != agent.spec.id:
            raise NotFound(
                f"No response {body.previous_response_id!r} of model {agent.spec.id!r}",
                field="previous_response_id",
            )
        session_id = previous.session_id
    run = await svc.runs.start(
        agent, message, session_id=session_id, earlier=earlier, instructions=body.instructions
    )
    view = ResponseEvents.begin(
        run.run_id,
        model=agent.spec.id,
        created_at=time.time(),
        background=body.background,
        previous_response_id=body.previous_response_id,
        instructions=body.instructions,
    )
    keepalive = svc.settings.keepalive_seconds
    if body.stream and body.background:  # the client may leave: only follow
        return await follow(
            svc.supervisor, run.run_id, _no_store, view, after=0, keepalive=keepalive
        )
    if body.stream:
        return stream_started(svc.supervisor, run.run_id, view, keepalive=keepalive)
    if body.background:
        return JSONResponse(view.response)
    return JSONResponse(_as_it_stands(view, await _to_end(svc.supervisor, run.run_id, request)))


async def _no_store() -> list[Event]:
    return []  # a response just started here is whole in the log


async def _response_run(svc: Services, response_id: str, field: str = "response_id") -> RunRecord:
    run = await svc.store.get_run(response_id)
    if run is None:
        raise NotFound(f"No response {response_id!r}", field=field)
    return run


@router.get(
    "/responses/{response_id}",
    responses={
        **_stream(
            "The `response` as it stands, or, with `stream`, its events",
            "OpenAI's Responses API (streaming events, each with `sequence_number`)",
        ),
        204: {"description": "Streamed: nothing after `starting_after`"},
    },
)
async def get_response(
    response_id: str,
    svc: Svc,
    stream: bool = False,
    starting_after: Annotated[int | None, Query(ge=-1)] = None,
) -> Any:
    """The response as it stands; with ``stream``, its events from after
    ``starting_after`` (all of them without it), live while it runs."""
    run = await _response_run(svc, response_id)
    view = _stored_view(run)

    async def persisted() -> list[Event]:
        return await svc.store.run_events(response_id)

    if not stream:
        return _as_it_stands(view, await persisted())
    after = -1 if starting_after is None else starting_after

    def shown(event: Event) -> Iterable[Frame]:
        frames = list(view(event))  # fed every event: the view keeps its state
        if (event.seq - 1) * NUMBERS_PER_EVENT > after:  # the number of its first frame
            return frames
        return [f for f in map(as_dict, frames) if f["sequence_number"] > after]

    return await follow(
        svc.supervisor,
        response_id,
        persisted,
        shown,
        after=0,
        keepalive=svc.settings.keepalive_seconds,
    )


def _stored_view(run: RunRecord) -> ResponseEvents:
    """The view of a response read back: what its run record keeps of it."""
    return ResponseEvents.begin(run.id, model=run.agent_id, created_at=run.created_at.timestamp())


def _as_it_stands(view: ResponseEvents, events: Iterable[Event]) -> dict[str, Any]:
    """The response object once ``view`` has seen ``events``."""
    for event in events:
        for _ in view(event):
            pass
    return view.response


@router.post(
    "/responses/{response_id}/cancel",
    responses=refusals({409: "The response has ended"}, CANCELS_RUN),
)
async def cancel_response(response_id: str, svc: Svc) -> Any:
    """Stop a response that is still going (a background one, say), and answer with it
    once it has ended ``cancelled``."""
    run = await _response_run(svc, response_id)
    if not await cancel(svc, run, "Response cancelled"):
        raise Conflict(
            f"Response {response_id!r} has ended (status: {run.status})",
            field="response_id",
            headers=NO_RETRY,
        )
    return _as_it_stands(_stored_view(run), await svc.store.run_events(response_id))
