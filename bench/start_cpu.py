"""The CPU a run start costs a server process over sockets, beside the baseline's: ``python -m
bench.start_cpu [--starts N] [--rounds R]``.

Scenario 2 opens its streams ``STARTS_PER_S`` a second, and the CPU their starts take is
CPU the tokens of the streams already live do not get: where in the ramp a process runs out
of core (the starts' share and the live streams' together) decides its time to first token
at a step. ``bench.start_instructions`` counts a start's instructions inside the app; this
takes what the whole server process spends on one, connection and all, as scenario 2 opens
them. Each system's server (agentstream on SQLite, on PostgreSQL where one answers, the bare
baseline) gets ``STARTS`` streams opened at scenario 2's pace, whose first token is due long
after; its CPU over the ramp and a few seconds more (``/proc``), less what it spends idle
over as long, is divided by the starts. The systems take turns, round after round; printed:
each one's median over the rounds, its ratio to the baseline's, and the share of a core the
starts take at that pace.
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from bench import services
from bench.concurrency import STARTS_PER_S
from bench.loadgen import load
from bench.loopback import cpu_seconds
from bench.tables import text_table
from bench.targets import Target, start

STARTS = 500
ROUNDS = 3
SETTLE = 4.0
"""Seconds after the ramp still measured: the generator's own start-up (a quarter of a
second), and the last starts' way to their first frames."""
SYSTEMS = ("agentstream", "agentstream-postgresql", "baseline")


def cpu_a_start(target: Target, starts: int) -> float:
    """Seconds of the server process's CPU a start, ``starts`` of them opened at scenario 2's
    pace. Its CPU while idle is read first, over as long a time as the starts': ``/proc``
    counts in ticks of 10 ms, and a lease round every few seconds falls in one or not."""
    pid = target.server.pid
    _opened(target, 20)  # the first requests' imports and caches
    time.sleep(1.0)  # what the warm-up's runs do as they end
    window = starts / STARTS_PER_S + SETTLE
    idle_from = cpu_seconds(pid)
    time.sleep(window)
    idle = cpu_seconds(pid) - idle_from
    with ThreadPoolExecutor(1) as pool:
        before = cpu_seconds(pid)
        opening = pool.submit(_opened, target, starts)
        time.sleep(window)
        spent = cpu_seconds(pid) - before - idle
        opening.result()  # the streams end after their token; a failed one raises here
    return spent / starts


def _opened(target: Target, streams: int) -> None:
    """``streams`` streams of one token opened at scenario 2's pace, until they have ended;
    raises if one failed (a start that fails costs less than one that streams)."""
    result = load(target, streams=streams, ramp=streams / STARTS_PER_S, hold=0.1, rate=0.01)
    if result["errors"]:
        raise RuntimeError(f"streams failed: {result['error_kinds']}")


def measure(starts: int, rounds: int, systems: list[str]) -> dict[str, list[float]]:
    """Each system's CPU a start (seconds), a figure a round, the systems taking turns. A
    model's first token is due after the window, so none is in it."""
    first_token_after = starts / STARTS_PER_S + SETTLE + 5.0
    figures: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(rounds):
        for name in systems:
            with start(name, token_delay=first_token_after) as target:
                figures[name].append(cpu_a_start(target, starts))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.start_cpu", description=__doc__)
    parser.add_argument("--starts", type=int, default=STARTS)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    options = parser.parse_args()
    if options.starts < 1 or options.rounds < 1:
        parser.error("--starts and --rounds take a number from 1")
    systems = list(SYSTEMS)
    if (missing := services.unavailable(cluster=False)) is not None:
        print(f"agentstream-postgresql: not measured ({missing})")
        systems.remove("agentstream-postgresql")
    figures = measure(options.starts, options.rounds, systems)
    medians = {name: statistics.median(each) for name, each in figures.items()}
    rows = [
        (
            name,
            f"{1000 * median:.2f}",
            " ".join(f"{1000 * each:.2f}" for each in figures[name]),
            f"{median / medians['baseline']:.2f}x",
            f"{100 * median * STARTS_PER_S:.0f}%",
        )
        for name, median in medians.items()
    ]
    print(
        f"Server CPU a run start over sockets, {options.starts} opened {STARTS_PER_S:g} a second,"
        f" {options.rounds} rounds taking turns"
    )
    header = ("system", "ms a start", "each round", "to the baseline", "of a core at that pace")
    print(text_table(header, rows))


if __name__ == "__main__":
    main()
