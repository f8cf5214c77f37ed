"""Anthropic's Messages API as a ``Model``: a ``ModelRequest`` becomes one streamed
``messages.create`` call, and its server-sent events become parts. Each turn's content blocks
(thinking with signatures included) are kept as provider state and replayed verbatim."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from typing import Any, Literal, cast

import anthropic
import httpx2
from anthropic.types import (
    ContentBlock,
    ContentBlockParam,
    InputJSONDelta,
    MessageDeltaUsage,
    MessageParam,
    RawContentBlockDelta,
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawContentBlockStopEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    RawMessageStopEvent,
    RedactedThinkingBlock,
    SignatureDelta,
    TextBlock,
    TextDelta,
    ThinkingBlock,
    ThinkingConfigParam,
    ThinkingDelta,
    ToolParam,
    ToolResultBlockParam,
    ToolUseBlock,
)
from pydantic import BaseModel, ValidationError

from agentstream.errors import ProviderError, ProviderErrorKind
from agentstream.events import Usage
from agentstream.providers.base import (
    Message,
    ModelPart,
    ModelRequest,
    ProviderStatePart,
    ReasoningPart,
    SDKModel,
    StopReason,
    TextPart,
    ToolCallArgsPart,
    ToolCallEndPart,
    ToolCallStartPart,
    ToolSpec,
    TurnEndPart,
    UsagePart,
    system_prompt,
)

__all__ = ["AnthropicModel"]

STATE_KEY = "anthropic"
"""Where a turn's content blocks live in ``Message.provider_state``."""
DEFAULT_MAX_TOKENS = 8192
DEFAULT_THINKING_BUDGET = 2048

_EVENTS: dict[str, type[BaseModel]] = {
    "message_start": RawMessageStartEvent,
    "content_block_start": RawContentBlockStartEvent,
    "content_block_delta": RawContentBlockDeltaEvent,
    "content_block_stop": RawContentBlockStopEvent,
    "message_delta": RawMessageDeltaEvent,
    "message_stop": RawMessageStopEvent,
}
"""The events a turn is made of; others (``ping``, types added later) are skipped, as the API
documentation asks."""

_STOP_REASONS: dict[str, StopReason] = {
    "end_turn": "end_turn",
    "stop_sequence": "end_turn",
    "refusal": "end_turn",
    "tool_use": "tool_calls",
    "max_tokens": "max_tokens",
    "model_context_window_exceeded": "max_tokens",
}

_TOO_LONG = re.compile(r"prompt is too long|exceed context limit", re.IGNORECASE)

_SUMMARIES: dict[ProviderErrorKind, tuple[str, str]] = {
    "rate_limit": ("rate limit", "retry later or lower the request rate"),
    "auth": ("refused the API key", "check the key and its permissions"),
    "context_length": ("prompt too long", "shorten the conversation or lower max_tokens"),
    "overloaded": ("overloaded", "try again later"),
    "bad_request": ("rejected the request", "check the model id, the tools and model_settings"),
    "server": ("server error", "try again later"),
}
"""For an error the API reported: what happened, and what to do about it."""


class AnthropicModel(SDKModel[anthropic.AsyncAnthropic]):
    """A Claude model through the SDK's ``client``. ``api_model`` is Anthropic's model id."""

    provider = "anthropic"

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelPart, None]:
        max_tokens, thinking = self._limits(request)
        try:
            events = await self.client.messages.create(
                model=self.api_model,
                max_tokens=max_tokens,
                messages=_messages(request.messages),
                system=system_prompt(request.messages) or anthropic.omit,
                tools=[_tool(spec) for spec in request.tools] or anthropic.omit,
                thinking=thinking,
                stream=True,
            )
        except anthropic.APIError as exc:
            raise self._api_error(exc) from exc
        reader = _TurnReader(self.provider)
        async with events:
            try:
                async for sse in anthropic.AsyncStream.raw_events(events.response):
                    if sse.event == "error":
                        raise self._stream_error(sse.data, events.response.headers)
                    if kind := _EVENTS.get(sse.event or ""):
                        for part in reader.feed(self._parse(kind, sse.event, sse.data)):
                            yield part
            except httpx2.TimeoutException as exc:
                raise self._error(
                    "timeout",
                    "The Anthropic API stream stalled past the client's timeout; "
                    "try again later or raise the timeout",
                ) from exc
            except httpx2.TransportError as exc:
                raise self._error(
                    "bad_response",
                    f"The Anthropic API connection broke before the end of the stream ({exc})",
                ) from exc
            except UnicodeDecodeError as exc:
                raise self._error(
                    "bad_response", f"The Anthropic API stream is not UTF-8 text ({exc})"
                ) from exc
        for part in reader.end():
            yield part

    def _limits(self, request: ModelRequest) -> tuple[int, ThinkingConfigParam | anthropic.Omit]:
        """``max_tokens`` and the thinking configuration: extended thinking when reasoning is
        asked for, its budget counted within ``max_tokens``."""
        max_tokens: int = request.settings.get("max_tokens", DEFAULT_MAX_TOKENS)
        if not request.reasoning:
            return max_tokens, anthropic.omit
        budget: int = request.settings.get("thinking_budget", DEFAULT_THINKING_BUDGET)
        if max_tokens <= budget:
            raise self._error(
                "bad_request",
                f"model_settings max_tokens ({max_tokens}) must be larger than thinking_budget "
                f"({budget}) when reasoning is on: thinking counts within max_tokens",
            )
        return max_tokens, {"type": "enabled", "budget_tokens": budget}

    def _parse(self, kind: type[BaseModel], event: str | None, data: str) -> BaseModel:
        """The event, validated (the SDK's own stream builds events without validating)."""
        try:
            return kind.model_validate_json(data)
        except ValidationError as exc:
            raise self._error(
                "bad_response",
                f"Malformed {event} event from the Anthropic API: {_problems(exc)}",
            ) from exc

    def _api_error(self, exc: anthropic.APIError) -> ProviderError:
        if isinstance(exc, anthropic.APIStatusError):
            return self._status_error(
                exc.status_code, exc.body, exc.response.headers, fallback=exc.message
            )
        if isinstance(exc, anthropic.APITimeoutError):
            return self._error(
                "timeout",
                "The Anthropic API did not answer within the client's timeout; "
                "try again later or raise the timeout",
            )
        if isinstance(exc, anthropic.APIConnectionError):
            cause = exc.__cause__ or exc
            return self._error(
                "connection",
                f"Could not reach the Anthropic API at {self.client.base_url} ({cause}); "
                "check the network and the base URL",
            )
        return self._error("bad_response", f"Unusable answer from the Anthropic API: {exc}")

    def _stream_error(self, data: str, headers: Mapping[str, str]) -> ProviderError:
        """An ``error`` event: the API failed after the HTTP 200 (e.g. overloaded)."""
        try:
            body: object = json.loads(data)
        except ValueError:
            body = data
        return self._status_error(None, body, headers, fallback=data)

    def _status_error(
        self, status: int | None, body: object, headers: Mapping[str, str], *, fallback: str
    ) -> ProviderError:
        """An error the API reported, by HTTP status or (mid-stream) by its error type."""
        error = body.get("error") if isinstance(body, dict) else None
        error_type = error.get("type") if isinstance(error, dict) else None
        detail = error.get("message") if isinstance(error, dict) else None
        detail = detail if isinstance(detail, str) else fallback
        kind = _kind(status, error_type, detail)
        summary, hint = _SUMMARIES[kind]
        if kind == "rate_limit" and (retry_after := headers.get("retry-after")):
            hint = f"retry after {retry_after}s or lower the request rate"
        where = status if status is not None else "mid-stream"
        return self._error(
            kind,
            f"Anthropic API {summary} ({where}): {detail}; {hint}",
            status_code=status,
            body=body,
            headers=headers,
        )


def _kind(status: int | None, error_type: object, detail: str) -> ProviderErrorKind:
    if status == 429 or error_type == "rate_limit_error":
        return "rate_limit"
    if status in (401, 403) or error_type in ("authentication_error", "permission_error"):
        return "auth"
    if status == 529 or error_type == "overloaded_error":
        return "overloaded"
    if status == 400 or error_type == "invalid_request_error":
        return "context_length" if _TOO_LONG.search(detail) else "bad_request"
    if status is None or status >= 500:
        return "server"
    return "bad_request"


class _TurnReader:
    """Turns one message's events into parts, and keeps its content blocks for replay."""

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.blocks: dict[int, dict[str, Any]] = {}
        """Content blocks by index, as an assistant message sends them back."""
        self.pieces: dict[int, list[str]] = {}
        """What each block grows by: a text's or a thinking's text, a tool_use's input JSON.
        Joined when it is read (a tool_use's at its stop, texts at the message's end): a
        string grown a delta at a time is copied whole at every delta."""
        self.usage = Usage()
        self.stop_reason: str | None = None
        self.stopped = False

    def feed(self, event: BaseModel) -> Iterator[ModelPart]:
        match event:
            case RawMessageStartEvent(message=message):
                self.usage = Usage(
                    input_tokens=_input_tokens(message.usage),
                    output_tokens=message.usage.output_tokens,
                )
            case RawContentBlockStartEvent(index=index, content_block=block):
                yield from self._start(index, block)
            case RawContentBlockDeltaEvent(index=index, delta=delta):
                yield from self._delta(self._block(index), index, delta)
            case RawContentBlockStopEvent(index=index):
                yield from self._stop(self._block(index), index)
            case RawMessageDeltaEvent(delta=delta, usage=usage):
                self.stop_reason = delta.stop_reason
                self.usage = Usage(
                    input_tokens=_input_tokens(usage) or self.usage.input_tokens,
                    output_tokens=usage.output_tokens,
                )
            case RawMessageStopEvent():
                self.stopped = True

    def end(self) -> list[ModelPart]:
        """The closing parts, once the message has stopped."""
        if not self.stopped:
            raise self._bad("The Anthropic API stream ended before message_stop (cut short?)")
        stop = _STOP_REASONS.get(self.stop_reason or "")
        if stop is None:
            raise self._bad(f"Unexpected stop reason from the Anthropic API: {self.stop_reason}")
        for index, block in self.blocks.items():
            if block["type"] in ("text", "thinking"):
                block[block["type"]] = "".join(self.pieces[index])
        content = [
            block
            for _, block in sorted(self.blocks.items())
            if block != {"type": "text", "text": ""}  # the API refuses empty text blocks
        ]
        return [
            UsagePart(self.usage),
            ProviderStatePart({STATE_KEY: {"content": content}}),
            TurnEndPart(stop),
        ]

    def _start(self, index: int, block: ContentBlock) -> Iterator[ModelPart]:
        match block:
            case TextBlock(text=text):
                self.blocks[index] = {"type": "text", "text": text}
                self.pieces[index] = [text]
                if text:
                    yield TextPart(text)
            case ThinkingBlock(thinking=thinking, signature=signature):
                self.blocks[index] = {
                    "type": "thinking",
                    "thinking": thinking,
                    "signature": signature,
                }
                self.pieces[index] = [thinking]
                if thinking:
                    yield ReasoningPart(thinking)
            case RedactedThinkingBlock(data=data):
                self.blocks[index] = {"type": "redacted_thinking", "data": data}
            case ToolUseBlock(id=call_id, name=name):
                self.blocks[index] = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
                self.pieces[index] = []
                yield ToolCallStartPart(call_id, name)
            case _:
                raise self._bad(f"Unexpected {block.type} content block from the Anthropic API")

    def _delta(
        self, block: dict[str, Any], index: int, delta: RawContentBlockDelta
    ) -> Iterator[ModelPart]:
        match delta, block["type"]:
            case TextDelta(text=text), "text":
                self.pieces[index].append(text)
                if text:
                    yield TextPart(text)
            case ThinkingDelta(thinking=thinking), "thinking":
                self.pieces[index].append(thinking)
                if thinking:
                    yield ReasoningPart(thinking)
            case SignatureDelta(signature=signature), "thinking":
                block["signature"] = signature
            case InputJSONDelta(partial_json=piece), "tool_use":
                self.pieces[index].append(piece)
                if piece:
                    yield ToolCallArgsPart(block["id"], piece)
            case _:
                raise self._bad(f"Unexpected {delta.type} for a {block['type']} block")

    def _stop(self, block: dict[str, Any], index: int) -> Iterator[ModelPart]:
        if block["type"] != "tool_use":
            return
        raw = "".join(self.pieces[index]) or "{}"
        try:
            arguments = json.loads(raw)
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            raise self._bad(
                f"The Anthropic API sent invalid JSON arguments for tool {block['name']}: {raw!r}"
            )
        block["input"] = arguments
        yield ToolCallEndPart(block["id"])

    def _block(self, index: int) -> dict[str, Any]:
        try:
            return self.blocks[index]
        except KeyError:
            raise self._bad(f"Event for content block {index}, which never started") from None

    def _bad(self, message: str) -> ProviderError:
        return ProviderError(message, provider=self.provider, kind="bad_response")


def _problems(exc: ValidationError) -> str:
    """What is wrong, e.g. ``delta: Field required`` or ``Invalid JSON: EOF while parsing``."""
    return "; ".join(
        f"{'.'.join(map(str, e['loc']))}: {e['msg']}" if e["loc"] else e["msg"]
        for e in exc.errors()
    )


def _input_tokens(usage: anthropic.types.Usage | MessageDeltaUsage) -> int:
    """All the input the API counted: uncached, written to the cache, and read from it."""
    return (
        (usage.input_tokens or 0)
        + (usage.cache_creation_input_tokens or 0)
        + (usage.cache_read_input_tokens or 0)
    )


def _messages(history: Sequence[Message]) -> list[MessageParam]:
    """The conversation as alternating user/assistant messages: tool results are user content,
    so consecutive results (and any text after them) share one user message."""
    turns: list[tuple[Literal["user", "assistant"], list[ContentBlockParam]]] = []
    for message in history:
        role: Literal["user", "assistant"] = "assistant" if message.role == "assistant" else "user"
        match message.role:
            case "system":
                continue
            case "user":
                blocks: list[ContentBlockParam] = [{"type": "text", "text": message.content}]
            case "tool":
                blocks = [_tool_result(message)]
            case "assistant":
                blocks = _assistant_blocks(message)
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(blocks)
        elif blocks:
            turns.append((role, blocks))
    return [cast(MessageParam, {"role": role, "content": blocks}) for role, blocks in turns]


def _assistant_blocks(message: Message) -> list[ContentBlockParam]:
    """The turn's own blocks if we kept them (thinking signatures must come back unchanged),
    else rebuilt from its text and tool calls."""
    state = (message.provider_state or {}).get(STATE_KEY)
    if state is not None:
        return list(state["content"])
    blocks: list[ContentBlockParam] = []
    if message.content:
        blocks.append({"type": "text", "text": message.content})
    for call in message.tool_calls:
        blocks.append(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}
        )
    return blocks


def _tool_result(message: Message) -> ToolResultBlockParam:
    block: ToolResultBlockParam = {
        "type": "tool_result",
        "tool_use_id": message.tool_call_id or "",
        "content": message.content,
    }
    if _is_error(message.content):
        block["is_error"] = True
    return block


def _is_error(content: str) -> bool:
    """The agent loop reports a failed tool as a JSON object with an ``error`` key."""
    try:
        value = json.loads(content)
    except ValueError:
        return False
    return isinstance(value, dict) and "error" in value


def _tool(spec: ToolSpec) -> ToolParam:
    return {"name": spec.name, "description": spec.description, "input_schema": spec.parameters}
