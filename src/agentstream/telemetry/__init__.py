"""What runs do, for the people who operate the server: log lines, metrics and traces.

The runtime reports here at a few points, none per token: a run's start and end
(``run``), each agent step (``step``), model call (``model_call``) and tool call
(``tool_call``). Each report becomes

- log lines (``telemetry.logs``): a run's start and end at INFO, and every line logged
  while a run executes carries its run id, session and agent;
- Prometheus metrics (``telemetry.metrics``);
- OpenTelemetry spans, only if tracing is on (``use_tracing``): a span per run, with a
  span per step under it, and the model and tool calls of a step under the step. Without
  tracing, OpenTelemetry is not imported and a span costs nothing.

Like the logging and metrics libraries it feeds, it is the process's.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from agentstream.errors import ProviderError
from agentstream.events import BaseEvent, RunCompleted, RunFailed, RunPaused, Usage
from agentstream.telemetry import logs, metrics

if TYPE_CHECKING:
    from agentstream.telemetry.tracing import Tracing

__all__ = [
    "ModelCall",
    "RunAbout",
    "RunObservation",
    "SpanLike",
    "model_call",
    "run",
    "step",
    "timed",
    "tool_call",
    "use_tracing",
]

logger = logging.getLogger("agentstream.runs")

TracingMode = Literal["off", "otlp", "console", "global"]


class SpanLike(Protocol):
    """What the runtime may do with a span: add what it learnt on the way."""

    def set_attribute(self, key: str, value: Any) -> object: ...


class _NoSpan:
    __slots__ = ()

    def set_attribute(self, key: str, value: Any) -> None:
        pass


_NO_SPAN = _NoSpan()
_UNTRACED: AbstractContextManager[SpanLike] = nullcontext(_NO_SPAN)
"""A span's block without tracing: nothing to enter or leave (reusable, reentrant)."""

_tracing: Tracing | None = None


def use_tracing(mode: TracingMode | Tracing | None) -> None:
    """Turn tracing on: ``otlp`` or ``console`` export through the SDK's (the ``otel``
    extra), ``global`` uses the program's global tracer provider, a ``Tracing`` its
    tracer; ``off`` or None turns it off."""
    global _tracing
    if mode is None or mode == "off":
        _tracing = None
        return
    if not isinstance(mode, str):
        _tracing = mode
        return
    try:
        from agentstream.telemetry import tracing as otel
    except ImportError as exc:
        raise ImportError(
            f"Tracing needs the otel extra: pip install 'agentstream[otel]' ({exc})"
        ) from None
    _tracing = otel.from_global() if mode == "global" else otel.exporting(mode)


def _span(
    name: str, attributes: dict[str, Any], expected: tuple[type[BaseException], ...] = ()
) -> AbstractContextManager[SpanLike]:
    if _tracing is None:
        return _UNTRACED
    return _tracing.span(name, {k: v for k, v in attributes.items() if v is not None}, expected)


@dataclass(frozen=True, slots=True)
class RunAbout:
    """What a run is, for its log lines, metrics and span."""

    kind: Literal["agent", "workflow"]
    agent: str | None = None
    session_id: str | None = None
    workflow: str | None = None


class RunObservation:
    """The block of a run's task (``run``), told how the run ended (``ended``) before it
    closes. A class, not a generator: the block lasts as long as the run, and a generator's
    frame and wrapper kept about 1.3 KB alive for each live run. Entered once."""

    __slots__ = ("_about", "_block", "_fields", "_span", "_started", "run_id", "status")

    def __init__(self, run_id: str, about: RunAbout) -> None:
        self.run_id = run_id
        self._about = about
        self.status = "unknown"

    def __enter__(self) -> RunObservation:
        about = self._about
        self._block = _span(
            "agentstream.run",
            {
                "agentstream.run_id": self.run_id,
                "agentstream.kind": about.kind,
                "agentstream.session_id": about.session_id,
                "gen_ai.agent.name": about.agent,
                "agentstream.workflow_id": about.workflow,
            },
        )
        self._span = self._block.__enter__()
        self._fields = logs.AboutRun(self.run_id, about.session_id, about.agent or about.workflow)
        self._fields.__enter__()
        try:
            self._started = time.perf_counter()
            metrics.RUNS_STARTED.labels(about.kind).inc()
            logger.info("Run started", extra={"kind": about.kind})
        except BaseException:
            self._leave(*sys.exc_info())
            raise
        return self

    def ended(self, last: BaseEvent | None) -> None:
        """The run's terminal event, as published."""
        match last:
            case RunCompleted():
                self.status = "completed"
            case RunFailed(status=status):
                self.status = status
            case RunPaused():
                self.status = "paused"

    def __exit__(self, *exc_info: Any) -> None:
        try:
            self._report()
        except BaseException:
            self._leave(*sys.exc_info())
            raise
        self._leave(*exc_info)

    def _report(self) -> None:
        kind, status = self._about.kind, self.status
        seconds = time.perf_counter() - self._started
        metrics.RUNS_ENDED.labels(kind, status).inc()
        metrics.RUN_SECONDS.labels(kind, status).observe(seconds)
        self._span.set_attribute("agentstream.status", status)
        if status in _FAILED and _tracing is not None:
            _tracing.fail(self._span, status)
        logger.info(
            "Run ended: %s in %.0f ms",
            status,
            seconds * 1000,
            extra={"kind": kind, "status": status, "duration_ms": round(seconds * 1000, 1)},
        )

    def _leave(self, *exc_info: Any) -> None:
        """End the span with what ends the block, then the log lines' fields."""
        try:
            self._block.__exit__(*exc_info)
        finally:
            self._fields.__exit__(*exc_info)


_FAILED = frozenset({"error", "timeout", "unknown"})


def run(run_id: str, about: RunAbout) -> RunObservation:
    """The block of a run's task: its log lines carry its ids, it is counted and timed,
    and traced as a span that its steps are children of."""
    return RunObservation(run_id, about)


def step(
    run_id: str, number: int, expected: tuple[type[BaseException], ...] = ()
) -> AbstractContextManager[SpanLike]:
    """The block of an agent step: a span (``expected`` exceptions are not errors: a
    pause for approval)."""
    return _span(
        "agentstream.step", {"agentstream.run_id": run_id, "agentstream.step": number}, expected
    )


def tool_call(name: str, call_id: str) -> AbstractContextManager[SpanLike]:
    """The block of a tool call: a span, given ``agentstream.tool.status`` on the way."""
    return _span(
        f"execute_tool {name}",
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": call_id,
        },
    )


class ModelCall:
    """The block of one model call (``model_call``), told of its first part and of the usage
    it reports. A class, not a generator: the block lasts as long as the model streams, and
    a generator's frame and wrapper kept about 0.7 KB alive for it. Entered once."""

    __slots__ = ("_block", "model", "span", "started", "usage")

    def __init__(self, model: str) -> None:
        self.model = model
        self.usage: Usage | None = None

    def __enter__(self) -> ModelCall:
        attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": self.model}
        self._block = _span(f"chat {self.model}", attributes)
        self.span = self._block.__enter__()
        self.started = time.perf_counter()
        return self

    def first_part(self) -> None:
        """The model's answer began (once per call, not per token)."""
        seconds = time.perf_counter() - self.started
        metrics.TIME_TO_FIRST_TOKEN.labels(self.model).observe(seconds)
        self.span.set_attribute("agentstream.time_to_first_token_ms", round(seconds * 1000, 3))

    def add(self, usage: Usage) -> None:
        """Usage the provider reported (priced, if the model's prices are known)."""
        self.usage = usage if self.usage is None else self.usage + usage

    def __exit__(self, *exc_info: Any) -> None:
        try:
            self._report(exc_info[1])
        except BaseException:
            self._block.__exit__(*sys.exc_info())
            raise
        self._block.__exit__(*exc_info)

    def _report(self, error: BaseException | None) -> None:
        model, span = self.model, self.span
        if isinstance(error, ProviderError):
            metrics.PROVIDER_ERRORS.labels(model, error.kind).inc()
            span.set_attribute("error.type", error.kind)
        if (usage := self.usage) is not None:
            if usage.input_tokens:
                metrics.TOKENS.labels(model, "input").inc(usage.input_tokens)
            if usage.output_tokens:
                metrics.TOKENS.labels(model, "output").inc(usage.output_tokens)
            if usage.cost_usd:
                metrics.COST.labels(model).inc(usage.cost_usd)
            span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
            if usage.cost_usd is not None:
                span.set_attribute("agentstream.cost_usd", usage.cost_usd)


def model_call(model: str) -> ModelCall:
    """The block of one model call: a span; its tokens and cost are counted when it ends,
    and a provider error by its kind."""
    return ModelCall(model)


@contextmanager
def timed(operation: Literal["sync", "write"]) -> Iterator[None]:
    """Time a live log operation (``agentstream_runlog_seconds``)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        metrics.RUNLOG_SECONDS.labels(operation).observe(time.perf_counter() - started)
