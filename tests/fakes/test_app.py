"""The app the tests run in processes of their own (crash, SIGTERM, cluster): the demo app
with a slow tool, and agents whose streams are long enough to join, follow and cut."""

from __future__ import annotations

import anyio
from fastapi import FastAPI

from agentstream.agents import AgentSpec
from agentstream.config import Settings
from agentstream.providers.base import (
    ModelPart,
    ModelRequest,
    TextPart,
    ToolCallArgsPart,
    ToolCallEndPart,
    ToolCallStartPart,
    TurnEndPart,
)
from agentstream.providers.scripted import ScriptedModel
from agentstream.runtime.tools import Tool
from agentstream.server import create_app

__all__ = ["COUNTED", "create"]

COUNTED = 60
"""Tokens the ``counter`` agent streams, ``TOKEN_DELAY`` apart."""
TOKEN_DELAY = 0.05


async def wait(seconds: float = 30.0) -> str:
    """Wait, then say so."""
    await anyio.sleep(seconds)
    return "waited"


def call_wait_then_answer(request: ModelRequest) -> list[ModelPart]:
    """First turn calls the slow tool; after its result, answer."""
    if request.messages[-1].role == "tool":
        return [TextPart("done"), TurnEndPart("end_turn")]
    return [
        TextPart("Waiting."),
        ToolCallStartPart("call_1", "wait"),
        ToolCallArgsPart("call_1", "{}"),
        ToolCallEndPart("call_1"),
        TurnEndPart("tool_calls"),
    ]


def call_short_wait_then_answer(request: ModelRequest) -> list[ModelPart]:
    """As ``call_wait_then_answer``, with a wait of a tenth of a second."""
    if request.messages[-1].role == "tool":
        return [TextPart("done"), TurnEndPart("end_turn")]
    return [
        ToolCallStartPart("call_1", "wait"),
        ToolCallArgsPart("call_1", '{"seconds": 0.1}'),
        ToolCallEndPart("call_1"),
        TurnEndPart("tool_calls"),
    ]


def count(request: ModelRequest) -> list[ModelPart]:
    return [*(TextPart(f"{n} ") for n in range(1, COUNTED + 1)), TurnEndPart("end_turn")]


def create(settings: Settings) -> FastAPI:
    return create_app(
        settings,
        tools=[Tool.from_function(wait)],
        models=[
            ScriptedModel("scripted-wait", call_wait_then_answer),
            ScriptedModel("scripted-short-wait", call_short_wait_then_answer),
            ScriptedModel("scripted-count", count, delay=TOKEN_DELAY),
        ],
        agents=[
            AgentSpec(id="waiter", model="scripted-wait", tools=["wait"]),
            AgentSpec(id="counter", model="scripted-count"),
            AgentSpec(
                id="asker",
                model="scripted-short-wait",
                tools=["wait"],
                approval_required=["wait"],
            ),
        ],
    )
