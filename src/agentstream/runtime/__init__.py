"""The runtime: agent loop, tools and runs. It emits canonical events and knows nothing of HTTP."""
