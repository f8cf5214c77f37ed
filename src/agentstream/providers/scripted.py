"""A model driven by a Python function: the deterministic fake for tests of exact streams."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Iterable

from agentstream.providers.base import ModelPart, ModelRequest

__all__ = ["ScriptedModel"]


class ScriptedModel:
    """Streams the parts ``script(request)`` returns, ``delay`` seconds apart."""

    def __init__(
        self,
        name: str,
        script: Callable[[ModelRequest], Iterable[ModelPart]],
        *,
        delay: float = 0.0,
    ) -> None:
        self.name = name
        self.script = script
        self.delay = delay
        self.open_streams = 0
        """Streams started and not yet closed: 0 after a cancel proves the stream was closed."""

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelPart, None]:
        self.open_streams += 1
        try:
            for part in self.script(request):
                await asyncio.sleep(self.delay)
                yield part
        finally:
            self.open_streams -= 1
