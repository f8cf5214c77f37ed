"""Scenario 1: one stream of 10,000 tokens, against a bare Starlette StreamingResponse.

Throughput: the offline model unpaced, every frame counted by the client; the baseline
replays the exact frames agentstream sent, pre-encoded, one per chunk. Added latency: a
model whose tokens are the time they were yielded (1 ms apart, so each travels alone);
the client stamps each read, and the baseline stamps its frames the same way, so the
difference is what the run log, views, encoder and response add to every token. Both
servers run in their own process, up at once, requests alternating between them so that
drift in the machine's load hits both alike.

The protocol views: the same 10,000 tokens (the ``words`` agent) through the native view
and through each protocol other clients speak (OpenAI chat completions and responses, the
AI SDK's UI message stream, AG-UI), alternating, as tokens per second against the native
view's.
"""

from __future__ import annotations

import json
import re
import statistics
import tempfile
import uuid
from pathlib import Path
from typing import Any

from bench.loopback import Timing, clock_latencies, dechunk, post_stream, quantile, server_process
from bench.tables import markdown_table, text_table

TOKENS = 10_000
REPEATS = 9
CLOCK_TOKENS = 1_000
CLOCK_REPEATS = 3
WORDS = f"Write {TOKENS} words"


def _user(text: str) -> list[dict[str, Any]]:
    return [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": text}]}]


VIEWS: dict[str, tuple[str, Any]] = {
    "native": ("/api/agents/words/run/stream", lambda: {"message": WORDS}),
    "openai chat completions": (
        "/v1/chat/completions",
        lambda: {
            "model": "words",
            "messages": [{"role": "user", "content": WORDS}],
            "stream": True,
        },
    ),
    "openai responses": (
        "/v1/responses",
        lambda: {"model": "words", "input": WORDS, "stream": True},
    ),
    "ai sdk ui messages": (
        "/api/agents/words/ui-messages",
        lambda: {"id": uuid.uuid4().hex[:16], "messages": _user(WORDS)},
    ),
    "ag-ui": (
        "/api/agents/words/ag-ui",
        lambda: {
            "threadId": str(uuid.uuid4()),
            "runId": str(uuid.uuid4()),
            "messages": [{"id": "m1", "role": "user", "content": WORDS}],
        },
    ),
}
"""Each view's path and request body (a new one each time: a new conversation)."""


def measure(quick: bool = False, source: Path | None = None, views: bool = True) -> dict[str, Any]:
    """Scenario 1; agentstream from the checkout ``source`` if given; ``views``: also
    through each protocol view (a checkout from before them has none)."""
    repeats = 3 if quick else REPEATS
    with (
        tempfile.TemporaryDirectory() as data_dir,
        server_process("agentstream", data_dir, source=source) as ours,
    ):
        key = {"apikey": (Path(data_dir) / "demo-key").read_text().strip()}
        request = f'{{"message": "Write {TOKENS} words", "reasoning": false}}'.encode()
        clock = f'{{"message": "Write {CLOCK_TOKENS} words"}}'.encode()

        def stream() -> Timing:
            return post_stream(ours.port, "/api/agents/demo/run/stream", request, key)

        frames_file = Path(data_dir) / "frames.sse"
        frames_file.write_bytes(dechunk(stream().body))  # also the warm-up
        with server_process("baseline", str(frames_file)) as base:
            base_clock = f'{{"tokens": {CLOCK_TOKENS}, "delay": 0.001, "clock": true}}'.encode()
            post_stream(base.port, "/stream", b"", {})
            runs: list[Timing] = []
            baseline: list[Timing] = []
            for _ in range(repeats):
                runs.append(stream())
                baseline.append(post_stream(base.port, "/stream", b"", {}))
            ours_latency: list[float] = []
            base_latency: list[float] = []
            for _ in range(CLOCK_REPEATS):
                timing = post_stream(ours.port, "/api/agents/clock/run/stream", clock, key)
                ours_latency += clock_latencies(timing)
                base_latency += clock_latencies(post_stream(base.port, "/paced", base_clock, {}))
        through_views = _views(ours.port, key, repeats) if views else {}

    deltas = len(re.findall(rb'"event":"content_delta"', dechunk(runs[-1].body)))
    assert deltas == TOKENS, f"expected {TOKENS} content_delta frames, got {deltas}"
    ours_eps = statistics.median(r.frames / r.total for r in runs)
    base_eps = statistics.median(r.frames / r.total for r in baseline)
    ours_ttfb = statistics.median(r.first_byte for r in runs)
    base_ttfb = statistics.median(r.first_byte for r in baseline)

    def ms(values: list[float], q: float) -> float:
        return round(quantile(values, q) * 1000, 3)

    return {
        "tokens": TOKENS,
        "repeats": repeats,
        "frames_per_stream": runs[-1].frames,
        "agentstream_events_per_s": round(ours_eps),
        "baseline_events_per_s": round(base_eps),
        "ratio": round(ours_eps / base_eps, 2),
        "agentstream_ttfb_ms": round(ours_ttfb * 1000, 2),
        "baseline_ttfb_ms": round(base_ttfb * 1000, 2),
        "agentstream_latency_p50_ms": ms(ours_latency, 0.5),
        "agentstream_latency_p99_ms": ms(ours_latency, 0.99),
        "baseline_latency_p50_ms": ms(base_latency, 0.5),
        "baseline_latency_p99_ms": ms(base_latency, 0.99),
        "added_latency_p50_ms": round(ms(ours_latency, 0.5) - ms(base_latency, 0.5), 3),
        "added_latency_p99_ms": round(ms(ours_latency, 0.99) - ms(base_latency, 0.99), 3),
        "views": through_views,
    }


def _views(port: int, key: dict[str, str], repeats: int) -> dict[str, dict[str, float]]:
    """Tokens per second through each view, median of ``repeats`` alternating rounds, with
    the ratio to the native view's."""
    seconds: dict[str, list[float]] = {name: [] for name in VIEWS}
    for round_ in range(repeats + 1):  # the first round warms each view up
        for name, (path, body) in VIEWS.items():
            timing = post_stream(port, path, json.dumps(body()).encode(), key)
            assert timing.body.count(b"word") >= TOKENS, f"{name} streamed too little"
            if round_:
                seconds[name].append(timing.total)
    per_s = {name: TOKENS / statistics.median(times) for name, times in seconds.items()}
    return {
        name: {"tokens_per_s": round(rate), "ratio": round(rate / per_s["native"], 2)}
        for name, rate in per_s.items()
    }


HEADER = ("system", "events/s", "ratio", "first byte ms", "latency p50 ms", "latency p99 ms")


def _rows(r: dict[str, Any]) -> list[tuple[str, ...]]:
    return [
        (
            system,
            f"{r[f'{system}_events_per_s']:,}",
            f"{r['ratio']}x" if system == "agentstream" else "1x",
            f"{r[f'{system}_ttfb_ms']}",
            f"{r[f'{system}_latency_p50_ms']}",
            f"{r[f'{system}_latency_p99_ms']}",
        )
        for system in ("agentstream", "baseline")
    ]


def _summary(r: dict[str, Any]) -> str:
    return (
        f"One stream of {r['tokens']:,} tokens ({r['frames_per_stream']:,} frames), median of "
        f"{r['repeats']}; latency from the model yielding a token to the client reading it, "
        f"{CLOCK_REPEATS} x {CLOCK_TOKENS:,} tokens 1 ms apart. Added by agentstream per "
        f"token: p50 {r['added_latency_p50_ms']} ms, p99 {r['added_latency_p99_ms']} ms."
    )


VIEWS_HEADER = ("view", "tokens/s", "ratio to native")
VIEWS_SUMMARY = (
    "The same 10,000 tokens (the `words` agent) through each view, median of the alternating "
    "rounds:"
)


def _view_rows(result: dict[str, Any]) -> list[tuple[str, ...]]:
    return [
        (name, f"{v['tokens_per_s']:,}", f"{v['ratio']}x") for name, v in result["views"].items()
    ]


def report(result: dict[str, Any]) -> str:
    return "\n".join(
        [
            _summary(result),
            text_table(HEADER, _rows(result)),
            VIEWS_SUMMARY,
            text_table(VIEWS_HEADER, _view_rows(result)),
        ]
    )


def markdown(result: dict[str, Any]) -> str:
    return "\n\n".join(
        [
            _summary(result),
            markdown_table(HEADER, _rows(result)),
            VIEWS_SUMMARY,
            markdown_table(VIEWS_HEADER, _view_rows(result)),
        ]
    )


if __name__ == "__main__":
    print(report(measure()))
