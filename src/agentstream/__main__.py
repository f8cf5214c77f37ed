"""``python -m agentstream``: the CLI, where the console script is not on PATH."""

from agentstream.cli import app

app(prog_name="agentstream")
