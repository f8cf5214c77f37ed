"""Observability: request ids, Prometheus metrics scraped from a real server, JSON log lines
of a real ``agentstream serve``, and OpenTelemetry spans caught by the SDK's in-memory
exporter."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast
from unittest.mock import patch

import anyio
import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client.parser import text_string_to_metric_families

from agentstream import telemetry
from agentstream.agents import AgentSpec
from agentstream.errors import ProviderError
from agentstream.events import Usage
from agentstream.providers.base import ModelPart, ModelRequest
from agentstream.providers.scripted import ScriptedModel
from agentstream.runtime.tools import Tool
from agentstream.server import create_app
from agentstream.sse import SSEDecoder
from agentstream.telemetry import logs, metrics
from agentstream.telemetry.tracing import Tracing
from conftest import LiveServer, free_port, make_settings, serve, wait_until
from fakes.test_app import call_wait_then_answer

QUESTION = "What is 17 * 23?"
"""Two steps: the calculator, then the answer."""

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def rate_limited(request: ModelRequest) -> Iterator[ModelPart]:
    raise ProviderError("Slow down", provider="scripted", kind="rate_limit")
    yield  # a generator: it fails when streamed, as a provider does


GATE = threading.Event()
"""Opens what ``waiter``'s tool waits for."""


async def wait() -> str:
    while not GATE.is_set():  # noqa: ASYNC110 (another thread opens it)
        await anyio.sleep(0.01)
    return "opened"


@pytest.fixture
def observed(tmp_path: Path) -> Iterator[LiveServer]:
    """A server with the demo agents, ``limited``, whose model is always rate limited, and
    ``waiter``, whose run waits for ``GATE``."""
    GATE.clear()
    with serve(
        make_settings(tmp_path),
        tools=[Tool.from_function(wait)],
        models=[
            ScriptedModel("scripted-rate-limited", rate_limited),
            ScriptedModel("scripted-wait", call_wait_then_answer),
        ],
        agents=[
            AgentSpec(id="limited", model="scripted-rate-limited"),
            AgentSpec(id="waiter", model="scripted-wait", tools=["wait"]),
        ],
    ) as live:
        yield live
    GATE.set()


def scrape(client: httpx.Client) -> Samples:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    return after.get(key, 0.0) - before.get(key, 0.0)


def run(client: httpx.Client, agent: str, message: str, **headers: str) -> list[dict[str, Any]]:
    """Stream a run to its end: its frames."""
    decoder = SSEDecoder()
    frames = []
    with client.stream(
        "POST", f"/api/agents/{agent}/run/stream", json={"message": message}, headers=headers
    ) as response:
        for chunk in response.iter_bytes():
            frames += [event.json() for event in decoder.feed(chunk)]
    return frames


def test_metrics_move_by_exactly_what_the_runs_did(observed: LiveServer) -> None:
    with observed.client() as client:
        before = scrape(client)
        answered = run(client, "demo", QUESTION)
        failed = run(client, "limited", "Hello")
        wait_until(lambda: moved(before, scrape(client), "agentstream_runs_ended_total",
                                 kind="agent", status="error") == 1)  # fmt: skip
        after = scrape(client)

    usage = answered[-1]["usage"]
    assert answered[-1]["event"] == "complete"
    assert failed[-1]["event"] == "error"
    counts = {
        ("agentstream_runs_started_total", "kind=agent"): 2,
        ("agentstream_runs_ended_total", "kind=agent,status=completed"): 1,
        ("agentstream_runs_ended_total", "kind=agent,status=error"): 1,
        ("agentstream_run_duration_seconds_count", "kind=agent,status=completed"): 1,
        ("agentstream_tokens_total", "direction=input,model=offline"): usage["input_tokens"],
        ("agentstream_tokens_total", "direction=output,model=offline"): usage["output_tokens"],
        ("agentstream_time_to_first_token_seconds_count", "model=offline"): 2,  # two steps
        ("agentstream_time_to_first_token_seconds_count", "model=scripted-rate-limited"): 0,
        (
            "agentstream_provider_errors_total",
            "kind=rate_limit,model=scripted-rate-limited",
        ): 1,
        ("agentstream_runlog_seconds_count", "operation=sync"): 2,
        ("agentstream_live_streams", ""): 0,  # both streams are over
    }
    assert {
        key: moved(before, after, key[0], **dict(p.split("=") for p in key[1].split(",") if p))
        for key in counts
    } == counts
    assert moved(before, after, "agentstream_store_seconds_count", operation="insert") > 0
    assert moved(before, after, "agentstream_store_seconds_count", operation="select") > 0


def test_a_live_stream_is_counted_while_it_is_open(observed: LiveServer) -> None:
    def live_streams() -> float:
        return scrape(client)[("agentstream_live_streams", frozenset())]

    with observed.client() as client:
        before = live_streams()
        with client.stream("POST", "/api/agents/waiter/run/stream", json={"message": "go"}):
            during = live_streams()  # the run waits for the gate
            GATE.set()
        wait_until(lambda: live_streams() == before)

    assert during == before + 1


def test_tokens_and_cost_are_counted_by_model_when_a_call_ends() -> None:
    before = {
        "input": metrics.TOKENS.labels("priced-model", "input")._value.get(),
        "output": metrics.TOKENS.labels("priced-model", "output")._value.get(),
        "cost": metrics.COST.labels("priced-model")._value.get(),
    }
    with telemetry.model_call("priced-model") as call:
        call.add(Usage(input_tokens=10, output_tokens=3, cost_usd=0.25))
        assert metrics.TOKENS.labels("priced-model", "input")._value.get() == before["input"]
        call.add(Usage(input_tokens=5, output_tokens=2, cost_usd=0.5))

    assert metrics.TOKENS.labels("priced-model", "input")._value.get() == before["input"] + 15
    assert metrics.TOKENS.labels("priced-model", "output")._value.get() == before["output"] + 5
    assert metrics.COST.labels("priced-model")._value.get() == before["cost"] + 0.75


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_metrics_can_be_turned_off(tmp_path: Path) -> None:
    for enabled, status in [(True, 200), (False, 404)]:
        app = create_app(make_settings(tmp_path, metrics=enabled))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            assert (await client.get("/metrics")).status_code == status


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("sent", "kept"),
    [("req-42.a:b", True), ("", False), ("has space", False), ("x" * 129, False)],
)
async def test_a_request_id_is_the_clients_if_sensible_else_a_new_one(
    tmp_path: Path, sent: str, kept: bool
) -> None:
    app = create_app(make_settings(tmp_path))
    transport = httpx.ASGITransport(app=app)
    headers = {"X-Request-Id": sent} if sent else {}
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        first = await client.get("/healthz", headers=headers)
        second = await client.get("/healthz", headers=headers)

    ids = [first.headers["x-request-id"], second.headers["x-request-id"]]
    if kept:
        assert ids == [sent, sent]
    else:
        assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
        assert ids[0] != ids[1]


def test_serve_logs_json_lines_with_the_request_run_session_and_agent(tmp_path: Path) -> None:
    """stderr is not a terminal: JSON lines and nothing else, the banner too (access lines
    on stdout, as uvicorn's)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "agentstream", "serve", "--demo", "--port", str(port)]
    env = {**os.environ, "AGENTSTREAM_DATA_DIR": str(tmp_path), "AGENTSTREAM_LOG_FORMAT": "auto"}
    with (tmp_path / "out").open("w+") as out, (tmp_path / "err").open("w+") as err:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=err, cwd=tmp_path)
        try:
            wait_until(lambda: "Application startup complete" in Path(err.name).read_text(), 30)
            key = (tmp_path / "demo-key").read_text().strip()
            with httpx.Client(base_url=url, headers={"apikey": key}, timeout=10) as client:
                frames = run(client, "demo", QUESTION, **{"X-Request-Id": "req-from-test"})
        finally:
            process.terminate()
            process.wait(30)
        printed = [json.loads(line) for line in Path(err.name).read_text().splitlines()]
        access = [json.loads(line) for line in Path(out.name).read_text().splitlines()]

    ids = {
        "request_id": "req-from-test",
        "run_id": frames[0]["run_id"],
        "session_id": frames[0]["session_id"],
        "agent": "demo",
    }
    started = next(line for line in printed if line["message"] == "Run started")
    ended = next(line for line in printed if line["message"].startswith("Run ended"))
    assert started.items() >= {**ids, "level": "INFO", "logger": "agentstream.runs"}.items()
    assert ended.items() >= {**ids, "status": "completed", "kind": "agent"}.items()
    assert ended["duration_ms"] >= 0
    assert any(line["message"].startswith("Demo API key") for line in printed)
    assert any(line["message"].startswith(f"agentstream on {url}") for line in printed)
    [posted] = [line for line in access if line.get("request_id") == "req-from-test"]
    assert (
        posted.items()
        >= {
            "method": "POST",
            "path": "/api/agents/demo/run/stream",
            "status": 200,
        }.items()
    )


def test_on_a_terminal_a_line_is_uvicorns_with_the_ids_after_it() -> None:
    record = logging.makeLogRecord({"levelname": "INFO", "levelno": 20, "msg": "Run started"})
    with logs.AboutRun("run_1", "ses_1", "demo"):
        logs.ContextFilter().filter(record)
    formatter = logs.TextFormatter()
    formatter.use_colors = False

    assert formatter.format(record) == (
        "INFO:     Run started [run_id=run_1 session_id=ses_1 agent=demo]"
    )


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on, into memory, for the test."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.use_tracing(Tracing(provider.get_tracer("tests")))
    try:
        yield exporter
    finally:
        telemetry.use_tracing(None)
        provider.shutdown()


def attributes(span: ReadableSpan) -> dict[str, object]:
    return dict(span.attributes or {})


def finished(exporter: InMemorySpanExporter, name: str, count: int) -> list[ReadableSpan]:
    """Once ``count`` spans named ``name`` have ended (a run's span ends after its terminal
    event is sent): the spans."""
    wait_until(lambda: len([s for s in exporter.get_finished_spans() if s.name == name]) >= count)
    return list(exporter.get_finished_spans())


def test_a_run_is_traced_as_its_steps_and_their_model_and_tool_calls(
    observed: LiveServer, spans: InMemorySpanExporter
) -> None:
    with observed.client() as client:
        frames = run(client, "demo", QUESTION)
    traced = finished(spans, "agentstream.run", 1)

    [root] = [s for s in traced if s.name == "agentstream.run"]
    steps = sorted(
        (s for s in traced if s.name == "agentstream.step"),
        key=lambda s: str(attributes(s)["agentstream.step"]),
    )
    assert root.parent is None
    assert dict(root.attributes or {}) == {
        "agentstream.run_id": frames[0]["run_id"],
        "agentstream.kind": "agent",
        "agentstream.session_id": frames[0]["session_id"],
        "gen_ai.agent.name": "demo",
        "agentstream.status": "completed",
    }

    def children(parent: ReadableSpan) -> list[str]:
        assert parent.context is not None
        return sorted(
            s.name for s in traced if s.parent and s.parent.span_id == parent.context.span_id
        )

    assert children(root) == ["agentstream.step", "agentstream.step"]
    assert children(steps[0]) == ["chat offline", "execute_tool calculator"]
    assert children(steps[1]) == ["chat offline"]
    assert root.context is not None
    assert {s.context.trace_id for s in traced if s.context} == {root.context.trace_id}
    [tool] = [s for s in traced if s.name == "execute_tool calculator"]
    assert (
        dict(tool.attributes or {}).items()
        >= {
            "gen_ai.tool.name": "calculator",
            "agentstream.tool.status": "success",
        }.items()
    )
    usage = frames[-1]["usage"]
    chats = [s for s in traced if s.name == "chat offline"]
    tokens = [attributes(s)["gen_ai.usage.input_tokens"] for s in chats]
    assert sum(t for t in tokens if isinstance(t, int)) == usage["input_tokens"]
    assert all(s.status.status_code is StatusCode.UNSET for s in traced)


def test_a_provider_error_fails_the_model_call_and_the_run_spans(
    observed: LiveServer, spans: InMemorySpanExporter
) -> None:
    with observed.client() as client:
        run(client, "limited", "Hello")
    traced = {s.name: s for s in finished(spans, "agentstream.run", 1)}

    chat = traced["chat scripted-rate-limited"]
    assert chat.status.status_code is StatusCode.ERROR
    assert (chat.attributes or {})["error.type"] == "rate_limit"
    assert traced["agentstream.step"].status.status_code is StatusCode.ERROR
    assert traced["agentstream.run"].status.status_code is StatusCode.ERROR
    assert (traced["agentstream.run"].attributes or {})["agentstream.status"] == "error"


def test_without_tracing_nothing_of_opentelemetry_is_needed() -> None:
    """As if the otel extra were not installed: OpenTelemetry cannot be imported, and runs,
    steps, model and tool calls are observed all the same."""
    program = textwrap.dedent("""
        import sys
        for name in ("opentelemetry", "opentelemetry.trace", "opentelemetry.sdk"):
            sys.modules[name] = None  # importing it raises ImportError
        from agentstream import telemetry
        from agentstream.events import RunCompleted, Usage
        import agentstream.runtime.runs
        with telemetry.run("run_1", telemetry.RunAbout("agent", agent="a")) as observed:
            with telemetry.step("run_1", 1), telemetry.model_call("m") as call:
                call.first_part()
                call.add(Usage(input_tokens=1))
            with telemetry.tool_call("calculator", "call_1") as span:
                span.set_attribute("agentstream.tool.status", "success")
            observed.ended(RunCompleted(run_id="run_1", seq=9, ts=0.0))
        assert "agentstream.telemetry.tracing" not in sys.modules
        try:
            telemetry.use_tracing("console")
        except ImportError as exc:
            print(exc)
    """)
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Tracing needs the otel extra: pip install 'agentstream[otel]'")


def test_fastapis_own_http_span_of_a_stream_ends_with_the_stream_and_without_error(
    tmp_path: Path,
) -> None:
    """With a tracer provider set for the process, FastAPI traces each request itself. A
    stream's body goes out within FastAPI's own call (``StreamsOutside`` is the outermost
    layer of its middleware, not around it), so the request's span sees the whole response,
    and does not record it as incomplete, an error. In a process of its own: the tracer
    provider is the process's."""
    program = textwrap.dedent("""
        import json, sys
        from pathlib import Path
        import httpx
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        from agentstream.config import Settings
        from agentstream.server import create_app
        from fakes.server import run_app
        settings = Settings(data_dir=Path(sys.argv[1]), demo=True, offline_token_delay=0.0)
        with run_app(create_app(settings), name="The server", lifespan="on") as url:
            key = settings.demo_key_file.read_text().strip()
            with httpx.stream(
                "POST", url + "/api/agents/demo/run/stream", json={"message": "hi"},
                headers={"apikey": key}, timeout=30,
            ) as response:
                body = response.read().decode()
        spans = [
            [s.name, s.status.status_code.name, (s.attributes or {}).get("error.type")]
            for s in exporter.get_finished_spans()
        ]
        print(json.dumps({"ended": '"event":"complete"' in body, "spans": spans}))
    """)
    tests = Path(__file__).parent
    done = subprocess.run(
        [sys.executable, "-c", program, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tests,
        env=os.environ | {"PYTHONPATH": str(tests)},
    )
    assert done.returncode == 0, done.stderr
    traced = json.loads(done.stdout.splitlines()[-1])
    assert traced["ended"]
    [request] = [s for s in traced["spans"] if s[0] == "POST /api/agents/{agent_id}/run/stream"]
    assert request[1:] == ["UNSET", None]


def _logged_run() -> object:
    """The run the log lines logged here are about (``ContextFilter``'s field)."""
    record = logging.makeLogRecord({})
    logs.ContextFilter().filter(record)
    return record.__dict__["run_id"]


def test_a_runs_and_a_model_calls_blocks_end_as_a_with_would_however_they_end(
    spans: InMemorySpanExporter,
) -> None:
    """The blocks are classes, not generators: whatever ends them (the block's error, an
    error while they report, a span that does not start), the span ends with that error and
    the log lines are no longer about the run."""
    about = telemetry.RunAbout("agent", agent="a")
    during: list[object] = []

    def fails() -> None:
        during.append(_logged_run())
        raise ValueError("the run's own")

    with pytest.raises(ValueError, match="the run's own"), telemetry.run("run_1", about):
        fails()
    assert during == ["run_1"]
    assert _logged_run() is None

    failing = patch.object(metrics.RUNS_ENDED, "labels", side_effect=RuntimeError("reporting"))
    with failing, pytest.raises(RuntimeError), telemetry.run("run_2", about):
        pass
    assert _logged_run() is None

    errors = metrics.PROVIDER_ERRORS.labels("m", "rate_limit")
    before = errors._value.get()
    with pytest.raises(ProviderError), telemetry.model_call("m"):
        raise ProviderError("slow down", provider="p", kind="rate_limit")
    assert errors._value.get() == before + 1

    ended = {
        str(attributes(span).get("agentstream.run_id", span.name)): span
        for span in finished(spans, "chat m", 1)
    }
    assert [ended[name].status.description for name in ("run_1", "run_2", "chat m")] == [
        "ValueError: the run's own",
        "RuntimeError: reporting",
        "ProviderError: slow down",
    ]

    class Unstarted:
        def span(self, *args: object) -> None:
            raise RuntimeError("no tracer")

    telemetry.use_tracing(cast(Tracing, Unstarted()))
    with pytest.raises(RuntimeError, match="no tracer"), telemetry.run("run_3", about):
        pass
    assert _logged_run() is None
