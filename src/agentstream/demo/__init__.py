"""The demo: an agent on the offline model, with the built-in tools."""
