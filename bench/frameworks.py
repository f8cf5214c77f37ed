"""Scenario 3: the same agent on Pydantic AI and on LangGraph (see ``bench.peers``).

For each system, its own server process: tokens/s of one unpaced stream of 10,000 tokens,
and the cost of holding many streams at 30 tokens/s (resident memory and CPU per stream,
measured by the separate load generator as in scenario 2). Ratios are peer / agentstream.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench.concurrency import RATE
from bench.loadgen import load
from bench.tables import markdown_table, text_table
from bench.targets import start

TOKENS = 10_000
STREAMS = 200
SYSTEMS = ("agentstream", "pydantic-ai", "langgraph")


def measure_one(name: str, quick: bool) -> dict[str, Any]:
    with start(name, token_delay=0.0) as target:
        target.stream(TOKENS)  # warm-up
        runs = [target.stream(TOKENS) for _ in range(2 if quick else 5)]
    with start(name, token_delay=1 / RATE) as target:
        target.stream(5)
        streams = 50 if quick else STREAMS
        held = load(target, streams=streams, ramp=2.0, hold=2.0 if quick else 4.0, rate=RATE)
    return {
        "tokens_per_s": round(statistics.median(TOKENS / run.total for run in runs)),
        "frames_per_s": round(statistics.median(run.frames / run.total for run in runs)),
        "streams": streams,
        "errors": held["errors"],
        "itl_p99_ms": held["itl_p99_ms"],
        "rss_kib_per_stream": round(
            (held["server_rss_peak"] - held["server_rss_idle"]) / 1024 / streams, 1
        ),
        "cpu_pct_per_stream": round(100 * held["server_cpu_s"] / held["window_s"] / streams, 3),
    }


def measure(quick: bool = False) -> dict[str, Any]:
    systems = {name: measure_one(name, quick) for name in SYSTEMS}
    ours = systems["agentstream"]
    for result in systems.values():
        result["speed_ratio"] = round(result["tokens_per_s"] / ours["tokens_per_s"], 2)
        result["memory_ratio"] = round(result["rss_kib_per_stream"] / ours["rss_kib_per_stream"], 2)
        result["cpu_ratio"] = round(result["cpu_pct_per_stream"] / ours["cpu_pct_per_stream"], 2)
    return {"tokens": TOKENS, "rate": RATE, "systems": systems}


HEADER = (
    "system",
    "tokens/s",
    "frames/s",
    "× ours",
    "streams",
    "ITL p99 ms",
    "RSS KiB/stream",
    "× ours",
    "CPU/stream",
    "× ours",
)


def _rows(result: dict[str, Any]) -> list[tuple[str, ...]]:
    return [
        (
            name,
            f"{r['tokens_per_s']:,}",
            f"{r['frames_per_s']:,}",
            f"{r['speed_ratio']}x",
            f"{r['streams']} ({r['errors']} errors)",
            f"{r['itl_p99_ms']}",
            f"{r['rss_kib_per_stream']}",
            f"{r['memory_ratio']}x",
            f"{r['cpu_pct_per_stream']}%",
            f"{r['cpu_ratio']}x",
        )
        for name, r in result["systems"].items()
    ]


def _summary(result: dict[str, Any]) -> str:
    return (
        f"The same agent on each framework: one unpaced stream of {result['tokens']:,} tokens, "
        f"then {next(iter(result['systems'].values()))['streams']} streams at "
        f"{result['rate']:.0f} tokens/s each; ratios are the peer's figure over agentstream's."
    )


def report(result: dict[str, Any]) -> str:
    return "\n".join([_summary(result), text_table(HEADER, _rows(result))])


def markdown(result: dict[str, Any]) -> str:
    return "\n\n".join([_summary(result), markdown_table(HEADER, _rows(result))])
