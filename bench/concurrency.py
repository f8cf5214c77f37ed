"""Scenario 2: how many live streams one server process holds at a realistic token pace.

N concurrent streams at 30 tokens/s each (a bench model on a fixed schedule, as in
scenario 3), N stepped up until the inter-token latency p99
seen by the clients exceeds 100 ms or a stream fails; each step on a fresh server process,
so its memory is that step's alone. Baseline: a bare Starlette StreamingResponse sleeping
between pre-encoded frames. The load generator is a separate process (``bench.loadgen``)
that reports its own CPU use in the window.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import services
from bench.loadgen import load
from bench.tables import markdown_table, text_table
from bench.targets import Target, start

RATE = 30.0
"""Tokens per second per stream, about what a hosted LLM streams."""
LIMIT_MS = 100.0
DELIVERED = 0.9
"""Share of the window's due tokens that must arrive: a server that starts streams late
holds fewer than it was asked to (the first token of each stream in the window starts no
gap, hence not 100%)."""
STARTS_PER_S = 250.0
"""How fast the generator opens the streams of a step."""
STEPS = (100, 150, 250, 350, 500, 750, 1000, 1250, 1500, 1750, 2000, 2250, 2500, 2750, 3000, 4000)
"""From 1,000 to 3,000 a quarter of a thousand apart: the ratio of two systems held to a
tenth or so, where 1,000 then 1,500 could only tell 0.67x from 1.0x (and 2,000 then 3,000,
where the baseline stopped on a fast machine, 0.58x from 0.88x)."""
QUICK_STEPS = (50, 200)
SYSTEMS = ("agentstream", "agentstream-postgresql", "baseline")
"""The embedded default, the same process on a PostgreSQL store (skipped when no server
answers), and the bare baseline."""
EMBEDDED = ("agentstream", "baseline")


def step(
    name: str, streams: int, hold: float, starts_per_s: float, source: Path | None = None
) -> dict[str, Any]:
    with start(name, token_delay=1 / RATE, source=source) as target:
        return hold_streams([target], streams, hold, starts_per_s)


def hold_streams(
    targets: Sequence[Target],
    streams: int,
    hold: float,
    starts_per_s: float,
    services: tuple[str, ...] = (),
) -> dict[str, Any]:
    """``streams`` streams at ``RATE`` over the processes of one system (round-robin),
    opened ``starts_per_s`` per second; what the load generator measured, and whether they
    were held."""
    for target in targets:
        target.stream(5)  # warm-up: first request's imports and caches
    ramp = max(1.0, streams / starts_per_s)
    result = load(*targets, streams=streams, ramp=ramp, hold=hold, rate=RATE, services=services)
    window = result["window_s"]
    return {
        **result,
        "held": result["errors"] == 0
        and result["itl_p99_ms"] <= LIMIT_MS
        and result["delivered"] >= DELIVERED,
        "cpu_pct_per_stream": round(100 * result["server_cpu_s"] / window / streams, 3),
        "server_cpu_pct": round(100 * result["server_cpu_s"] / window),
        "rss_kib_per_stream": round(
            (result["server_rss_peak"] - result["server_rss_idle"]) / 1024 / streams, 1
        ),
        "loadgen_cpu_pct": round(100 * result["loadgen_cpu_s"] / window),
    }


def ladders(
    systems: dict[str, Callable[[int], dict[str, Any]]], steps: Sequence[int]
) -> dict[str, dict[str, Any]]:
    """For each system, ``systems[name](N)`` for each N of ``steps`` until one is not
    held: every step, and the largest held (None if none was). The systems take turns at
    each step, so that a shared machine whose load changes over the minutes a ladder takes
    weighs on each alike, not on whichever ran last (the baseline's own figures moved by
    half between two runs a quarter of an hour apart)."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
    for streams in steps:
        climbing = [name for name, done in runs.items() if not done or done[-1]["held"]]
        if not climbing:
            break
        for name in climbing:
            runs[name].append(systems[name](streams))
    return {name: _ladder(done) for name, done in runs.items()}


def _ladder(runs: list[dict[str, Any]]) -> dict[str, Any]:
    held = [run for run in runs if run["held"]]
    return {"steps": runs, "max_held": held[-1] if held else None}


def measure(
    quick: bool = False, source: Path | None = None, systems: Sequence[str] = SYSTEMS
) -> dict[str, Any]:
    """Scenario 2 for ``systems``; agentstream from the checkout ``source`` if given."""
    steps = QUICK_STEPS if quick else STEPS
    hold = 2.0 if quick else 6.0
    skipped = services.unavailable(cluster=False) if "agentstream-postgresql" in systems else None
    measured = ladders(
        {
            name: functools.partial(step, name, hold=hold, starts_per_s=STARTS_PER_S, source=source)
            for name in systems
            if not (name == "agentstream-postgresql" and skipped)
        },
        steps,
    )
    base = measured["baseline"]["max_held"]

    def ratio(name: str) -> float | None:
        ours = measured[name]["max_held"] if name in measured else None
        return round(ours["streams"] / base["streams"], 2) if ours and base else None

    return {
        "rate": RATE,
        "limit_ms": LIMIT_MS,
        "systems": measured,
        "skipped": skipped,
        "ratio": ratio("agentstream"),
        "ratio_postgresql": ratio("agentstream-postgresql"),
        "loadgen_cpu_pct_max": max(
            run["loadgen_cpu_pct"] for ladder_ in measured.values() for run in ladder_["steps"]
        ),
    }


def _rows(result: dict[str, Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for name, measured in result["systems"].items():
        for run in measured["steps"]:
            rows.append(
                (
                    name,
                    f"{run['streams']:,}",
                    "yes" if run["held"] else "no",
                    f"{run['itl_p50_ms']}",
                    f"{run['itl_p99_ms']}",
                    f"{run['ttft_p50_ms']:,}",
                    f"{run['ttft_p99_ms']:,}",
                    f"{100 * run['delivered']:.0f}%",
                    f"{run['errors']}",
                    f"{run['server_cpu_pct']}%",
                    f"{run['cpu_pct_per_stream']}%",
                    f"{run['rss_kib_per_stream']}",
                    f"{run['loadgen_cpu_pct']}%",
                )
            )
    return rows


HEADER = (
    "system",
    "streams",
    "held",
    "ITL p50 ms",
    "ITL p99 ms",
    "TTFT p50 ms",
    "TTFT p99 ms",
    "delivered",
    "errors",
    "server CPU",
    "CPU/stream",
    "RSS KiB/stream",
    "loadgen CPU",
)


def summary(result: dict[str, Any]) -> list[str]:
    systems = result["systems"]

    def held(name: str) -> str:
        run = systems[name]["max_held"]
        if run is None:
            return "none held"
        return (
            f"{run['streams']:,} streams ({run['cpu_pct_per_stream']}% of a core and "
            f"{run['rss_kib_per_stream']} KiB each)"
        )

    on_postgresql = (
        f"agentstream on PostgreSQL {held('agentstream-postgresql')}, ratio "
        f"{result['ratio_postgresql']}x"
        if "agentstream-postgresql" in systems
        else f"agentstream on PostgreSQL not measured ({result.get('skipped')})"
    )
    return [
        f"Largest N held at {result['rate']:.0f} tokens/s each, opened {STARTS_PER_S:.0f} "
        f"per second (ITL p99 <= {result['limit_ms']:.0f} ms, no errors, at least "
        f"{100 * DELIVERED:.0f}% of the window's tokens delivered): agentstream "
        f"{held('agentstream')}, ratio {result['ratio']}x; {on_postgresql}; baseline "
        f"{held('baseline')}.",
        f"Load generator: at most {result['loadgen_cpu_pct_max']}% of one core in any window "
        "(a separate process on uvloop; below 100% it was waiting on the server, not the "
        "other way round).",
    ]


def report(result: dict[str, Any]) -> str:
    title = "Concurrent streams at a realistic pace:"
    return "\n".join([title, text_table(HEADER, _rows(result)), *summary(result)])


def markdown(result: dict[str, Any]) -> str:
    return "\n\n".join([markdown_table(HEADER, _rows(result)), *summary(result)])
