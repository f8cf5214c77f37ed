"""agentstream: run AI agents and stream everything they do over Server-Sent Events."""

from importlib.metadata import version

from agentstream.agents import AgentSpec
from agentstream.client import AsyncClient, Client, RunResult
from agentstream.config import Settings
from agentstream.errors import AgentstreamError, APIStatusError, ProviderError, UserError
from agentstream.runtime.tools import Tool, tool
from agentstream.server.app import create_app
from agentstream.sse import ServerSentEvent, SSEDecoder

__version__ = version("agentstream")

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
