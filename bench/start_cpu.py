"""The CPU a run start costs a server process over sockets, beside the baseline's: ``python -m
bench.start_cpu [--starts N] [--rounds R]``.

Scenario 2 opens its streams ``STARTS_PER_S`` a second, and the CPU their starts take is
CPU the tokens of the streams already live do not get: where in the ramp a process runs out
of core (the starts' share and the live streams' together) decides its time to first token
at a step. ``bench.start_instructions`` counts a start's instructions inside the app; this
takes what the whole server process spends on one, connection and all, as scenario 2 opens
them. Each system's server (agentstream on SQLite, on PostgreSQL where one answers, the bare
baseline) gets ``STARTS`` streams opened at scenario 2's pace, whose first token is due long
after; its CPU over the ramp (``/proc``), less what it spends idle, is divided by the starts.
The systems take turns, round after round; printed: each one's median over the rounds, its
ratio to the baseline's, and the share of a core the starts take at that pace.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from bench import services
from bench.concurrency import STARTS_PER_S
from bench.loadgen import load
from bench.loopback import cpu_seconds
from bench.tables import text_table
from bench.targets import Target, start

STARTS = 500
ROUNDS = 3
FIRST_TOKEN_AFTER = 10.0
"""Seconds from a start to its model's token: none comes while the ramp is measured."""
SETTLE = 1.5
"""Seconds after the ramp still measured: the generator's own start, and the last starts'
way to their first frames."""
SYSTEMS = ("agentstream", "agentstream-postgresql", "baseline")


def cpu_a_start(target: Target, starts: int) -> float:
    """Seconds of the server process's CPU a start, ``starts`` of them opened at scenario 2's
    pace; each stream asks for one token."""
    load(target, streams=20, ramp=0.1, hold=0.1, rate=0.01)  # first requests' imports, caches
    idle_from = cpu_seconds(target.server.pid)
    time.sleep(1.0)
    idle = cpu_seconds(target.server.pid) - idle_from
    ramp = starts / STARTS_PER_S
    opening = threading.Thread(
        target=load,
        args=(target,),
        kwargs={"streams": starts, "ramp": ramp, "hold": 0.1, "rate": 0.01},
    )
    before = cpu_seconds(target.server.pid)
    opening.start()
    time.sleep(ramp + SETTLE)
    spent = cpu_seconds(target.server.pid) - before - idle * (ramp + SETTLE)
    opening.join()  # the streams end after their token
    return spent / starts


def measure(starts: int, rounds: int) -> dict[str, list[float]]:
    """Each system's CPU a start (seconds), a figure a round, the systems taking turns."""
    skipped = services.unavailable()
    systems = [name for name in SYSTEMS if not (name == "agentstream-postgresql" and skipped)]
    figures: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(rounds):
        for name in systems:
            with start(name, token_delay=FIRST_TOKEN_AFTER) as target:
                figures[name].append(cpu_a_start(target, starts))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.start_cpu", description=__doc__)
    parser.add_argument("--starts", type=int, default=STARTS)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    options = parser.parse_args()
    figures = measure(options.starts, options.rounds)
    medians = {name: statistics.median(each) for name, each in figures.items()}
    rows = [
        (
            name,
            f"{1000 * median:.3f}",
            " ".join(f"{1000 * each:.3f}" for each in figures[name]),
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
