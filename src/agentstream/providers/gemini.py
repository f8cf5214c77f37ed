"""Google Gemini through its official SDK (google-genai): our request out, its stream as parts.

Gemini sends function calls whole, sometimes without ids, and signs its thinking: the model
turn's parts travel in the provider state so their thought signatures are replayed unchanged.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, cast

import httpx
import httpx2
import pydantic
from google import genai
from google.genai import errors, types

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

__all__ = ["STATE_KEY", "GeminiModel"]

STATE_KEY = "gemini"
"""Where this adapter keeps its state in ``Message.provider_state``: ``{"parts": [...]}``, the
model turn's parts as the API returned them (JSON-able), thought signatures included."""

_GENERATED_ID = "gemini-call-"
"""Prefix of the call ids made up for calls Gemini sent without one; never sent back."""

_CONTEXT_LENGTH = re.compile(
    r"token count|exceeds the maximum number of tokens|context (length|window)", re.IGNORECASE
)
# The SDK streams over httpx2 by default, or over httpx when given an httpx client.
_TIMEOUTS = (httpx.TimeoutException, httpx2.TimeoutException, TimeoutError)
_TRANSPORT = (httpx.TransportError, httpx2.TransportError)
_ERROR_ADVICE: dict[ProviderErrorKind, tuple[str, str]] = {
    "rate_limit": ("rate limit", "retry later or lower the request rate"),
    "auth": ("refused the credentials", "check the API key and its access to this model"),
    "context_length": ("context too long", "shorten the conversation or the input"),
    "overloaded": ("is overloaded", "try again later"),
    "server": ("server error", "try again later"),
    "bad_request": ("rejected the request", "fix the request or the agent's model_settings"),
}
_FINISH_HINTS = {
    types.FinishReason.SAFETY: "its safety filters blocked the answer; rephrase the request",
    types.FinishReason.RECITATION: "the answer would have recited copyrighted material",
    types.FinishReason.MALFORMED_FUNCTION_CALL: "the model produced an invalid function call",
}


class GeminiModel(SDKModel[genai.Client]):
    """A Gemini model streamed with ``client.aio.models.generate_content_stream``.

    ``request.settings``: ``max_tokens``, ``temperature``, ``thinking_budget`` (tokens; sent
    when reasoning is requested or the budget is set). A turn that stops for any reason but
    STOP or MAX_TOKENS (SAFETY, RECITATION, ...) raises ``ProviderError(kind="bad_response")``
    even if text was streamed, so a cut-off answer is never taken for a complete one.
    """

    provider = "gemini"

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelPart, None]:
        contents = self._contents(request.messages)
        config = self._config(request)
        turn = _Turn(self.provider, call_prefix=f"{_GENERATED_ID}{len(request.messages)}-")
        try:
            chunks = await self.client.aio.models.generate_content_stream(
                model=self.api_model, contents=contents, config=config
            )
            # Typed as an AsyncIterator, but it is an async generator: close it with us.
            stream = cast(AsyncGenerator[types.GenerateContentResponse, None], chunks)
            async with aclosing(stream):
                async for chunk in stream:
                    for part in turn.feed(chunk):
                        yield part
        except errors.APIError as exc:
            raise self._api_error(exc) from exc
        except _TIMEOUTS as exc:
            raise self._error(
                "timeout", f"{self.provider} timed out ({type(exc).__name__}); try again later"
            ) from exc
        except _TRANSPORT as exc:
            if turn.started:
                raise turn.bad_response(
                    f"The connection to {self.provider} broke mid-stream ({exc}); try again"
                ) from exc
            raise self._error(
                "connection",
                f"Could not reach {self.provider}: {exc}; check the network and the base URL",
            ) from exc
        except (errors.UnknownApiResponseError, pydantic.ValidationError) as exc:
            raise turn.bad_response(
                f"{self.provider} sent a chunk that is not a valid response ({exc}); try again"
            ) from exc
        for part in turn.finish():
            yield part

    def _config(self, request: ModelRequest) -> types.GenerateContentConfig:
        settings = request.settings
        budget = settings.get("thinking_budget")
        try:
            return types.GenerateContentConfig(
                system_instruction=system_prompt(request.messages) or None,
                tools=[types.Tool(function_declarations=[_declaration(t) for t in request.tools])]
                if request.tools
                else None,
                thinking_config=types.ThinkingConfig(
                    include_thoughts=request.reasoning, thinking_budget=budget
                )
                if request.reasoning or budget is not None
                else None,
                max_output_tokens=settings.get("max_tokens"),
                temperature=settings.get("temperature"),
                # We run the tools; the SDK must not try to.
                automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
            )
        except pydantic.ValidationError as exc:
            raise self._error(
                "bad_request",
                f"Invalid {self.provider} model settings: {exc}; fix the agent's model_settings",
            ) from exc

    def _contents(self, messages: Sequence[Message]) -> list[types.Content]:
        """The history as Gemini contents; adjacent turns of one role are merged (the results of
        one turn's calls go back together)."""
        contents: list[types.Content] = []
        names: dict[str, str] = {}
        for message in messages:
            names.update((call.id, call.name) for call in message.tool_calls)
            match message.role:
                case "system":
                    continue
                case "user":
                    role, parts = "user", _text_parts(message)
                case "assistant":
                    role, parts = "model", _model_parts(message)
                case "tool":
                    role, parts = "user", [self._function_response(message, names)]
            if contents and contents[-1].role == role:
                contents[-1] = types.Content(role=role, parts=[*(contents[-1].parts or []), *parts])
            elif parts:
                contents.append(types.Content(role=role, parts=parts))
        return contents

    def _function_response(self, message: Message, names: Mapping[str, str]) -> types.Part:
        """A tool result: a JSON object as is (errors come as ``{"error": ...}``), any other
        value as ``{"result": value}``."""
        call_id = message.tool_call_id or ""
        if call_id not in names:
            raise self._error(
                "bad_request", f"The tool result for call {call_id!r} answers no earlier call"
            )
        try:
            value: Any = json.loads(message.content)
        except ValueError:
            value = message.content
        response = value if isinstance(value, dict) else {"result": value}
        return types.Part(
            function_response=types.FunctionResponse(
                id=_wire_id(call_id), name=names[call_id], response=response
            )
        )

    def _api_error(self, exc: errors.APIError) -> ProviderError:
        """The SDK's error (an HTTP status, or an error event mid-stream) as a ProviderError."""
        code, status = exc.code, exc.status or ""
        kind = _error_kind(code, status, exc.message or "")
        what, advice = _ERROR_ADVICE[kind]
        if kind == "rate_limit" and (delay := _retry_delay(exc.details)):
            advice = f"retry in {delay} or lower the request rate"
        response = exc.response
        headers: Mapping[str, str] = (
            response.headers if isinstance(response, httpx.Response | httpx2.Response) else {}
        )
        message = (exc.message or str(exc)).rstrip(".")
        return self._error(
            kind,
            f"{self.provider} {what} ({code} {status}): {message}; {advice}",
            status_code=code,
            body=exc.details,
            headers=headers,
        )


@dataclass
class _Turn:
    """What one streamed turn has said so far, and its parts once it ends."""

    provider: str
    call_prefix: str
    started: bool = False
    calls: int = 0
    parts: list[types.Part] = field(default_factory=list)
    """The model content's parts, for the provider state."""
    final: types.Candidate | None = None
    """The candidate that brought the finish reason."""
    usage: types.GenerateContentResponseUsageMetadata | None = None

    def feed(self, chunk: types.GenerateContentResponse) -> Iterator[ModelPart]:
        self.started = True
        self.usage = chunk.usage_metadata or self.usage  # a running total: the last one counts
        if chunk.prompt_feedback and chunk.prompt_feedback.block_reason:
            raise ProviderError(
                f"{self.provider} blocked the prompt ({chunk.prompt_feedback.block_reason.value}); "
                "rephrase the request",
                provider=self.provider,
                kind="bad_request",
            )
        if not chunk.candidates:
            return
        candidate = chunk.candidates[0]
        if candidate.finish_reason:
            self.final = candidate
        for part in (candidate.content and candidate.content.parts) or []:
            self._keep(part)
            if part.function_call:
                yield from self._call(part.function_call)
            elif part.text:
                yield ReasoningPart(part.text) if part.thought else TextPart(part.text)

    def _call(self, call: types.FunctionCall) -> Iterator[ModelPart]:
        self.calls += 1
        call_id = call.id or f"{self.call_prefix}{self.calls}"
        yield ToolCallStartPart(call_id, call.name or "")
        yield ToolCallArgsPart(call_id, json.dumps(call.args or {}))
        yield ToolCallEndPart(call_id)

    def _keep(self, part: types.Part) -> None:
        """Keep the part for replay, joining unsigned text to the unsigned text before it (a
        signed part must stay as it came)."""
        last = self.parts[-1] if self.parts else None
        if last and _unsigned_text(last) and _unsigned_text(part) and last.thought == part.thought:
            self.parts[-1] = last.model_copy(update={"text": f"{last.text}{part.text}"})
        else:
            self.parts.append(part)

    def finish(self) -> Iterator[ModelPart]:
        """Usage, the parts to replay if anything was signed, and the stop reason."""
        stop = self._stop_reason()
        usage = self.usage or types.GenerateContentResponseUsageMetadata()
        yield UsagePart(
            Usage(
                input_tokens=(usage.prompt_token_count or 0)
                + (usage.tool_use_prompt_token_count or 0),
                output_tokens=(usage.candidates_token_count or 0)
                + (usage.thoughts_token_count or 0),
            )
        )
        if any(part.thought_signature for part in self.parts):
            parts = [part.to_json_dict() for part in self.parts]
            yield ProviderStatePart({STATE_KEY: {"parts": parts}})
        yield TurnEndPart(stop)

    def _stop_reason(self) -> StopReason:
        if self.final is None or self.final.finish_reason is None:
            raise self.bad_response(
                f"{self.provider} ended the stream before its last chunk (no finish reason); "
                "try again"
            )
        reason = self.final.finish_reason
        if reason == types.FinishReason.STOP:
            return "tool_calls" if self.calls else "end_turn"
        if reason == types.FinishReason.MAX_TOKENS:
            return "max_tokens"
        detail = _FINISH_HINTS.get(reason) or self.final.finish_message or "no reason given"
        raise self.bad_response(
            f"{self.provider} stopped the answer early ({reason.value}): {detail}"
        )

    def bad_response(self, message: str) -> ProviderError:
        return ProviderError(message, provider=self.provider, kind="bad_response")


def _declaration(tool: ToolSpec) -> types.FunctionDeclaration:
    return types.FunctionDeclaration(
        name=tool.name,
        description=tool.description,
        parameters_json_schema=tool.parameters or None,
    )


def _model_parts(message: Message) -> list[types.Part]:
    """The assistant turn as the API returned it if we kept it, else rebuilt from the message."""
    state = (message.provider_state or {}).get(STATE_KEY)
    if state:
        return [types.Part.model_validate(part) for part in state["parts"]]
    return _text_parts(message) + [
        types.Part(
            function_call=types.FunctionCall(
                id=_wire_id(call.id), name=call.name, args=call.arguments
            )
        )
        for call in message.tool_calls
    ]


def _text_parts(message: Message) -> list[types.Part]:
    return [types.Part(text=message.content)] if message.content else []


def _wire_id(call_id: str) -> str | None:
    """The id to send back: none for the ids we made up."""
    return None if call_id.startswith(_GENERATED_ID) else call_id


def _unsigned_text(part: types.Part) -> bool:
    return part.text is not None and not part.thought_signature


def _error_kind(code: int, status: str, message: str) -> ProviderErrorKind:
    if code == 429 or status == "RESOURCE_EXHAUSTED":
        return "rate_limit"
    if code in (401, 403) or status in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
        return "auth"
    if code == 400 and _CONTEXT_LENGTH.search(message):
        return "context_length"
    if code == 503 or status == "UNAVAILABLE":
        return "overloaded"
    return "server" if code >= 500 else "bad_request"


def _retry_delay(body: Any) -> str | None:
    """The ``retryDelay`` of a google.rpc.RetryInfo detail in the error body, if any."""
    error = body.get("error") if isinstance(body, dict) else None
    details = error.get("details") if isinstance(error, dict) else None
    for detail in details if isinstance(details, list) else []:
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith("RetryInfo"):
            delay = detail.get("retryDelay")
            return str(delay) if delay else None
    return None
