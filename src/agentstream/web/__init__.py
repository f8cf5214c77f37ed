"""The hosted web UI: static files, no build step."""
