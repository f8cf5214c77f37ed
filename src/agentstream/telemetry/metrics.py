"""The Prometheus metrics of a server process, with the official client (``prometheus_client``).

Metrics are the process's, as the client library keeps them (its default registry): one
server per process. With several worker processes (``serve --workers N``) each one writes
its values to files in ``PROMETHEUS_MULTIPROC_DIR`` (the client's multiprocess mode, which
``serve`` turns on), and ``/metrics`` of any worker adds up those of all of them.

Nothing here runs per token: a run is counted when it starts and ends, a model call's
tokens and cost when it ends (from the usage the provider reports), a stream when it opens
and closes, a store statement when it returns.
"""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

__all__ = [
    "CONTENT_TYPE_LATEST",
    "COST",
    "LIVE_STREAMS",
    "PROVIDER_ERRORS",
    "RUNLOG_SECONDS",
    "RUNS_ENDED",
    "RUNS_STARTED",
    "RUN_SECONDS",
    "STORE_SECONDS",
    "TIME_TO_FIRST_TOKEN",
    "TOKENS",
    "multiprocess_dir",
    "process_ended",
    "render",
]

_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Buckets for the store and the live log, whose operations take a fraction of a ms to s."""

RUNS_STARTED = Counter(
    "agentstream_runs_started",
    "Runs started (a paused run continued counts again), by kind: agent or workflow.",
    ["kind"],
)
RUNS_ENDED = Counter(
    "agentstream_runs_ended",
    "Runs ended, by kind and status: completed, paused (awaiting approval), error,"
    " timeout, cancelled, interrupted.",
    ["kind", "status"],
)
RUN_SECONDS = Histogram(
    "agentstream_run_duration_seconds",
    "How long runs took, from the start of their task to their recorded end.",
    ["kind", "status"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0),
)
LIVE_STREAMS = Gauge(
    "agentstream_live_streams",
    "Server-Sent Event responses open now.",
    multiprocess_mode="livesum",
)
TIME_TO_FIRST_TOKEN = Histogram(
    "agentstream_time_to_first_token_seconds",
    "From a model call to the first part of its answer (text, reasoning or a tool call).",
    ["model"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0),
)
TOKENS = Counter(
    "agentstream_tokens",
    "Tokens the models reported, by model and direction (input, output).",
    ["model", "direction"],
)
COST = Counter(
    "agentstream_cost_usd",
    "What model calls cost at the models' list prices, by model (calls of a model with no"
    " known price are not counted).",
    ["model"],
)
PROVIDER_ERRORS = Counter(
    "agentstream_provider_errors",
    "Model calls that failed, by model and kind (auth, rate_limit, ...: ProviderError.kind).",
    ["model", "kind"],
)
STORE_SECONDS = Histogram(
    "agentstream_store_seconds",
    "Statements on the database, by operation (select, insert, update, delete, other).",
    ["operation"],
    buckets=_LATENCY,
)
RUNLOG_SECONDS = Histogram(
    "agentstream_runlog_seconds",
    "Live log operations, by operation: sync (a run just started becomes followable from"
    " every process; at once in one process), write (a batch sent to Redis, cluster mode).",
    ["operation"],
    buckets=_LATENCY,
)


def multiprocess_dir() -> str | None:
    """Where the worker processes keep their values, in multiprocess mode."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def process_ended(pid: int) -> None:
    """In multiprocess mode: a worker process ended, its gauges no longer count."""
    if multiprocess_dir() is not None:
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


def render() -> bytes:
    """The metrics in Prometheus' text format: this process's, or in multiprocess mode
    those of every worker, added up."""
    if multiprocess_dir() is None:
        return generate_latest(REGISTRY)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return generate_latest(registry)
