"""Workflow engine overhead per block: a 200-block chain and a 200-block fan-out of no-op
function blocks, beside plain asyncio doing the same awaits (one per block; sequential for
the chain, ``gather`` for the fan-out).

What the engine adds per block: its events (started, output, completed; stamped, in seq
order, through a sink that keeps them), reference bookkeeping, and a task per block.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from agentstream.events import BaseEvent
from agentstream.runtime.context import RunContext
from agentstream.workflows import WorkflowEngine, parse_workflow
from agentstream.workflows.definition import Workflow

BLOCKS = 200
REPEATS = 21


async def noop() -> None:
    """The work of every block, and of every step of the baseline."""
    await asyncio.sleep(0)


def chain() -> Workflow:
    blocks = [{"id": f"b{i}", "type": "function", "function": "noop"} for i in range(BLOCKS)]
    edges = [("start", "b0")] + [(f"b{i}", f"b{i + 1}") for i in range(BLOCKS - 1)]
    return _workflow("chain", blocks, edges)


def fan_out() -> Workflow:
    blocks = [{"id": f"b{i}", "type": "function", "function": "noop"} for i in range(BLOCKS)]
    return _workflow("fan-out", blocks, [("start", f"b{i}") for i in range(BLOCKS)])


def _workflow(name: str, blocks: list[dict[str, Any]], edges: list[tuple[str, str]]) -> Workflow:
    return parse_workflow(
        {
            "id": name,
            "blocks": [{"id": "start", "type": "start"}, *blocks],
            "edges": [{"from": a, "to": b} for a, b in edges],
        }
    )


async def baseline_chain() -> None:
    for _ in range(BLOCKS):
        await noop()


async def baseline_fan_out() -> None:
    await asyncio.gather(*(noop() for _ in range(BLOCKS)))


async def _median_seconds(run: Callable[[], Awaitable[Any]]) -> float:
    await run()  # warm-up
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        await run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


async def _measure() -> dict[str, Any]:
    engine = WorkflowEngine(functions={"noop": noop})
    kept: list[BaseEvent] = []

    async def sink(events: Sequence[BaseEvent]) -> None:
        kept.extend(events)

    def executing(workflow: Workflow) -> Callable[[], Awaitable[Any]]:
        async def run() -> None:
            kept.clear()
            result = await engine.execution(workflow, RunContext("wfx_bench", sink=sink)).run()
            assert result.status == "completed", result

        return run

    shapes = {
        "chain": (chain(), baseline_chain),
        "fan-out": (fan_out(), baseline_fan_out),
    }
    result: dict[str, Any] = {}
    for name, (workflow, baseline) in shapes.items():
        engine_s = await _median_seconds(executing(workflow))
        baseline_s = await _median_seconds(baseline)
        result[name] = {
            "engine_us_per_block": round(engine_s / BLOCKS * 1e6, 1),
            "baseline_us_per_block": round(baseline_s / BLOCKS * 1e6, 1),
            "overhead_us_per_block": round((engine_s - baseline_s) / BLOCKS * 1e6, 1),
            "ratio": round(engine_s / baseline_s, 1),
            "events": len(kept),
        }
    return result


def measure() -> dict[str, Any]:
    return asyncio.run(_measure())


def report(result: dict[str, Any]) -> str:
    lines = [
        f"Workflow engine, {BLOCKS} no-op function blocks, median of {REPEATS}:",
        f"  {'shape':<8} {'engine µs/block':>16} {'asyncio µs/block':>17} "
        f"{'overhead µs/block':>18} {'ratio':>6} {'events':>7}",
    ]
    for name, row in result.items():
        lines.append(
            f"  {name:<8} {row['engine_us_per_block']:>16} {row['baseline_us_per_block']:>17} "
            f"{row['overhead_us_per_block']:>18} {row['ratio']:>5}x {row['events']:>7}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(measure()))
