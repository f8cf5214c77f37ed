"""Scenario 1: one stream of 10,000 tokens, against a bare Starlette StreamingResponse.

Throughput: the offline model unpaced, every frame counted by the client; the baseline
replays the exact frames agentstream sent, pre-encoded, one per chunk. Added latency: a
model whose tokens are the time they were yielded (1 ms apart, so each travels alone);
the client stamps each read, and the baseline stamps its frames the same way, so the
difference is what the run log, views, encoder and response add to every token. Both
servers run in their own process, up at once, requests alternating between them so that
drift in the machine's load hits both alike.
"""

from __future__ import annotations

import re
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.loopback import Timing, clock_latencies, dechunk, post_stream, quantile, server_process
from bench.tables import markdown_table, text_table

TOKENS = 10_000
REPEATS = 9
CLOCK_TOKENS = 1_000
CLOCK_REPEATS = 3


def measure(quick: bool = False, source: Path | None = None) -> dict[str, Any]:
    """Scenario 1; agentstream from the checkout ``source`` if given."""
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


def report(result: dict[str, Any]) -> str:
    return "\n".join([_summary(result), text_table(HEADER, _rows(result))])


def markdown(result: dict[str, Any]) -> str:
    return "\n\n".join([_summary(result), markdown_table(HEADER, _rows(result))])


if __name__ == "__main__":
    print(report(measure()))
