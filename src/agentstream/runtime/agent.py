"""The agent loop: model turn, tool calls, results, next turn, until an answer or the step limit.

Text streamed in a turn that ends in tool calls was preamble: it never enters the answer,
the memory or the run's record. It is retracted on answer-only surfaces and shown whole,
live, on the native one; where all of a run's text is shown, a later step's text is set
apart from an earlier step's by ``STEP_SEPARATOR``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import anyio
from pydantic import TypeAdapter

from agentstream import telemetry
from agentstream.agents import AgentSpec
from agentstream.errors import MaxStepsExceeded
from agentstream.events import (
    STEP_SEPARATOR,
    ApprovalRequested,
    Emitted,
    Reasoning,
    ReasoningDelta,
    ReasoningSummary,
    StepCompleted,
    StepStarted,
    Text,
    TextDelta,
    TextRetracted,
    ToolCall,
    ToolResult,
)
from agentstream.providers.base import (
    Message,
    Model,
    ModelRequest,
    ProviderStatePart,
    ReasoningPart,
    ReasoningSummaryPart,
    RequestedToolCall,
    TextPart,
    ToolCallArgsPart,
    ToolCallEndPart,
    ToolCallStartPart,
    ToolSpec,
    TurnEndPart,
    UsagePart,
)
from agentstream.runtime.context import RunContext, ToolCallScope, TurnText, current_tool_call
from agentstream.runtime.tools import Tool, ToolOutcome

__all__ = [
    "AgentAnswer",
    "AgentState",
    "AgentStateAdapter",
    "AwaitingApproval",
    "Decision",
    "PendingTurn",
    "run_agent",
]


@dataclass(frozen=True, slots=True)
class AgentAnswer:
    content: str
    memory: list[Message]
    """What this run adds to its session: the user message, tool exchanges, the answer."""


@dataclass(slots=True)
class _Turn:
    text: TurnText
    reasoning: TurnText
    calls: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    """Tool calls in the order started: name and argument pieces by call id."""
    reasoning_pending: bool = False
    """Reasoning came that is not emitted yet: checked at every part, so a flag."""
    reasoning_emitted: bool = False
    summary: str | None = None
    provider_state: dict[str, Any] | None = None


@dataclass(slots=True)
class PendingTurn:
    """A turn whose tool calls wait for a person's decision."""

    step: int
    assistant: Message
    """The assistant message that made the calls (with its provider state)."""
    calls: list[tuple[RequestedToolCall, str | None]]
    """Each call under its id in the run, and why its arguments are unusable if they are."""
    summary: str | None = None
    provider_ids: dict[str, str] = field(default_factory=dict)
    """The id the model gave a call, by the call's id in the run, where the two differ."""


@dataclass(slots=True)
class AgentState:
    """Where an agent run stands: enough to continue it later, in another process even."""

    messages: list[Message]
    memory: list[Message]
    """What this run adds to its session: the user message, tool exchanges, the answer."""
    step: int = 1
    step_started: bool = False
    """The step's ``StepStarted`` is out already: a new run's first is written with the run
    (``RunManager.start``), one write less."""
    pending: PendingTurn | None = None
    streamed_text: bool = False
    """An earlier step streamed text: the next step's text starts with a separator."""
    call_ids: list[str] = field(default_factory=list)
    """The tool call ids this run has used, so that each is used once."""

    @classmethod
    def begin(
        cls,
        agent: AgentSpec,
        history: Sequence[Message],
        message: str,
        *,
        instructions: str | None = None,
        new_history: bool = False,
    ) -> AgentState:
        """``history``: the session's turns so far; with ``new_history``, turns a client
        sent that the session has yet to keep, so the run adds them to it. ``instructions``:
        more system instructions, for this run only."""
        user = Message(role="user", content=message)
        system = [Message(role="system", content=agent.instructions)]
        if instructions:
            system.append(Message(role="system", content=instructions))
        remembered = [*history, user] if new_history else [user]
        return cls(messages=[*system, *history, user], memory=remembered)


AgentStateAdapter: TypeAdapter[AgentState] = TypeAdapter(AgentState)
"""Stores a paused run's state as JSON and reads it back."""


class AwaitingApproval(Exception):
    """Not an error: the run stops here until every call in ``asked`` has a decision."""

    def __init__(self, state: AgentState, asked: list[RequestedToolCall]) -> None:
        super().__init__("awaiting approval")
        self.state = state
        self.asked = asked


@dataclass(frozen=True, slots=True)
class Decision:
    approved: bool
    decided_by: str
    reason: str | None = None


async def run_agent(
    ctx: RunContext,
    agent: AgentSpec,
    model: Model,
    tools: Sequence[Tool],
    *,
    state: AgentState,
    reasoning: bool,
    decisions: Mapping[str, Decision] | None = None,
) -> AgentAnswer:
    """Run (or, with ``decisions`` for the pending calls, continue) the agent to an answer.

    Raises ``AwaitingApproval`` when the model calls a tool that needs a person's approval.
    """
    by_name = {tool.name: tool for tool in tools}
    gated = set(agent.approval_required) | {t.name for t in tools if t.requires_approval}
    specs = [
        ToolSpec(name=t.name, description=t.description, parameters=t.parameters) for t in tools
    ]

    async def one_step() -> AgentAnswer | None:
        """One model turn and its tool calls (or, continued, the pending calls): the answer
        if the model gave one."""
        step = state.step
        pending = state.pending
        if pending is None:
            if state.step_started:
                state.step_started = False
            else:
                await ctx.emit(StepStarted, step=step)
            request = ModelRequest(
                messages=tuple(state.messages),
                tools=specs,
                reasoning=reasoning,
                settings=MappingProxyType(agent.model_settings),
            )
            separator = STEP_SEPARATOR if state.streamed_text else ""
            turn = await _model_turn(ctx, step, model, request, separator)
            text = str(turn.text)
            state.streamed_text = state.streamed_text or bool(text)
            if not turn.calls:
                await _end_step(ctx, step, turn.summary, (Text, {"step": step, "text": text}))
                answer = Message(role="assistant", content=text, provider_state=turn.provider_state)
                return AgentAnswer(content=text, memory=[*state.memory, answer])
            calls = [_parse_call(i, name, pieces) for i, (name, pieces) in turn.calls.items()]
            assistant = Message(
                role="assistant",
                tool_calls=tuple(call for call, _ in calls),
                provider_state=turn.provider_state,
            )
            calls, provider_ids = _ids_in_run(state, calls)
            pending = PendingTurn(step, assistant, calls, turn.summary, provider_ids)
            if text:
                await ctx.emit(TextRetracted, step=step, text=text)  # at once, not stored
            await ctx.emit_all(
                *(
                    (
                        ToolCall,
                        {
                            "step": step,
                            "call_id": call.id,
                            "tool_name": call.name,
                            "arguments": call.arguments,
                        },
                    )
                    for call, _ in calls
                )
            )
            if asked := [call for call, _ in calls if call.name in gated]:
                state.pending = pending
                await ctx.emit_all(
                    *(
                        (
                            ApprovalRequested,
                            {
                                "step": step,
                                "call_id": call.id,
                                "tool_name": call.name,
                                "tool_input": call.arguments,
                            },
                        )
                        for call in asked
                    )
                )
                raise AwaitingApproval(state, asked)
        for call, _ in pending.calls:
            ctx.open_tool_calls[call.id] = (step, call.name)
        outcomes = await _call_tools(ctx, step, by_name, pending.calls, decisions or {})
        exchange = [pending.assistant] + [
            Message(
                role="tool",
                content=_for_model(outcome),
                tool_call_id=pending.provider_ids.get(call.id, call.id),
            )
            for (call, _), outcome in zip(pending.calls, outcomes, strict=True)
        ]
        state.messages += exchange
        state.memory += exchange
        state.pending = None
        state.step += 1
        await _end_step(ctx, step, pending.summary)
        return None

    while state.step <= agent.max_steps:
        with telemetry.step(ctx.run_id, state.step, expected=(AwaitingApproval,)):
            if (answer := await one_step()) is not None:
                return answer

    raise MaxStepsExceeded(
        f"The agent reached its limit of {agent.max_steps} steps without an answer"
    )


async def _model_turn(
    ctx: RunContext, step: int, model: Model, request: ModelRequest, separator: str
) -> _Turn:
    """Stream one turn, forwarding deltas live, the first text delta with ``separator``. On
    cancel, closing the iterator closes the provider's stream."""
    turn = _Turn(ctx.turn_text(TextDelta), ctx.turn_text(ReasoningDelta))
    with telemetry.model_call(model.name) as call:
        async with aclosing(model.stream(request)) as parts:
            answering = False
            async for part in parts:
                if not answering:  # once per call: the time to its first token
                    answering = True
                    call.first_part()
                # Tokens by their type: a ``match`` makes a set and a list for each class
                # pattern it tries (Python 3.11), 3.7% of a token's instructions.
                if type(part) is TextPart:
                    if turn.reasoning_pending:
                        await _settle_reasoning(ctx, step, turn)
                    delta = part.delta
                    if waiting := ctx.emit_token(TextDelta, step, delta, separator):
                        await waiting
                    separator = ""  # before the step's first piece only
                    turn.text.append(delta)
                    continue
                if type(part) is ReasoningPart:
                    delta = part.delta
                    if not turn.reasoning_emitted:  # kept for the turn's one Reasoning
                        turn.reasoning.append(delta)
                        turn.reasoning_pending = True
                    if waiting := ctx.emit_token(ReasoningDelta, step, delta):
                        await waiting
                    continue
                match part:
                    case ToolCallStartPart(call_id, name):
                        if turn.reasoning_pending:
                            await _settle_reasoning(ctx, step, turn)
                        turn.calls[call_id] = (name, [])
                    case ToolCallArgsPart(call_id, delta):
                        turn.calls[call_id][1].append(delta)
                    case UsagePart(usage):
                        call.add(ctx.count(usage))
                    case ProviderStatePart(state):
                        turn.provider_state = state
                    case ReasoningSummaryPart(summary):
                        turn.summary = summary
                    case ToolCallEndPart() | TurnEndPart():
                        pass
    if turn.reasoning_pending:
        await _settle_reasoning(ctx, step, turn)
    return turn


async def _end_step(ctx: RunContext, step: int, summary: str | None, *first: Emitted) -> None:
    """The step's last events, after ``first``: in one write."""
    summarized = [(ReasoningSummary, {"step": step, "summary": summary})] if summary else []
    await ctx.emit_all(*first, *summarized, (StepCompleted, {"step": step}))


async def _settle_reasoning(ctx: RunContext, step: int, turn: _Turn) -> None:
    """The reasoning segment ended: persist it whole. Called where ``reasoning_pending``
    holds, so once a turn."""
    turn.reasoning_pending, turn.reasoning_emitted = False, True
    await ctx.emit(Reasoning, step=step, text=str(turn.reasoning))


def _parse_call(call_id: str, name: str, pieces: list[str]) -> tuple[RequestedToolCall, str | None]:
    """The call with its arguments, and why they are unusable if they are."""
    raw = "".join(pieces) or "{}"
    try:
        arguments: Any = json.loads(raw)
    except ValueError as exc:
        return RequestedToolCall(
            id=call_id, name=name, arguments={}
        ), f"Arguments are not JSON: {exc}"
    if not isinstance(arguments, dict):
        return RequestedToolCall(id=call_id, name=name, arguments={}), "Arguments must be an object"
    return RequestedToolCall(id=call_id, name=name, arguments=arguments), None


def _ids_in_run(
    state: AgentState, calls: list[tuple[RequestedToolCall, str | None]]
) -> tuple[list[tuple[RequestedToolCall, str | None]], dict[str, str]]:
    """The calls under ids used once in the run, and the model's own id of each renamed one.

    A model may give a call the id of an earlier turn's (some number their calls per turn);
    its events, approvals and viewers need one id per call, the model its own id back.
    """
    used = set(state.call_ids)
    renamed: list[tuple[RequestedToolCall, str | None]] = []
    provider_ids: dict[str, str] = {}
    for call, error in calls:
        run_id, copy = call.id, 1
        while run_id in used:
            copy += 1
            run_id = f"{call.id}-{copy}"
        used.add(run_id)
        state.call_ids.append(run_id)
        if run_id != call.id:
            provider_ids[run_id] = call.id
        renamed.append((replace(call, id=run_id), error))
    return renamed, provider_ids


async def _call_tools(
    ctx: RunContext,
    step: int,
    tools: dict[str, Tool],
    calls: Sequence[tuple[RequestedToolCall, str | None]],
    decisions: Mapping[str, Decision],
) -> list[ToolOutcome]:
    """Run the turn's tool calls concurrently; each result is emitted as it settles."""
    outcomes: list[ToolOutcome] = [ToolOutcome() for _ in calls]

    async def call_one(index: int, call: RequestedToolCall, error: str | None) -> None:
        current_tool_call.set(ToolCallScope(ctx, step, call.id))  # this task's own context
        if error is None and call.name not in tools:
            error = f"Unknown tool {call.name!r}; available: {', '.join(sorted(tools)) or 'none'}"
        decision = decisions.get(call.id)
        if error is None and decision is not None and not decision.approved:
            error = f"{decision.decided_by} denied this call" + (
                f": {decision.reason}" if decision.reason else ""
            )
        with telemetry.tool_call(call.name, call.id) as span:
            outcome = (
                ToolOutcome(error=error) if error else await tools[call.name].call(call.arguments)
            )
            span.set_attribute("agentstream.tool.status", "success" if outcome.ok else "error")
        outcomes[index] = outcome
        await ctx.emit(
            ToolResult,
            step=step,
            call_id=call.id,
            tool_name=call.name,
            status="success" if outcome.ok else "error",
            result=outcome.result if outcome.ok else outcome.error,
        )
        del ctx.open_tool_calls[call.id]

    async with anyio.create_task_group() as group:
        for index, (call, error) in enumerate(calls):
            group.start_soon(call_one, index, call, error)
    return outcomes


def _for_model(outcome: ToolOutcome) -> str:
    return json.dumps(outcome.result if outcome.ok else {"error": outcome.error}, default=str)
