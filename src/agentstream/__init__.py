"""agentstream: run AI agents and stream everything they do over Server-Sent Events."""
