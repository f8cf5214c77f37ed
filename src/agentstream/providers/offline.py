"""The built-in offline model: a deterministic, rule-based stand-in for a real LLM.

It needs no network or key, so the demo and every test run anywhere. It reads the last
user message, calls the agent's tools when the message asks for arithmetic or the time,
answers from the tool results, thinks aloud when reasoning is requested, and streams
token by token at a configurable pace. As an orchestration's coordinator it hands the
question to every entity at once, then puts their answers together.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncGenerator, Iterable, Iterator, Sequence
from typing import Any

from agentstream.events import Usage
from agentstream.providers.base import (
    Message,
    ModelPart,
    ModelRequest,
    ReasoningPart,
    ReasoningSummaryPart,
    TextPart,
    ToolCallArgsPart,
    ToolCallEndPart,
    ToolCallStartPart,
    ToolSpec,
    TurnEndPart,
    UsagePart,
)

__all__ = ["OfflineModel"]

_BURST = 16
_TOKEN = re.compile(r"\s*\S+")
# Possessive quantifiers keep the search linear per start; scanning only the start of a
# message keeps it cheap overall (a long run of "1." once took seconds).
_ARITHMETIC = re.compile(r"[-+(]*+\d[\d.,]*+(?:\s*+[-+*/×÷^%]++\s*+[-+(]*+\d[\d.,]*+\)*+)++")
_SCANNED = 1_000
_MAX_WORDS = 20_000
_TIME_WORDS = re.compile(r"\b(time|date|clock|today|day is it)\b", re.IGNORECASE)
_RECALL = re.compile(r"\b(earlier|before|previous(ly)?)\b", re.IGNORECASE)
_DELEGATE = "delegate_to_"
"""How the orchestration runtime names the tool that hands a task to another agent."""
_SENTENCE = re.compile(r".{1,300}?[.!?](?=\s|$)", re.DOTALL)
_WORD_COUNT = re.compile(r"\b(?:write|stream|say)\s+(\d{1,6})\s+(?:words|tokens)\b", re.IGNORECASE)


def tokens(text: str) -> list[str]:
    """Split text the way the offline model streams it: one word and its leading space."""
    return _TOKEN.findall(text)


class OfflineModel:
    """Rule-based model. ``token_delay`` is the pause before each token, in seconds."""

    def __init__(self, *, name: str = "offline", token_delay: float = 0.0) -> None:
        self.name = name
        self.token_delay = token_delay

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelPart, None]:
        asked = _user_messages(request.messages)
        question = asked[-1] if asked else ""
        results = _tool_results_since_user(request.messages)
        calls = [] if results else _tool_calls_for(question, request.tools)
        emitted = 0

        if request.reasoning:
            for token in tokens(_reasoning(question, calls, results)):
                emitted += 1
                await self._pace(emitted)
                yield ReasoningPart(token)

        answer: Iterable[str]
        if calls:
            names = " and the ".join(name for name, _ in calls)
            answer = tokens(f"Let me use the {names} tool.")
        else:
            answer = _answer(question, asked[:-1], results)
        for token in answer:
            emitted += 1
            await self._pace(emitted)
            yield TextPart(token)

        for index, (name, arguments) in enumerate(calls, start=1):
            call_id = f"call_{len(request.messages)}_{index}"
            yield ToolCallStartPart(call_id, name)
            encoded = json.dumps(arguments)
            for piece in (encoded[: len(encoded) // 2], encoded[len(encoded) // 2 :]):
                emitted += 1
                await self._pace(emitted)
                yield ToolCallArgsPart(call_id, piece)
            yield ToolCallEndPart(call_id)

        prompt_tokens = sum(len(tokens(m.content)) for m in request.messages)
        yield UsagePart(Usage(input_tokens=prompt_tokens, output_tokens=emitted))
        if request.reasoning:
            yield ReasoningSummaryPart(_summary(calls, results))
        yield TurnEndPart("tool_calls" if calls else "end_turn")

    async def _pace(self, emitted: int) -> None:
        """Wait before the next token. Unpaced, tokens come in bursts of ``_BURST``, as they
        do from a provider's stream when one network read holds several events."""
        if self.token_delay > 0:
            await asyncio.sleep(self.token_delay)
        elif emitted % _BURST == 0:
            await asyncio.sleep(0)  # a bare yield to the loop; cheaper than anyio's checkpoint


def _user_messages(messages: Sequence[Message]) -> list[str]:
    return [m.content for m in messages if m.role == "user"]


def _tool_results_since_user(messages: Sequence[Message]) -> list[tuple[str, str]]:
    """(tool name, result text) for each tool result after the last user message."""
    names: dict[str, str] = {}
    results: list[tuple[str, str]] = []
    for message in messages:
        if message.role == "user":
            names.clear()
            results.clear()
        for call in message.tool_calls:
            names[call.id] = call.name
        if message.role == "tool" and message.tool_call_id is not None:
            results.append((names.get(message.tool_call_id, "tool"), message.content))
    return results


def _tool_calls_for(question: str, tools: Sequence[ToolSpec]) -> list[tuple[str, dict[str, str]]]:
    available = {tool.name for tool in tools}
    calls: list[tuple[str, dict[str, str]]] = []
    if "calculator" in available and (match := _ARITHMETIC.search(question[:_SCANNED])):
        calls.append(("calculator", {"expression": match.group().strip()}))
    if "current_time" in available and _TIME_WORDS.search(question[:_SCANNED]):
        calls.append(("current_time", {"timezone": "UTC"}))
    calls += [(t.name, {"task": question}) for t in tools if t.name.startswith(_DELEGATE)]
    if "knowledge_search" in available and not calls:
        calls.append(("knowledge_search", {"query": question.strip()[:_SCANNED]}))
    return calls


def _reasoning(
    question: str, calls: Sequence[tuple[str, dict[str, str]]], results: Sequence[tuple[str, str]]
) -> str:
    if results:
        return "I have the tool results now, so I can answer directly from them."
    if calls:
        plan = "; ".join(f"{name} with {json.dumps(args)}" for name, args in calls)
        return f"The user asks: {question!r}. I should not guess, so I will call {plan}."
    return f"The user says: {question!r}. No tool is needed; I will answer directly."


def _summary(
    calls: Sequence[tuple[str, dict[str, str]]], results: Sequence[tuple[str, str]]
) -> str:
    if calls:
        return "Chose to call " + " and ".join(name for name, _ in calls) + " instead of guessing."
    if results:
        return "Answered from the tool results."
    return "Answered directly; no tool needed."


def _answer(
    question: str, earlier: Sequence[str], results: Sequence[tuple[str, str]]
) -> Iterable[str]:
    """The answer's tokens: a long one is made as it streams, not all before its first
    token (10,000 words took 1.3 ms at once, every other stream of the process waiting)."""
    if results:
        return tokens(" ".join(_describe(name, result) for name, result in results))
    if _RECALL.search(question):
        if earlier:
            return tokens(f"Earlier you asked: {earlier[-1]!r}.")
        return tokens("This is the start of our conversation.")
    if match := _WORD_COUNT.search(question[:_SCANNED]):
        return _words(min(int(match.group(1)), _MAX_WORDS))
    if re.search(r"\b(hi|hello|hey)\b", question, re.IGNORECASE):
        return tokens("Hi! I'm the offline demo model, a rule-based stand-in for a real LLM.")
    return tokens(
        f"You said: {question.strip()!r}. I'm the offline demo model, a rule-based stand-in "
        "for a real LLM: ask me some arithmetic or the time to see tools at work."
    )


def _words(count: int) -> Iterator[str]:
    """``tokens("word1 word2 ... word<count>")``, one at a time."""
    for i in range(1, count + 1):
        yield f" word{i}" if i > 1 else "word1"


def _describe(name: str, result: str) -> str:
    try:
        value = json.loads(result)
    except ValueError:
        value = result
    if name.startswith(_DELEGATE):
        entity = name.removeprefix(_DELEGATE)
        failed = isinstance(value, dict) and "error" in value
        return f"{entity} could not answer." if failed else f"{entity}: {value}"
    if isinstance(value, dict) and "error" in value:
        return f"The {name} tool failed: {value['error']}"
    if name == "calculator":
        return f"The answer is {value}."
    if name == "current_time":
        return f"The current time is {value}."
    if name == "knowledge_search":
        return _cite(value["passages"])
    return f"The {name} tool returned {value}."


def _cite(passages: list[dict[str, Any]]) -> str:
    """The opening sentence of the two best passages, each with its citation number."""
    if not passages:
        return "The knowledge base has nothing on that."
    quoted = [f"{_first_sentence(p['text'])} [{p['number']}]" for p in passages[:2]]
    return "From the knowledge base: " + " ".join(quoted)


def _first_sentence(text: str) -> str:
    text = " ".join(line for line in text.split("\n") if not line.startswith("#"))
    text = " ".join(text.split())
    found = _SENTENCE.match(text)
    return found[0] if found else text[:300]
