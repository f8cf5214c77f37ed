"""Scenario 4: replaying a finished run, and what a run costs the database.

Replay: a run of 1,000 persisted events (one turn of 497 tool calls, their results and the
run's lifecycle), read back as its native stream (``GET /api/agents/runs/{id}/stream``)
and as JSON (``GET /api/agents/runs/{id}``), with the run log's retention at 0 so both come
from the store. Baseline: a bare endpoint that selects the same rows with ``sqlite3`` and
writes them as SSE, the least any replay can do.

Database statements per run, counted in the server as the ``sqlite3`` driver is sent them
(``bench.servers``; an ``executemany`` one), for runs of 10, 1,000 and 10,000 tokens: they
must not grow with the tokens, since token deltas are forwarded-only.
"""

from __future__ import annotations

import json
import re
import statistics
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from bench.loopback import Timing, dechunk, post_stream, server_process
from bench.tables import markdown_table, text_table

TOKEN_COUNTS = (10, 1_000, 10_000)
WRITES = ("INSERT", "UPDATE", "DELETE")


def _median_ms(timings: list[Timing]) -> float:
    return round(statistics.median(t.total for t in timings) * 1000, 2)


def measure(quick: bool = False) -> dict[str, Any]:
    repeats = 5 if quick else 20
    env = {"AGENTSTREAM_RUN_RETENTION_SECONDS": "0"}
    with (
        tempfile.TemporaryDirectory() as data_dir,
        server_process("agentstream", data_dir, env=env) as ours,
        server_process("baseline") as base,
    ):
        key = {"apikey": (Path(data_dir) / "demo-key").read_text().strip()}

        def get(server_port: int, path: str) -> Timing:
            return post_stream(server_port, path, b"", key, method="GET")

        def sql() -> Counter[str]:
            return Counter(json.loads(get(ours.port, "/bench/sql").body))

        def run(agent: str, message: str) -> str:
            body = json.dumps({"message": message, "reasoning": False}).encode()
            timing = post_stream(ours.port, f"/api/agents/{agent}/run/stream", body, key)
            found = re.search(rb'"run_id":"(\w+)"', timing.body)
            assert found, "no run id in the stream"
            return found.group(1).decode()

        run_id = run("tools", "Call the calculator")
        persisted = len(json.loads(get(ours.port, f"/api/agents/runs/{run_id}").body)["events"])
        stream_path = f"/api/agents/runs/{run_id}/stream?after=0"
        replayed = get(ours.port, stream_path)
        assert dechunk(replayed.body).count(b"data: ") == persisted, "replay is incomplete"
        db = Path(data_dir) / "agentstream.db"
        replays, jsons, bases = [], [], []
        for _ in range(repeats):
            replays.append(get(ours.port, stream_path))
            jsons.append(get(ours.port, f"/api/agents/runs/{run_id}"))
            bases.append(get(base.port, f"/replay?db={db}&run={run_id}"))

        statements = {}
        for tokens in TOKEN_COUNTS:
            before = sql()
            run("demo", f"Write {tokens} words")
            counted = sql() - before
            statements[tokens] = {
                "writes": sum(counted[verb] for verb in WRITES),
                "selects": counted["SELECT"],
                "total": sum(counted.values()),
            }
    writes = [statements[tokens]["writes"] for tokens in TOKEN_COUNTS]
    return {
        "persisted_events": persisted,
        "replay_stream_ms": _median_ms(replays),
        "replay_json_ms": _median_ms(jsons),
        "baseline_replay_ms": _median_ms(bases),
        "replay_ratio": round(_median_ms(replays) / _median_ms(bases), 2),
        "statements": {str(tokens): counts for tokens, counts in statements.items()},
        "writes_grow_with_tokens": writes[-1] > writes[0],
    }


def _rows(r: dict[str, Any]) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
    replay: list[tuple[str, ...]] = [
        ("agentstream: native stream", f"{r['replay_stream_ms']}", f"{r['replay_ratio']}x"),
        ("agentstream: run JSON", f"{r['replay_json_ms']}", ""),
        ("baseline: rows as SSE", f"{r['baseline_replay_ms']}", "1x"),
    ]
    writes: list[tuple[str, ...]] = [
        (f"{int(tokens):,}", f"{c['writes']}", f"{c['selects']}", f"{c['total']}")
        for tokens, c in r["statements"].items()
    ]
    return replay, writes


REPLAY_HEADER = ("replay of a finished run", "median ms", "ratio")
WRITES_HEADER = ("tokens in the run", "writes", "selects", "all statements")


def _summary(r: dict[str, Any]) -> str:
    grows = "grow" if r["writes_grow_with_tokens"] else "do not grow"
    return (
        f"Replay of a run with {r['persisted_events']:,} persisted events; database writes "
        f"per run {grows} with the number of tokens."
    )


def report(result: dict[str, Any]) -> str:
    replay, writes = _rows(result)
    return "\n".join(
        [_summary(result), text_table(REPLAY_HEADER, replay), text_table(WRITES_HEADER, writes)]
    )


def markdown(result: dict[str, Any]) -> str:
    replay, writes = _rows(result)
    return "\n\n".join(
        [
            _summary(result),
            markdown_table(REPLAY_HEADER, replay),
            markdown_table(WRITES_HEADER, writes),
        ]
    )
