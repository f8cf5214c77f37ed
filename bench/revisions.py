"""Scenario 1's stream, a revision against the working tree: ``python -m bench.revisions REV
[ROUNDS] [TOKENS]``.

Both servers run at once, each from its own source (``REV`` from ``git archive`` into a
scratch folder), and take turns streaming the same 10,000 tokens, so that drift in the
machine's load hits both alike. Besides tokens per second it counts the server's CPU time
per stream (user and system, from ``/proc``): on a machine shared with other work, CPU
time moves much less than wall-clock time, so it shows a change of a few percent that
tokens per second hides in noise.

With ``TOKENS`` small (``1``: what starting a run costs, scenario 2's ramp), each turn is
``SHORT_RUNS`` runs back to back, and the figures are per run; ``--clients N`` sends them
from N clients at once (what a busy process's pools see). ``--postgresql``: each server on
a PostgreSQL database made for it (``bench.services``) instead of its SQLite file.
"""

from __future__ import annotations

import argparse
import io
import statistics
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

from bench.loopback import Server, cpu_seconds, post_stream, server_process
from bench.services import postgres_database

TOKENS = 10_000
SHORT_RUNS = 100
"""Runs per turn when each streams fewer than 1,000 tokens."""
PATH = "/api/agents/demo/run/stream"


@contextmanager
def checked_out(revision: str) -> Iterator[Path]:
    """A folder holding ``revision``'s ``src`` (``git archive``), for the block."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", revision, "src"], check=True, capture_output=True
    ).stdout
    with tempfile.TemporaryDirectory() as folder, tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
        yield Path(folder)


def compare(
    revision: str, rounds: int, tokens: int, *, clients: int = 1, postgresql: bool = False
) -> dict[str, dict[str, float]]:
    request = f'{{"message": "Write {tokens} words", "reasoning": false}}'.encode()
    runs = 1 if tokens >= 1000 else SHORT_RUNS
    with (
        checked_out(revision) as source,
        tempfile.TemporaryDirectory() as before_data,
        tempfile.TemporaryDirectory() as after_data,
        ExitStack() as databases,
    ):

        def store() -> dict[str, str]:
            if not postgresql:
                return {}
            return {"AGENTSTREAM_DATABASE_URL": databases.enter_context(postgres_database())}

        with (
            server_process("agentstream", before_data, env=store(), source=source) as before,
            server_process("agentstream", after_data, env=store()) as after,
            ThreadPoolExecutor(clients) as senders,
        ):
            servers = {revision: (before, before_data), "working tree": (after, after_data)}
            cpu: dict[str, list[float]] = {name: [] for name in servers}
            rate: dict[str, list[float]] = {name: [] for name in servers}

            def stream(server: Server, data: str) -> float:
                key = {"apikey": (Path(data) / "demo-key").read_text().strip()}
                timings = list(
                    senders.map(lambda _: post_stream(server.port, PATH, request, key), range(runs))
                )
                return sum(t.frames for t in timings) / sum(t.total for t in timings)

            for server, data in servers.values():
                stream(server, data)  # warm-up
            for turn in range(rounds):
                order = list(servers) if turn % 2 == 0 else list(servers)[::-1]
                for name in order:
                    server, data = servers[name]
                    spent = cpu_seconds(server.pid)
                    rate[name].append(stream(server, data))
                    cpu[name].append((cpu_seconds(server.pid) - spent) / runs)
    return {
        name: {
            "cpu_ms": 1000 * statistics.median(cpu[name]),
            "frames_per_s": statistics.median(rate[name]),
        }
        for name in cpu
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.revisions", description=__doc__)
    parser.add_argument("revision")
    parser.add_argument("rounds", nargs="?", type=int, default=16)
    parser.add_argument("tokens", nargs="?", type=int, default=TOKENS)
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--postgresql", action="store_true")
    args = parser.parse_args()
    result = compare(
        args.revision, args.rounds, args.tokens, clients=args.clients, postgresql=args.postgresql
    )
    store = "PostgreSQL" if args.postgresql else "SQLite"
    print(
        f"runs of {args.tokens:,} tokens on {store} from {args.clients} client(s), "
        f"median of {args.rounds} turns each, taking turns"
    )
    print(f"{'source':>14}  {'server CPU per run':>19}  {'frames/s':>9}")
    for name, figures in result.items():
        print(f"{name:>14}  {figures['cpu_ms']:>16.2f} ms  {figures['frames_per_s']:>9,.0f}")


if __name__ == "__main__":
    main()
