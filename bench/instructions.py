"""Instructions a paced token costs, counted by callgrind: ``python -m bench.instructions
[--streams N] [--rate R] [--window S] [REV ...]``.

CPU time per token moves by a fifth from run to run on a shared machine (``bench.paced_cpu``),
which hides a change of a few percent. An instruction count does not move: valgrind's
callgrind counts what the process executes, whatever else the machine does (the same total
within 0.3% from run to run here). Each variant runs ``bench.paced_cpu``'s load in a process
of its own under callgrind with counting off (``STREAMS`` streams at ``RATE`` tokens/s
through the app's ASGI interface, no sockets); past the warm-up the process turns counting
on for ``WINDOW`` seconds (``callgrind_control``) and counts the frames sent meanwhile.

Printed, instructions per frame: the bare Starlette baseline, the working tree, each
``REV`` (``git archive``), and ``bench.paced_cpu``'s knock-out variants on the working tree
(what the frames, and the live log with the response's task, cost). With ``--cluster``, also
the working tree in cluster mode and its knock-outs (``bench.paced_cpu.CLUSTER_VARIANTS``;
PostgreSQL and Redis as ``bench.services`` finds them): what a cluster process adds to a
token, and where. A count is not a time:
a system call or a cache miss costs more than its instructions say, so the ratio to the
baseline here is not scenario 2's CPU ratio. It tells whether a change made a token's way
cheaper, and by how much. Needs valgrind (Debian's package).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import services
from bench.loopback import BENCH_ROOT
from bench.paced_cpu import CLUSTER_VARIANTS, VARIANTS, paced
from bench.revisions import checked_out
from bench.tables import text_table

STREAMS = 20
RATE = 20.0
"""Low enough that the process keeps up while it is counted (30 to 50 times slower)."""
WINDOW = 10.0
KEPT_UP = 0.95
"""Of the frames due in the window, the share that must have gone out: a process that
falls behind sends tokens in bursts, several a ``send``, and a frame looks cheaper."""

_TOTALS = re.compile(rb"^totals: (\d+)", re.MULTILINE)


def counting(on: bool) -> None:
    """Turn callgrind's counting in this process on or off. It blocks the event loop on
    purpose: the count starts and stops where the loop stands, with no frame sent between."""
    switch = f"--instr={'on' if on else 'off'}"
    subprocess.run(["callgrind_control", switch, str(os.getpid())], check=True, capture_output=True)


async def _count_frames(variant: str, streams: int, rate: float, window: float) -> None:
    """In the process under callgrind: count instructions over the window, print the frames."""
    async with paced(variant, streams, rate) as frames:
        counting(True)
        before = frames[0]
        await asyncio.sleep(window)
        counting(False)
        print(frames[0] - before, flush=True)
    os._exit(0)  # ending the app and its streams is not what is measured


def per_frame(
    variant: str,
    source: Path,
    streams: int,
    rate: float,
    window: float,
    env: dict[str, str] | None = None,
) -> float:
    """Instructions per frame of ``variant``, agentstream imported from ``source``, with
    ``env`` beside this process's environment."""
    load = (str(value) for value in (streams, rate, window))
    total, printed = counted(source, "bench.instructions", "--one", variant, *load, env=env)
    frames = int(printed.split()[-1])
    if frames < KEPT_UP * streams * rate * window:
        raise RuntimeError(f"{variant}: {frames} frames, the process fell behind its pace")
    return total / frames


def counted(
    source: Path, module: str, *args: str, env: dict[str, str] | None = None
) -> tuple[int, str]:
    """``python -m module *args`` under callgrind, agentstream imported from ``source``,
    counting off until the process turns it on (``counting``): the instructions counted,
    and what it printed. Exits with a readable line without valgrind."""
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (Debian: apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as scratch:
        counts = Path(scratch) / "callgrind.out"
        env = (
            os.environ
            | (env or {})
            | {
                "PYTHONPATH": os.pathsep.join([str(source / "src"), str(BENCH_ROOT)]),
                "PYTHONHASHSEED": "0",
            }
        )
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={counts}",
                *(sys.executable, "-m", module, *args),
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        totals = _TOTALS.search(counts.read_bytes()) if counts.exists() else None
        if done.returncode or totals is None or not done.stdout.strip():
            raise RuntimeError(f"{module} {' '.join(args)}: nothing counted\n{done.stderr[-2000:]}")
        return int(totals.group(1)), done.stdout


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        import uvloop

        variant, streams, rate, window = sys.argv[2:6]
        uvloop.run(_count_frames(variant, int(streams), float(rate), float(window)))
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__)
    parser.add_argument("revisions", nargs="*", metavar="REV")
    parser.add_argument("--streams", type=int, default=STREAMS)
    parser.add_argument("--rate", type=float, default=RATE)
    parser.add_argument("--window", type=float, default=WINDOW)
    parser.add_argument("--cluster", action="store_true", help="also in cluster mode")
    options = parser.parse_args()
    if options.cluster and (missing := services.unavailable()) is not None:
        sys.exit(missing)
    load = (options.streams, options.rate, options.window)
    tree = BENCH_ROOT
    rows: list[tuple[str, float]] = [("baseline", per_frame("baseline", tree, *load))]
    rows.append(("agentstream (working tree)", per_frame("agentstream", tree, *load)))
    for revision in options.revisions:
        with checked_out(revision) as source:
            rows.append((f"agentstream ({revision})", per_frame("agentstream", source, *load)))
    for variant in VARIANTS[2:]:
        rows.append((f"{variant} (working tree)", per_frame(variant, tree, *load)))
    for variant in CLUSTER_VARIANTS if options.cluster else ():
        with services.cluster_environment() as cluster:
            rows.append((f"{variant} (working tree)", per_frame(variant, tree, *load, cluster)))
    title = (
        f"Instructions per paced token, {options.streams} streams at {options.rate:g} tokens/s,"
        f" {options.window:g} s counted"
    )
    print(counts_table(title, ("variant", "instructions", "ratio"), rows))


def counts_table(title: str, header: tuple[str, str, str], rows: list[tuple[str, float]]) -> str:
    """``rows`` of a name and its instructions, each with its ratio to the first row's."""
    base = rows[0][1]
    shown = [(name, f"{count:,.0f}", f"{count / base:.2f}x") for name, count in rows]
    return f"{title}\n{text_table(header, shown)}"


if __name__ == "__main__":
    main()
