"""The systems measured, each a server process and the request that streams N tokens."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.loopback import Server, Timing, post_stream, server_process
from bench.peers import pydantic_ai_request
from bench.services import cluster_environment, postgres_database

NAMES = ("agentstream", "agentstream-postgresql", "baseline", "pydantic-ai", "langgraph")


@dataclass(frozen=True)
class Target:
    name: str
    server: Server
    path: str
    body: str
    """The JSON request body, with ``{tokens}`` standing for the token count."""
    headers: dict[str, str]

    def stream(self, tokens: int) -> Timing:
        body = self.body.replace("{tokens}", str(tokens)).encode()
        return post_stream(self.server.port, self.path, body, self.headers)


PROMPT = "Write {tokens} words"


@contextmanager
def start(name: str, *, token_delay: float, source: Path | None = None) -> Iterator[Target]:
    """The named system, its model pacing tokens ``token_delay`` seconds apart; agentstream
    from the checkout ``source`` if given (``loopback.server_process``)."""
    if name in ("agentstream", "agentstream-postgresql"):
        postgresql = name == "agentstream-postgresql"
        with start_agentstream(
            1, token_delay=token_delay, postgresql=postgresql, source=source
        ) as (target,):
            yield target
    elif name == "baseline":
        with server_process(name) as server:
            body = '{"tokens": {tokens}, "delay": ' + repr(token_delay) + "}"
            yield Target(name, server, "/paced", body, {})
    elif name == "pydantic-ai":
        with server_process(name, str(token_delay)) as server:
            yield Target(name, server, "/api/chat", json.dumps(pydantic_ai_request(PROMPT)), {})
    elif name == "langgraph":
        with server_process(name, str(token_delay)) as server:
            yield Target(name, server, "/stream", json.dumps({"message": PROMPT}), {})
    else:
        raise ValueError(f"unknown target {name!r}")


@contextmanager
def start_agentstream(
    processes: int,
    *,
    token_delay: float,
    cluster: bool = False,
    postgresql: bool = False,
    source: Path | None = None,
) -> Iterator[list[Target]]:
    """agentstream in ``processes`` server processes, started one after the other: the
    embedded default (SQLite, one process), one process on a ``postgresql`` database, or
    ``cluster`` mode (one PostgreSQL database and one Redis prefix for all,
    ``bench.services``). They share a data directory, so the demo
    key the first one makes is every one's (in cluster mode it is in the shared database)."""
    assert cluster or processes == 1, "processes that share runs are cluster mode"
    with tempfile.TemporaryDirectory() as data_dir, ExitStack() as stack:
        env = {"AGENTSTREAM_OFFLINE_TOKEN_DELAY": str(token_delay)}
        if cluster:
            env |= stack.enter_context(cluster_environment())
        elif postgresql:
            env["AGENTSTREAM_DATABASE_URL"] = stack.enter_context(postgres_database())
        servers = [
            stack.enter_context(server_process("agentstream", data_dir, env=env, source=source))
            for _ in range(processes)
        ]
        key = (Path(data_dir) / "demo-key").read_text().strip()
        body = json.dumps({"message": PROMPT, "reasoning": False})
        path = "/api/agents/words/run/stream"
        yield [Target("agentstream", server, path, body, {"apikey": key}) for server in servers]
