"""The systems measured, each a server process and the request that streams N tokens."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.loopback import Server, Timing, post_stream, server_process
from bench.peers import pydantic_ai_request

NAMES = ("agentstream", "baseline", "pydantic-ai", "langgraph")


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


@contextmanager
def start(name: str, *, token_delay: float) -> Iterator[Target]:
    """The named system, its model pacing tokens ``token_delay`` seconds apart."""
    prompt = "Write {tokens} words"
    if name == "agentstream":
        with (
            tempfile.TemporaryDirectory() as data_dir,
            server_process(
                name, data_dir, env={"AGENTSTREAM_OFFLINE_TOKEN_DELAY": str(token_delay)}
            ) as server,
        ):
            key = (Path(data_dir) / "demo-key").read_text().strip()
            body = json.dumps({"message": prompt, "reasoning": False})
            yield Target(name, server, "/api/agents/words/run/stream", body, {"apikey": key})
    elif name == "baseline":
        with server_process(name) as server:
            body = '{"tokens": {tokens}, "delay": ' + repr(token_delay) + "}"
            yield Target(name, server, "/paced", body, {})
    elif name == "pydantic-ai":
        with server_process(name, str(token_delay)) as server:
            yield Target(name, server, "/api/chat", json.dumps(pydantic_ai_request(prompt)), {})
    elif name == "langgraph":
        with server_process(name, str(token_delay)) as server:
            yield Target(name, server, "/stream", json.dumps({"message": prompt}), {})
    else:
        raise ValueError(f"unknown target {name!r}")
