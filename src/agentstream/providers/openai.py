"""OpenAI's two streaming APIs as models: Chat Completions, which every OpenAI-compatible
server also speaks, and Responses, for reasoning models whose reasoning items must be
replayed on the next turn. The caller builds the ``openai.AsyncOpenAI`` client.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncGenerator, AsyncIterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import openai
from openai import AsyncOpenAI, omit
from openai.types.chat import (
    ChatCompletionChunk,
    ChatCompletionMessageFunctionToolCallParam,
    ChatCompletionMessageParam,
    ChatCompletionToolParam,
)
from openai.types.chat.chat_completion_chunk import ChoiceDelta
from openai.types.responses import (
    FunctionToolParam,
    ResponseCompletedEvent,
    ResponseErrorEvent,
    ResponseFailedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionToolCall,
    ResponseIncompleteEvent,
    ResponseInputParam,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseReasoningItem,
    ResponseReasoningSummaryPartAddedEvent,
    ResponseReasoningSummaryTextDeltaEvent,
    ResponseReasoningTextDeltaEvent,
    ResponseRefusalDeltaEvent,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
)
from openai.types.shared_params import Reasoning

from agentstream.errors import ProviderError, ProviderErrorKind
from agentstream.events import Usage
from agentstream.providers.base import (
    Message,
    ModelPart,
    ModelRequest,
    ProviderStatePart,
    ReasoningPart,
    ReasoningSummaryPart,
    RequestedToolCall,
    SDKModel,
    StopReason,
    TextPart,
    ToolCallArgsPart,
    ToolCallEndPart,
    ToolCallStartPart,
    ToolSpec,
    TurnEndPart,
    UsagePart,
)

__all__ = ["OpenAIChatModel", "OpenAIResponsesModel"]

_TITLES: dict[ProviderErrorKind, str] = {
    "rate_limit": "rate limit",
    "auth": "authentication failed",
    "context_length": "context too long",
    "overloaded": "overloaded",
    "bad_request": "rejected the request",
    "server": "server error",
    "connection": "connection failed",
    "timeout": "timed out",
    "bad_response": "bad stream",
}
_ADVICE: dict[ProviderErrorKind, str] = {
    "rate_limit": "retry later or lower the request rate",
    "auth": "check the API key and its access to this model",
    "context_length": "shorten the conversation or use a model with a larger context",
    "overloaded": "try again later",
    "bad_request": "check the model id and the agent's model_settings",
    "server": "try again later",
    "connection": "check the base URL and the network",
    "timeout": "try again later or give the client a longer timeout",
    "bad_response": "try again",
}
_CODE_KINDS: dict[str, ProviderErrorKind] = {
    "context_length_exceeded": "context_length",
    "rate_limit_exceeded": "rate_limit",
    "server_error": "server",
    "invalid_prompt": "bad_request",
}
"""Error codes reported inside a stream that say what to do; numeric codes are HTTP statuses."""

_CHAT_STOPS: dict[str, StopReason] = {
    "stop": "end_turn",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "max_tokens",
}

_MALFORMED = (ValueError, TypeError, AttributeError, LookupError)
"""What reading a malformed event raises: the SDK builds events without validating them."""


class _OpenAIModel(SDKModel[AsyncOpenAI]):
    """What both adapters share: SDK errors as ProviderError."""

    provider = "OpenAI"

    def _explained(
        self,
        kind: ProviderErrorKind,
        detail: str,
        *,
        status: int | None = None,
        body: Any = None,
        headers: dict[str, str] | None = None,
        advice: str | None = None,
    ) -> ProviderError:
        """The error with what it is and what to do about it: "Groq rate limit (429): ..."."""
        where = f" ({status})" if status else ""
        return self._error(
            kind,
            f"{self.provider} {_TITLES[kind]}{where}: {detail}; {advice or _ADVICE[kind]}",
            status_code=status,
            body=body,
            headers=headers,
        )

    def _status_error(self, exc: openai.APIStatusError) -> ProviderError:
        body = exc.body
        detail = body.get("message") if isinstance(body, dict) else None
        detail = detail if isinstance(detail, str) and detail else exc.message
        if exc.code == "context_length_exceeded" or "maximum context length" in detail:
            kind: ProviderErrorKind = "context_length"
        else:
            kind = _status_kind(exc.status_code)
        headers = dict(exc.response.headers)
        retry_after = headers.get("retry-after")
        advice = f"retry after {retry_after}s" if kind == "rate_limit" and retry_after else None
        return self._explained(
            kind, detail, status=exc.status_code, body=body, headers=headers, advice=advice
        )

    def _stream_error(self, code: str | None, message: str, body: Any = None) -> ProviderError:
        """An error the server reported inside the stream."""
        if code and code.isdigit():
            kind = _status_kind(int(code))
        else:
            kind = _CODE_KINDS.get(code or "", "bad_response")
        return self._explained(kind, f"{message} (code {code})" if code else message, body=body)

    @contextmanager
    def _translated(self, *, streaming: bool) -> Iterator[None]:
        """SDK failures as ProviderError. Once streaming, a broken connection or an event
        that cannot be read means the stream itself is bad."""
        try:
            yield
        except openai.APIStatusError as exc:
            raise self._status_error(exc) from exc
        except openai.APITimeoutError as exc:
            raise self._explained("timeout", f"no answer from {exc.request.url} in time") from exc
        except openai.APIConnectionError as exc:
            reason = exc.__cause__ or exc.message
            if streaming:
                detail = f"the connection broke before the stream ended ({reason})"
                raise self._explained("bad_response", detail) from exc
            raise self._explained(
                "connection", f"could not reach {exc.request.url} ({reason})"
            ) from exc
        except openai.APIError as exc:
            raise self._stream_error(exc.code or exc.type, exc.message, exc.body) from exc
        except _MALFORMED as exc:
            if not streaming:
                raise
            detail = f"malformed event ({type(exc).__name__}: {exc})"
            raise self._explained("bad_response", detail) from exc

    def _checked_arguments(self, call: _Call) -> None:
        """Raise unless the call's arguments are JSON: a stream that ends without them whole
        was cut short or garbled."""
        try:
            json.loads("".join(call.arguments) or "{}")
        except ValueError as exc:
            detail = f"the arguments of tool call {call.name!r} are not JSON ({exc})"
            raise self._explained("bad_response", detail) from exc

    def _not_finished(self, final_event: str) -> ProviderError:
        return self._explained("bad_response", f"the stream ended before {final_event}")


class OpenAIChatModel(_OpenAIModel):
    """The Chat Completions API, streamed. Also serves OpenAI-compatible servers (Ollama,
    vLLM, LM Studio, OpenRouter, Groq...): give the client their base URL and ``provider``
    their name. Their non-standard ``reasoning_content`` / ``reasoning`` deltas are reasoning.
    """

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelPart, None]:
        settings = request.settings
        with self._translated(streaming=False):
            stream = await self.client.chat.completions.create(
                model=self.api_model,
                messages=[m for message in request.messages for m in _chat_message(message)],
                tools=[_chat_tool(spec) for spec in request.tools] or omit,
                stream=True,
                stream_options={"include_usage": True},
                max_tokens=settings.get("max_tokens", omit),
                temperature=settings.get("temperature", omit),
                top_p=settings.get("top_p", omit),
            )
        with self._translated(streaming=True):
            async with stream:
                async for part in self._parts(stream, reasoning=request.reasoning):
                    yield part

    async def _parts(
        self, chunks: AsyncIterable[ChatCompletionChunk], *, reasoning: bool
    ) -> AsyncGenerator[ModelPart, None]:
        calls: dict[int, _Call] = {}
        """By the ``index`` their deltas carry: parallel calls stream interleaved."""
        finish: str | None = None
        usage = Usage()
        async for chunk in chunks:
            if chunk.usage is not None:
                usage = Usage(
                    input_tokens=chunk.usage.prompt_tokens,
                    output_tokens=chunk.usage.completion_tokens,
                )
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            delta = choice.delta
            if reasoning and (thought := _reasoning_delta(delta)):
                yield ReasoningPart(thought)
            if text := delta.content or delta.refusal:
                yield TextPart(text)
            for piece in delta.tool_calls or ():
                function = piece.function
                if piece.index not in calls:
                    if function is None or not function.name:
                        raise self._explained("bad_response", "a tool call started without a name")
                    # Some compatible servers send no id: make one that no other turn reuses.
                    call = calls[piece.index] = _Call(
                        piece.id or f"call_{secrets.token_hex(8)}", function.name
                    )
                    yield ToolCallStartPart(call.id, call.name)
                if function is not None and function.arguments:
                    calls[piece.index].arguments.append(function.arguments)
                    yield ToolCallArgsPart(calls[piece.index].id, function.arguments)
            finish = choice.finish_reason or finish
        if finish is None:
            raise self._not_finished("a finish_reason")
        if finish not in _CHAT_STOPS:
            raise self._explained("bad_response", f"the model stopped for {finish!r}")
        for call in calls.values():
            self._checked_arguments(call)
            yield ToolCallEndPart(call.id)
        yield UsagePart(usage)
        yield TurnEndPart("tool_calls" if calls and finish != "length" else _CHAT_STOPS[finish])


class OpenAIResponsesModel(_OpenAIModel):
    """The Responses API, streamed, statelessly (``store=False``). Each turn's reasoning and
    function-call items travel as provider state and are replayed verbatim, reasoning with
    its encrypted content, so the model keeps its chain of thought across tool calls.
    """

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelPart, None]:
        settings = request.settings
        reasoning: Reasoning = {}
        if "reasoning_effort" in settings:
            reasoning["effort"] = settings["reasoning_effort"]
        if request.reasoning:
            reasoning = {"effort": settings.get("reasoning_effort", "medium"), "summary": "auto"}
        with self._translated(streaming=False):
            stream = await self.client.responses.create(
                model=self.api_model,
                input=self._input(request.messages),
                tools=[_responses_tool(spec) for spec in request.tools] or omit,
                reasoning=reasoning or omit,
                include=["reasoning.encrypted_content"],
                store=False,
                stream=True,
                max_output_tokens=settings.get("max_tokens", omit),
                temperature=settings.get("temperature", omit),
                top_p=settings.get("top_p", omit),
            )
        with self._translated(streaming=True):
            async with stream:
                async for part in self._parts(stream, reasoning=request.reasoning):
                    yield part

    def _input(self, messages: Sequence[Message]) -> ResponseInputParam:
        """The conversation as input items; assistant turns replay their stored output items."""
        items: list[dict[str, Any]] = []
        for message in messages:
            match message.role:
                case "system" if message.content:
                    items.append({"role": "system", "content": message.content})
                case "user":
                    items.append({"role": "user", "content": message.content})
                case "assistant":
                    state = (message.provider_state or {}).get(self.provider)
                    items += state["output"] if state else map(_function_call, message.tool_calls)
                    if message.content:
                        items.append({"role": "assistant", "content": message.content})
                case "tool":
                    items.append(
                        {
                            "type": "function_call_output",
                            "call_id": message.tool_call_id,
                            "output": message.content,
                        }
                    )
        return cast("ResponseInputParam", items)

    async def _parts(
        self, events: AsyncIterable[ResponseStreamEvent], *, reasoning: bool
    ) -> AsyncGenerator[ModelPart, None]:
        calls: dict[str, _Call] = {}
        """By output item id, which the argument events refer to."""
        output: list[dict[str, Any]] = []
        """The reasoning and function-call items to replay next turn, as the API sent them."""
        reasoned = False
        summary: list[str] = []
        final: ResponseCompletedEvent | ResponseIncompleteEvent | None = None
        async for event in events:
            match event:
                case ResponseTextDeltaEvent() | ResponseRefusalDeltaEvent():
                    yield TextPart(event.delta)
                case ResponseReasoningSummaryTextDeltaEvent() | ResponseReasoningTextDeltaEvent():
                    if reasoning:
                        reasoned = True
                        yield ReasoningPart(event.delta)
                        if isinstance(event, ResponseReasoningSummaryTextDeltaEvent):
                            summary.append(event.delta)
                case ResponseReasoningSummaryPartAddedEvent() if reasoned:
                    yield ReasoningPart("\n\n")
                    summary.append("\n\n")
                case ResponseOutputItemAddedEvent(item=ResponseFunctionToolCall() as item):
                    call = calls[item.id or item.call_id] = _Call(item.call_id, item.name)
                    yield ToolCallStartPart(call.id, call.name)
                case ResponseFunctionCallArgumentsDeltaEvent():
                    call = calls[event.item_id]
                    call.arguments.append(event.delta)
                    yield ToolCallArgsPart(call.id, event.delta)
                case ResponseFunctionCallArgumentsDoneEvent():
                    call = calls[event.item_id]
                    self._checked_arguments(call)
                    yield ToolCallEndPart(call.id)
                case ResponseOutputItemDoneEvent(
                    item=ResponseReasoningItem() | ResponseFunctionToolCall() as item
                ):
                    output.append(item.to_dict(mode="json"))
                case ResponseCompletedEvent() | ResponseIncompleteEvent():
                    final = event
                    break
                case ResponseFailedEvent():
                    error = event.response.error
                    message = error.message if error else "the response failed"
                    raise self._stream_error(error.code if error else None, message)
                case ResponseErrorEvent():
                    raise self._stream_error(event.code, event.message)
        if final is None:
            raise self._not_finished("response.completed")
        usage = final.response.usage
        yield UsagePart(
            Usage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens)
            if usage
            else Usage()
        )
        if summary:
            yield ReasoningSummaryPart("".join(summary))
        if output:
            yield ProviderStatePart({self.provider: {"output": output}})
        yield TurnEndPart(self._stop_reason(final, bool(calls)))

    def _stop_reason(
        self, final: ResponseCompletedEvent | ResponseIncompleteEvent, called: bool
    ) -> StopReason:
        if isinstance(final, ResponseCompletedEvent):
            return "tool_calls" if called else "end_turn"
        details = final.response.incomplete_details
        reason = details.reason if details else None
        if reason == "max_output_tokens":
            return "max_tokens"
        raise self._explained("bad_response", f"the response ended incomplete ({reason})")


@dataclass(slots=True)
class _Call:
    """A tool call being streamed."""

    id: str
    name: str
    arguments: list[str] = field(default_factory=list)


def _status_kind(status: int) -> ProviderErrorKind:
    if status in (401, 403):
        return "auth"
    if status == 429:
        return "rate_limit"
    if status in (503, 529):
        return "overloaded"
    if status == 408:
        return "timeout"
    return "server" if status >= 500 else "bad_request"


def _chat_message(message: Message) -> list[ChatCompletionMessageParam]:
    """The message as Chat Completions wants it; nothing for an empty system prompt."""
    match message.role:
        case "system" if message.content:
            return [{"role": "system", "content": message.content}]
        case "user":
            return [{"role": "user", "content": message.content}]
        case "assistant" if message.tool_calls:
            calls: list[ChatCompletionMessageFunctionToolCallParam] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
                }
                for call in message.tool_calls
            ]
            return [{"role": "assistant", "content": message.content or None, "tool_calls": calls}]
        case "assistant":
            return [{"role": "assistant", "content": message.content}]
        case "tool":
            return [
                {
                    "role": "tool",
                    "tool_call_id": message.tool_call_id or "",
                    "content": message.content,
                }
            ]
    return []


def _chat_tool(spec: ToolSpec) -> ChatCompletionToolParam:
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
        },
    }


def _responses_tool(spec: ToolSpec) -> FunctionToolParam:
    return {
        "type": "function",
        "name": spec.name,
        "description": spec.description,
        "parameters": spec.parameters,
        "strict": False,
    }


def _function_call(call: RequestedToolCall) -> dict[str, Any]:
    """A function_call input item rebuilt from a recorded call (no stored output items)."""
    return {
        "type": "function_call",
        "call_id": call.id,
        "name": call.name,
        "arguments": json.dumps(call.arguments),
    }


def _reasoning_delta(delta: ChoiceDelta) -> str | None:
    """The non-standard reasoning field some compatible servers add: ``reasoning_content``
    (DeepSeek, vLLM) or ``reasoning`` (OpenRouter, Ollama)."""
    extra = delta.model_extra or {}
    value = extra.get("reasoning_content") or extra.get("reasoning")
    return value if isinstance(value, str) else None
