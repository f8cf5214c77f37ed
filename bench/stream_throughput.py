"""One stream of 10,000 tokens: agentstream against a bare Starlette StreamingResponse.

Both servers run in their own process; the client reads raw bytes and counts frames in C,
so it is not the bottleneck (it idles in recv: check with ``top`` while it runs). The
baseline replays the exact frames agentstream sent, pre-encoded, one per chunk.
"""

from __future__ import annotations

import re
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.loopback import Timing, post_stream, server_process

TOKENS = 10_000
REPEATS = 9


def dechunk(body: bytes) -> bytes:
    """The payload of an HTTP/1.1 chunked body."""
    out, rest = [], body
    while rest:
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            break
        out.append(rest[:size])
        rest = rest[size + 2 :]
    return b"".join(out)


def measure() -> dict[str, Any]:
    """Both servers up at once, requests alternating between them, so that drift in the
    machine's load hits both alike."""
    with tempfile.TemporaryDirectory() as data_dir, server_process("agentstream", data_dir) as port:
        key = (Path(data_dir) / "demo-key").read_text().strip()
        request = {"message": f"Write {TOKENS} words", "reasoning": False}

        def ours() -> Timing:
            return post_stream(port, "/api/agents/demo/run/stream", request, {"apikey": key})

        frames_file = Path(data_dir) / "frames.sse"
        frames_file.write_bytes(dechunk(ours().body))  # also the warm-up
        with server_process("baseline", str(frames_file)) as base_port:
            post_stream(base_port, "/stream", {}, {})
            runs: list[Timing] = []
            baseline: list[Timing] = []
            for _ in range(REPEATS):
                runs.append(ours())
                baseline.append(post_stream(base_port, "/stream", {}, {}))

    deltas = len(re.findall(rb'"event":"content_delta"', dechunk(runs[-1].body)))
    assert deltas == TOKENS, f"expected {TOKENS} content_delta frames, got {deltas}"
    ours_eps = statistics.median(r.frames / r.total for r in runs)
    base_eps = statistics.median(r.frames / r.total for r in baseline)
    ours_ttfb = statistics.median(r.first_byte for r in runs)
    base_ttfb = statistics.median(r.first_byte for r in baseline)
    return {
        "frames_per_stream": runs[-1].frames,
        "agentstream_events_per_s": round(ours_eps),
        "baseline_events_per_s": round(base_eps),
        "ratio": round(ours_eps / base_eps, 2),
        "agentstream_ttfb_ms": round(ours_ttfb * 1000, 2),
        "baseline_ttfb_ms": round(base_ttfb * 1000, 2),
        "added_ttfb_ms": round((ours_ttfb - base_ttfb) * 1000, 2),
    }


def report(result: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"One stream, {TOKENS:,} tokens ({result['frames_per_stream']:,} frames), "
            f"median of {REPEATS}:",
            f"  agentstream  {result['agentstream_events_per_s']:>9,} events/s   "
            f"first byte {result['agentstream_ttfb_ms']:>7} ms",
            f"  baseline     {result['baseline_events_per_s']:>9,} events/s   "
            f"first byte {result['baseline_ttfb_ms']:>7} ms",
            f"  ratio {result['ratio']}x of the bare baseline (target >= 0.5x); "
            f"added time to first byte {result['added_ttfb_ms']} ms",
        ]
    )


if __name__ == "__main__":
    print(report(measure()))
