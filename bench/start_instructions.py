"""Instructions a run start costs, counted by callgrind: ``python -m bench.start_instructions
[--starts N] [--store sqlite|postgresql|cluster] [REV ...]``.

A start is scenario 2's: a POST to the native run route of an agent whose model is paced
far apart, from the request to the frame of the run's first step (its ``step_started``), on
a SQLite file, through the app's ASGI interface in one process (``bench.paced_cpu``'s
``request``, no sockets). The starts go one after the other, after a warm-up, and stay
live: their models' first tokens are due long after the count. What it counts is the
request's way through the app, the run's record and its launch, the response's start and
the first frames, which is what opening 250 streams a second costs a process beside the
tokens of those already live. As with ``bench.instructions``, the count does not move with
the machine's load (a run start's CPU time does, by a fifth), so a change of a few percent
shows. Printed: the working tree and each ``REV`` (``git archive``). ``--store postgresql``
or ``cluster`` counts each on a PostgreSQL database of its own (and a Redis prefix),
as ``bench.services`` finds them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench import services
from bench.instructions import counted, counting, counts_table
from bench.loopback import BENCH_ROOT
from bench.paced_cpu import request
from bench.revisions import checked_out

STARTS = 200
WARM_UP = 40
FIRST_TOKEN_AFTER = 1000.0
"""Seconds: no model's token comes while anything is counted."""
PATH = "/api/agents/words/run/stream"
BODY = {"message": "Write 100000 words", "reasoning": False}


async def _count_starts(starts: int) -> None:
    """In the process under callgrind: ``starts`` starts counted, after the warm-up."""
    os.environ["AGENTSTREAM_OFFLINE_TOKEN_DELAY"] = str(FIRST_TOKEN_AFTER)
    from bench.servers import agentstream_app

    live: list[asyncio.Task[None]] = []  # kept: the streams stay open
    with tempfile.TemporaryDirectory() as data_dir:
        app = agentstream_app(Path(data_dir))
        running = app.router.lifespan_context(app)
        await running.__aenter__()
        key = {"apikey": (Path(data_dir) / "demo-key").read_text().strip()}

        async def start() -> None:
            step_started = asyncio.Event()

            def read(chunk: bytes) -> None:
                if b'"step_started"' in chunk:
                    step_started.set()

            live.append(asyncio.create_task(request(app, PATH, BODY, key, read)))
            await step_started.wait()
            await asyncio.sleep(0.005)  # the run's task gets to its model's first wait

        for _ in range(WARM_UP):
            await start()
        counting(True)
        for _ in range(starts):
            await start()
        counting(False)
        print(starts, flush=True)
    os._exit(0)  # ending the app and its streams is not what is measured


STORES = ("sqlite", "postgresql", "cluster")
STORE_SETTINGS = ("AGENTSTREAM_DATABASE_URL", "AGENTSTREAM_REDIS_URL", "AGENTSTREAM_REDIS_PREFIX")


@contextmanager
def _store(store: str) -> Iterator[dict[str, str]]:
    """The settings of one count's store: its own PostgreSQL database (and Redis prefix),
    as a count leaves its runs live: another process counted on the same database would
    find them orphaned and end them while it counts."""
    if store == "sqlite":
        yield {}
    elif store == "postgresql":
        with services.postgres_database() as url:
            yield {"AGENTSTREAM_DATABASE_URL": url}
    else:
        with services.cluster_environment() as environment:
            yield environment


def per_start(source: Path, starts: int, store: str) -> float:
    """Instructions per run start, agentstream imported from ``source``."""
    with _store(store) as env:
        total, _ = counted(source, "bench.start_instructions", "--one", str(starts), env=env)
    return total / starts


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        import uvloop

        uvloop.run(_count_starts(int(sys.argv[2])))
    parser = argparse.ArgumentParser(prog="python -m bench.start_instructions", description=__doc__)
    parser.add_argument("revisions", nargs="*", metavar="REV")
    parser.add_argument("--starts", type=int, default=STARTS)
    parser.add_argument(
        "--store",
        choices=STORES,
        default="sqlite",
        help="a SQLite file (the default), PostgreSQL, or cluster mode (PostgreSQL and Redis)",
    )
    options = parser.parse_args()
    for setting in (
        "AGENTSTREAM_DATABASE_URL",
        "AGENTSTREAM_REDIS_URL",
        "AGENTSTREAM_REDIS_PREFIX",
    ):
        os.environ.pop(setting, None)  # the store is ``--store``'s, whatever is exported
    cluster = options.store == "cluster"
    if options.store != "sqlite" and (missing := services.unavailable(cluster=cluster)):
        sys.exit(missing)
    rows = [("working tree", per_start(BENCH_ROOT, options.starts, options.store))]
    for revision in options.revisions:
        with checked_out(revision) as source:
            rows.append((revision, per_start(source, options.starts, options.store)))
    title = f"Instructions per run start on {options.store}, {options.starts} counted"
    print(counts_table(title, ("agentstream", "instructions", "to the working tree"), rows))


if __name__ == "__main__":
    main()
