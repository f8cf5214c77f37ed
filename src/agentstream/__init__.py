"""agentstream: run AI agents and stream everything they do over Server-Sent Events.

The names below load on first use (PEP 562), so ``import agentstream.client`` costs the
client alone: no server, ORM or numpy.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentstream.agents import AgentSpec
    from agentstream.client import AsyncClient, Client, RunResult
    from agentstream.config import Settings
    from agentstream.errors import AgentstreamError, APIStatusError, ProviderError, UserError
    from agentstream.runtime.tools import Tool, tool
    from agentstream.server.app import create_app
    from agentstream.sse import ServerSentEvent, SSEDecoder

__version__ = version("agentstream")

_HOMES = {
    "APIStatusError": "agentstream.errors",
    "AgentSpec": "agentstream.agents",
    "AgentstreamError": "agentstream.errors",
    "AsyncClient": "agentstream.client",
    "Client": "agentstream.client",
    "ProviderError": "agentstream.errors",
    "RunResult": "agentstream.client",
    "SSEDecoder": "agentstream.sse",
    "ServerSentEvent": "agentstream.sse",
    "Settings": "agentstream.config",
    "Tool": "agentstream.runtime.tools",
    "UserError": "agentstream.errors",
    "create_app": "agentstream.server.app",
    "tool": "agentstream.runtime.tools",
}
"""Each public name and the module it lives in."""

__all__ = [
    "APIStatusError",
    "AgentSpec",
    "AgentstreamError",
    "AsyncClient",
    "Client",
    "ProviderError",
    "RunResult",
    "SSEDecoder",
    "ServerSentEvent",
    "Settings",
    "Tool",
    "UserError",
    "__version__",
    "create_app",
    "tool",
]


def __getattr__(name: str) -> Any:
    if (home := _HOMES.get(name)) is None:
        raise AttributeError(f"module 'agentstream' has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
