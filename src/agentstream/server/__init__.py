"""The HTTP server: an ASGI app with one router module per surface."""

from agentstream.server.app import check_config, create_app

__all__ = ["check_config", "create_app"]
