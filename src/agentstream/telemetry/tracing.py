"""OpenTelemetry spans: loaded only when tracing is on (the ``otel`` extra installed and
``AGENTSTREAM_TRACING`` set), so without it nothing of OpenTelemetry is imported."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from importlib.metadata import version
from typing import Literal

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.util.types import AttributeValue

__all__ = ["Exporter", "Tracing", "exporting", "from_global"]

Exporter = Literal["otlp", "console"]


class Tracing:
    """Spans from one tracer, current for their block (so the spans started in it, in its
    tasks too, are its children)."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer

    @contextmanager
    def span(
        self,
        name: str,
        attributes: Mapping[str, AttributeValue],
        expected: tuple[type[BaseException], ...] = (),
    ) -> Iterator[Span]:
        """A span for the block: an exception other than ``expected`` (and a cancel) ends
        it with an error status."""
        with self.tracer.start_as_current_span(
            name, attributes=attributes, record_exception=False, set_status_on_exception=False
        ) as span:
            try:
                yield span
            except expected:
                raise
            except Exception as exc:
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                raise

    @staticmethod
    def fail(span: object, description: str) -> None:
        """End ``span`` (one of ``span``'s) with an error status."""
        if isinstance(span, Span):
            span.set_status(Status(StatusCode.ERROR, description))


def exporting(exporter: Exporter) -> Tracing:
    """Tracing to an exporter of the SDK: OTLP over HTTP (configured by the standard
    ``OTEL_EXPORTER_OTLP_*`` variables), or the console. The resource is named by
    ``OTEL_SERVICE_NAME`` (default ``agentstream``). The provider becomes the global one
    if none was set, so other instrumentation's spans join the same traces."""
    import os

    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SpanExporter,
    )

    name = os.environ.get("OTEL_SERVICE_NAME") or "agentstream"
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))
    span_exporter: SpanExporter
    if exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        span_exporter = OTLPSpanExporter()
    else:
        span_exporter = ConsoleSpanExporter()
    provider.add_span_processor(BatchSpanProcessor(span_exporter))
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)
    return Tracing(provider.get_tracer("agentstream", version("agentstream")))


def from_global() -> Tracing:
    """Tracing through the global tracer provider, as the program configured it (e.g.
    ``opentelemetry-instrument``, or the code that embeds the app)."""
    return Tracing(trace.get_tracer("agentstream", version("agentstream")))
