"""The HTTP server: an ASGI app with one router module per surface."""

from agentstream.server.app import create_app

__all__ = ["create_app"]
