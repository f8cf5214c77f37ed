"""The Python SDK: run agents and read their event streams as typed frames, from sync code
(`Client`) or async code (`AsyncClient`). Both share request building, frame parsing
(the same SSE decoder as the server) and answer assembly (`RunAccumulator`).
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Generator, Iterator
from contextlib import aclosing, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote

import httpx
from pydantic import ValidationError

from agentstream.errors import APIConnectionError, APIStatusError, ClientError
from agentstream.sse import SSEDecoder
from agentstream.views import native
from agentstream.views.native import NativeFrame, NativeFrameAdapter, UsageJSON

__all__ = [
    "AsyncClient",
    "Client",
    "RunAccumulator",
    "RunResult",
    "RunToolCall",
    "default_api_key",
    "parse_frame",
]

DEFAULT_URL = "http://127.0.0.1:3000"
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=5.0)
"""Reads may wait up to 60 s: the server sends a keepalive comment every 30 s."""
_SSE = {"Accept": "text/event-stream"}


def default_api_key() -> str | None:
    """``$AGENTSTREAM_API_KEY``, else the key ``agentstream serve --demo`` wrote to
    ``demo-key`` in its data directory (``$AGENTSTREAM_DATA_DIR``, default ``.agentstream``
    in the current directory), else None."""
    if key := os.environ.get("AGENTSTREAM_API_KEY"):
        return key
    path = Path(os.environ.get("AGENTSTREAM_DATA_DIR") or ".agentstream") / "demo-key"
    return (path.read_text().strip() or None) if path.is_file() else None


def parse_frame(data: str | bytes | dict[str, Any]) -> NativeFrame | None:
    """One native frame from its JSON (or decoded JSON); None for an event this client does
    not know (a newer server's), so old clients keep working. Malformed data raises."""
    try:
        if isinstance(data, dict):
            return NativeFrameAdapter.validate_python(data)
        return NativeFrameAdapter.validate_json(data)
    except ValidationError as exc:
        if exc.errors()[0]["type"] == "union_tag_invalid":
            return None
        raise ClientError(f"Malformed frame from the server: {str(data)[:200]!r}") from exc


@dataclass(frozen=True, slots=True, kw_only=True)
class RunToolCall:
    id: str
    name: str
    step: int
    arguments: dict[str, Any]
    status: str | None = None
    """success, error or cancelled; None if the stream ended before the result."""
    result: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    run_id: str | None
    session_id: str | None
    """Pass it to the next run to continue the conversation."""
    status: str
    """completed; error, timeout, cancelled, interrupted (as the run's error frame says);
    or incomplete if the stream ended without either."""
    content: str
    reasoning: str
    tool_calls: list[RunToolCall]
    usage: UsageJSON | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.status == "completed"


class RunAccumulator:
    """Feed it a run's frames in order; ``result()`` is what they add up to."""

    def __init__(self) -> None:
        self.run_id: str | None = None
        self.session_id: str | None = None
        self._step = 0
        self._text: list[str] = []
        self._step_text_at = 0  # where the current step's text starts in _text
        self._final: str | None = None
        self._reasoning: list[str] = []
        self._calls: dict[str, RunToolCall] = {}
        self._usage: UsageJSON | None = None
        self._status = "incomplete"
        self._error: str | None = "The stream ended before the run finished"

    def feed(self, frame: NativeFrame) -> None:
        match frame:
            case native.StartFrame():
                self.run_id, self.session_id = frame.run_id, frame.session_id
            case native.StepStartedFrame():
                self._step, self._step_text_at = frame.step, len(self._text)
            case native.ContentDeltaFrame():
                self._text.append(frame.delta)
            case native.ChunkFrame():  # the step's assembled text: it replaces the step's deltas
                del self._text[self._step_text_at :]
                self._text.append(frame.content)
            case native.ReasoningFrame():
                self._reasoning.append(frame.text)
            case native.ToolCallFrame():
                self._calls[frame.tool_call_id] = RunToolCall(
                    id=frame.tool_call_id,
                    name=frame.tool_name,
                    step=self._step,
                    arguments=frame.arguments,
                )
            case native.ToolResultFrame():
                call = self._calls.get(frame.tool_call_id) or RunToolCall(
                    id=frame.tool_call_id, name=frame.tool_name, step=self._step, arguments={}
                )
                self._calls[call.id] = replace(call, status=frame.status, result=frame.result)
            case native.CompleteFrame():
                self._final, self._usage = frame.content, frame.usage
                self._status, self._error = "completed", None
            case native.ErrorFrame():
                self._status, self._error = frame.status, frame.message

    def result(self) -> RunResult:
        return RunResult(
            run_id=self.run_id,
            session_id=self.session_id,
            status=self._status,
            content=self._final if self._final is not None else "".join(self._text),
            reasoning="\n\n".join(self._reasoning),
            tool_calls=list(self._calls.values()),
            usage=self._usage,
            error=self._error,
        )


def _frames(decoder: SSEDecoder, chunk: bytes) -> Iterator[NativeFrame]:
    for event in decoder.feed(chunk):
        if (frame := parse_frame(event.data)) is not None:
            yield frame


def _status_error(response: httpx.Response) -> APIStatusError:
    """The error for a read, failed response: the message from its JSON error body."""
    try:
        body: Any = response.json()
        message = str(body["error"]["message"])
    except (ValueError, KeyError, TypeError):
        body = response.text
        message = body.strip()[:200] or response.reason_phrase
    return APIStatusError(response.status_code, message, body=body, headers=response.headers)


def _json(response: httpx.Response) -> Any:
    if response.is_error:
        raise _status_error(response)
    return None if response.status_code == 204 else response.json()


@contextmanager
def _connection_errors(url: httpx.URL) -> Iterator[None]:
    try:
        yield
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        base = f"{url.scheme}://{url.netloc.decode()}"
        raise APIConnectionError(
            f"Could not reach the agentstream server at {base} ({exc}). "
            "Is it running? Start one with `agentstream serve --demo`.",
            url=str(url),
        ) from exc
    except httpx.TransportError as exc:
        raise APIConnectionError(f"The connection to {url} failed: {exc!r}", url=str(url)) from exc


class _BaseClient:
    """Options and request building, the same for both clients."""

    _http: httpx.Client | httpx.AsyncClient

    @staticmethod
    def _options(base_url: str, api_key: str | None, timeout: Any) -> dict[str, Any]:
        key = api_key if api_key is not None else default_api_key()
        headers = {"User-Agent": "agentstream-python"} | ({"apikey": key} if key else {})
        return {"base_url": base_url, "headers": headers, "timeout": timeout}

    def _run_request(
        self, agent_id: str, message: str, session_id: str | None, reasoning: bool | None
    ) -> httpx.Request:
        body: dict[str, Any] = {"message": message}
        if session_id is not None:
            body["session_id"] = session_id
        if reasoning is not None:
            body["reasoning"] = reasoning
        url = f"/api/agents/{quote(agent_id, safe='')}/run/stream"
        return self._http.build_request("POST", url, json=body, headers=_SSE)

    def _resume_request(self, run_id: str, after: int) -> httpx.Request:
        url = f"/api/agents/runs/{quote(run_id, safe='')}/stream"
        return self._http.build_request("GET", url, params={"after": after}, headers=_SSE)

    def _run_info_request(self, run_id: str, action: str = "") -> httpx.Request:
        method = "POST" if action else "GET"
        return self._http.build_request(
            method, f"/api/agents/runs/{quote(run_id, safe='')}{action}"
        )


class Client(_BaseClient):
    """Sync client. ``api_key`` defaults to ``default_api_key()``; ``transport`` is httpx's."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout | None = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        opts = self._options(base_url, api_key, timeout)
        self._http: httpx.Client = httpx.Client(transport=transport, **opts)

    def iter_events(
        self,
        agent_id: str,
        message: str,
        *,
        session_id: str | None = None,
        reasoning: bool | None = None,
    ) -> Generator[NativeFrame, None, None]:
        """Run the agent and yield its frames live. Closing the iterator early (``break``)
        closes the stream, which cancels the run."""
        return self._stream(self._run_request(agent_id, message, session_id, reasoning))

    def iter_resume(self, run_id: str, after: int = 0) -> Generator[NativeFrame, None, None]:
        """Follow a run: its frames after the one whose ``seq`` is ``after`` (resume a
        broken stream with ``after=last_frame.seq``), live while it runs, then until it ends.
        Leaving does not cancel it."""
        return self._stream(self._resume_request(run_id, after))

    def run(
        self,
        agent_id: str,
        message: str,
        *,
        session_id: str | None = None,
        reasoning: bool | None = None,
    ) -> RunResult:
        """Run the agent to the end; a failed run is a result with ``ok`` False, not an error."""
        accumulator = RunAccumulator()
        for frame in self.iter_events(
            agent_id, message, session_id=session_id, reasoning=reasoning
        ):
            accumulator.feed(frame)
        return accumulator.result()

    def get_run(self, run_id: str) -> dict[str, Any]:
        """The assembled run with its persisted events."""
        result: dict[str, Any] = self._send(self._run_info_request(run_id))
        return result

    def cancel(self, run_id: str) -> None:
        """Cancel a run; returns once it has ended."""
        self._send(self._run_info_request(run_id, "/cancel"))

    def request(self, method: str, path: str, *, json: Any = None) -> Any:
        """Any other call of the API (e.g. ``/api/chat-deployments``): its decoded JSON."""
        return self._send(self._http.build_request(method, path, json=json))

    def _send(self, request: httpx.Request) -> Any:
        with _connection_errors(request.url):
            return _json(self._http.send(request))

    def _stream(self, request: httpx.Request) -> Generator[NativeFrame, None, None]:
        with _connection_errors(request.url):
            response = self._http.send(request, stream=True)
            try:
                if response.is_error:
                    response.read()
                    raise _status_error(response)
                decoder = SSEDecoder()
                for chunk in response.iter_bytes():
                    yield from _frames(decoder, chunk)
            finally:
                response.close()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncClient(_BaseClient):
    """Async client, the twin of `Client`. Wrap an ``aiter_*`` you leave early in
    ``contextlib.aclosing`` so the stream (and so the run) is closed right away."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout | None = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        opts = self._options(base_url, api_key, timeout)
        self._http: httpx.AsyncClient = httpx.AsyncClient(transport=transport, **opts)

    def aiter_events(
        self,
        agent_id: str,
        message: str,
        *,
        session_id: str | None = None,
        reasoning: bool | None = None,
    ) -> AsyncGenerator[NativeFrame, None]:
        return self._astream(self._run_request(agent_id, message, session_id, reasoning))

    def aiter_resume(self, run_id: str, after: int = 0) -> AsyncGenerator[NativeFrame, None]:
        return self._astream(self._resume_request(run_id, after))

    async def arun(
        self,
        agent_id: str,
        message: str,
        *,
        session_id: str | None = None,
        reasoning: bool | None = None,
    ) -> RunResult:
        accumulator = RunAccumulator()
        frames = self.aiter_events(agent_id, message, session_id=session_id, reasoning=reasoning)
        async with aclosing(frames):
            async for frame in frames:
                accumulator.feed(frame)
        return accumulator.result()

    async def aget_run(self, run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._asend(self._run_info_request(run_id))
        return result

    async def acancel(self, run_id: str) -> None:
        await self._asend(self._run_info_request(run_id, "/cancel"))

    async def arequest(self, method: str, path: str, *, json: Any = None) -> Any:
        return await self._asend(self._http.build_request(method, path, json=json))

    async def _asend(self, request: httpx.Request) -> Any:
        with _connection_errors(request.url):
            return _json(await self._http.send(request))

    async def _astream(self, request: httpx.Request) -> AsyncGenerator[NativeFrame, None]:
        with _connection_errors(request.url):
            response = await self._http.send(request, stream=True)
            try:
                if response.is_error:
                    await response.aread()
                    raise _status_error(response)
                decoder = SSEDecoder()
                async for chunk in response.aiter_bytes():
                    for frame in _frames(decoder, chunk):
                        yield frame
            finally:
                await response.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
