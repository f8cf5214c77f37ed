"""The canonical event vocabulary: everything a run does, in one sequence-numbered stream.

A run is an agent run or a workflow execution: both write these events, one vocabulary.
A workflow's block lifecycle is here too, and what an agent does inside a block is the
same events as in a run of its own, scoped to the block by ``block_id``. The runtime emits
only these; views translate them into each surface's frames (the spec's wire names, such as
``workflow_start`` or ``block_chunk``, are the views' concern) and the store keeps the
persisted ones. Token deltas are forwarded-only (``persisted = False``): they are never
written to the database, the assembled text is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal, TypeVar, dataclass_transform

from pydantic import Field, TypeAdapter

__all__ = [
    "INTERRUPTED",
    "STEP_SEPARATOR",
    "TOKEN_TYPES",
    "ApprovalRequested",
    "BaseEvent",
    "BlockCompleted",
    "BlockError",
    "BlockOutput",
    "BlockSkipped",
    "BlockStarted",
    "ContextHandlerCreated",
    "DelegationCompleted",
    "DelegationStarted",
    "Emitted",
    "EntityChunk",
    "EntityText",
    "Event",
    "EventAdapter",
    "FailureStatus",
    "Reasoning",
    "ReasoningDelta",
    "ReasoningSummary",
    "RunCompleted",
    "RunFailed",
    "RunPaused",
    "RunStarted",
    "StepCompleted",
    "StepStarted",
    "Text",
    "TextDelta",
    "TextRetracted",
    "Token",
    "ToolCall",
    "ToolResult",
    "Usage",
    "cancelled_tool_calls",
    "make_token",
]

ToolStatus = Literal["success", "error", "cancelled"]
FailureStatus = Literal["error", "timeout", "cancelled", "interrupted"]

INTERRUPTED = "The server stopped during the run"
"""Why a run that the server's stopping (or a crash) cut off ended."""

T = TypeVar("T")


@dataclass_transform(frozen_default=True, kw_only_default=True, field_specifiers=(field,))
def event(cls: type[T]) -> type[T]:
    """An event class: a dataclass with slots and keyword-only fields, frozen to the type
    checker (which holds the code and the tests to it) but not at run time, where a frozen
    dataclass sets each field through ``object.__setattr__``: a token's event took three
    times as long to make (docs/benchmarks.md, issue 14). Hashable by its fields, as a
    frozen one is (the type checker takes it for frozen)."""
    return dataclass(slots=True, kw_only=True, unsafe_hash=True)(cls)


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """Token counts reported by the model, summed over a run's turns."""

    input_tokens: int = 0
    """Tokens the model read."""
    output_tokens: int = 0
    """Tokens the model wrote, reasoning included."""
    cost_usd: float | None = None
    """What those tokens cost at the model's list prices; None when a price is unknown."""

    def __add__(self, other: Usage) -> Usage:
        costs = (self.cost_usd, other.cost_usd)
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cost_usd=None if None in costs else sum(c or 0.0 for c in costs),
        )

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@event
class BaseEvent:
    """Fields every event carries."""

    persisted: ClassVar[bool] = True

    run_id: str
    """The run this event belongs to."""
    seq: int
    """Position in the run, from 1, strictly increasing: what subscribers resume from."""
    ts: float
    """Unix time at emission."""
    block_id: str | None = None
    """The workflow block the event is about; None for the run itself."""


@event
class _StepScoped(BaseEvent):
    step: int
    """The agent step (one model turn and its tool calls), from 1."""


@event
class RunStarted(BaseEvent):
    """The run was accepted and is executing. Always the first event."""

    type: Literal["run_started"] = "run_started"
    agent_id: str | None = None
    """The agent being run, for an agent run."""
    session_id: str | None = None
    """The conversation an agent run continues; pass it back for the next turn."""
    workflow_id: str | None = None
    """The workflow being executed, for a workflow run."""


@event
class StepStarted(_StepScoped):
    """A model turn begins."""

    type: Literal["step_started"] = "step_started"


@event
class ReasoningDelta(_StepScoped):
    """A piece of the model's reasoning, live."""

    persisted: ClassVar[bool] = False
    type: Literal["reasoning_delta"] = "reasoning_delta"
    delta: str
    """The new reasoning text."""


@event
class Reasoning(_StepScoped):
    """The step's whole reasoning, assembled: what replay shows of the model's thinking."""

    type: Literal["reasoning"] = "reasoning"
    text: str
    """The assembled reasoning of this step."""


@event
class ReasoningSummary(_StepScoped):
    """The model's own summary of the step's reasoning, at the end of the step."""

    type: Literal["reasoning_summary"] = "reasoning_summary"
    summary: str
    """The summary, whole."""


@event
class TextDelta(_StepScoped):
    """A piece of answer text, live; provisional until the turn settles."""

    persisted: ClassVar[bool] = False
    type: Literal["text_delta"] = "text_delta"
    delta: str
    """The new text."""
    separator: str = ""
    """What goes before ``delta`` where all of a run's text is shown (the native surface,
    an entity's chunks): ``STEP_SEPARATOR`` on the first piece of a step's text when an
    earlier step streamed text too, else empty. Answer-only surfaces ignore it."""


STEP_SEPARATOR = "\n\n"
"""Between two steps' text where all of a run's text is shown, so words do not glue."""

Token = TextDelta | ReasoningDelta
"""A live piece of a turn's text or reasoning: forwarded, never stored."""

TOKEN_TYPES: dict[type[Token], str] = {
    kind: kind.__dataclass_fields__["type"].default for kind in (TextDelta, ReasoningDelta)
}
"""Each token kind's ``type``: what ``make_token`` sets (a slot's default is only
``__init__``'s), and what names a pack's kind on the cluster's wire."""


def make_token(
    kind: type[Token],
    run_id: str,
    seq: int,
    ts: float,
    block_id: str | None,
    step: int,
    delta: str,
    separator: str = "",
) -> Token:
    """``kind(run_id=run_id, ...)`` (``separator`` a text token's only), equal to it, in a
    third of the instructions: a class called with keywords gathers them in a dict and
    matches each name to its parameter, 5,600 instructions; the fields set on a bare
    instance, 1,700 (callgrind, 100,000 made; a paced token's way, 2,600 fewer of its
    66,000). Made once a token by the run (``emit_token``), and again for a viewer that
    reads tokens from a pack (``runlog``, ``cluster.wire``)."""
    made: Any = object.__new__(kind)  # frozen to the type checker only (``event``)
    made.run_id, made.seq, made.ts, made.block_id = run_id, seq, ts, block_id
    made.step, made.delta, made.type = step, delta, TOKEN_TYPES[kind]
    if kind is TextDelta:
        made.separator = separator
    return made  # type: ignore[no-any-return]


@event
class TextRetracted(_StepScoped):
    """The turn resolved to tool calls: the text it streamed was preamble, not answer.

    Answer-only surfaces (public chat, canvas) take that text back; the native one shows it
    whole. Forwarded only, like the deltas it retracts: a run's record, its conversation
    memory and its output keep final-turn text only (spec 000: "intermediate preamble is
    never persisted")."""

    persisted: ClassVar[bool] = False
    type: Literal["text_retracted"] = "text_retracted"
    text: str
    """The step's preamble, whole (without a ``separator``)."""


@event
class Text(_StepScoped):
    """The settled text of a final turn (one that called no tools)."""

    type: Literal["text"] = "text"
    text: str
    """The turn's whole answer text."""


@event
class ToolCall(_StepScoped):
    """The model called a tool; arguments are complete and parsed."""

    type: Literal["tool_call"] = "tool_call"
    call_id: str
    """Pairs this call with its ``ToolResult``."""
    tool_name: str
    """The tool called."""
    arguments: dict[str, Any]
    """The arguments as the model sent them."""


@event
class ToolResult(_StepScoped):
    """A tool call settled: with a result, an error for the model, or cancelled."""

    type: Literal["tool_result"] = "tool_result"
    call_id: str
    """The ``ToolCall`` this settles."""
    tool_name: str
    """The tool called."""
    status: ToolStatus
    """How the call settled."""
    result: Any = None
    """The tool's JSON-able return value, or the error message shown to the model."""


@event
class ApprovalRequested(_StepScoped):
    """A tool call waits for a person to approve or deny it; the run pauses after these."""

    type: Literal["approval_requested"] = "approval_requested"
    call_id: str
    """The ``ToolCall`` to decide on."""
    tool_name: str
    """The tool the model wants to call."""
    tool_input: dict[str, Any]
    """The arguments it would be called with."""


@event
class ContextHandlerCreated(_StepScoped):
    """A tool (``knowledge_search``) retrieved passages for the run: their citations are at
    ``GET /api/context-handlers/{context_handler_id}``, for a citation panel."""

    type: Literal["context_handler_created"] = "context_handler_created"
    call_id: str
    """The ``ToolCall`` that retrieved them."""
    context_handler_id: str
    """The handler holding the passages, in the order the answer numbers them."""


@event
class RunPaused(BaseEvent):
    """The run stopped to wait for approvals; it continues, with the same seqs, once they
    are decided."""

    type: Literal["run_paused"] = "run_paused"
    awaiting: list[str]
    """The call ids waiting for a decision."""


@event
class StepCompleted(_StepScoped):
    """The model turn and all its tool calls have settled."""

    type: Literal["step_completed"] = "step_completed"


@event
class RunCompleted(BaseEvent):
    """The run finished. Always the last event of a successful run."""

    type: Literal["run_completed"] = "run_completed"
    content: str = ""
    """An agent's final answer: final-turn text only, never preamble."""
    result: Any = None
    """A workflow's result: the output of the response block that ran (several: an object
    by block id; none: null)."""
    usage: Usage = field(default_factory=Usage)
    """Tokens an agent run used."""


@event
class RunFailed(BaseEvent):
    """The run ended without an answer. Always the last event of an unsuccessful run."""

    type: Literal["run_failed"] = "run_failed"
    status: FailureStatus
    """Why: an error, the execution timeout, a cancel, or a server stop."""
    message: str
    """What happened, for a person."""
    failed_block: str | None = None
    """The block whose failure short-circuited a workflow, if one did."""


@event
class _EntityScoped(BaseEvent):
    entity: str
    """The entity: the agent the coordinator delegated to."""
    entity_run_id: str
    """The entity's own run, which tells apart two delegations to one entity."""


@event
class DelegationStarted(_EntityScoped):
    """The coordinator handed a task to one of its entities, which now runs."""

    type: Literal["delegation_started"] = "delegation_started"
    task: str
    """What the coordinator asked: all the entity knows of the conversation."""


@event
class EntityChunk(_EntityScoped):
    """A piece of an entity's text, live: its deltas, each step's set apart as the native
    surface does (``TextDelta.separator``)."""

    persisted: ClassVar[bool] = False
    type: Literal["entity_chunk"] = "entity_chunk"
    delta: str
    """The new text."""


@event
class EntityText(_EntityScoped):
    """What the entity answered (its final turn's text), once its run completed: what a
    replay shows where the delegation's ``EntityChunk`` deltas were. Live viewers had those,
    so they are not shown it again; its preambles are never persisted, as a run's own."""

    type: Literal["entity_text"] = "entity_text"
    text: str
    """The entity's answer."""


@event
class DelegationCompleted(_EntityScoped):
    """An entity's run ended; what it answered is what the coordinator's tool call returns."""

    type: Literal["delegation_completed"] = "delegation_completed"
    status: Literal["completed"] | FailureStatus
    """How the entity's run ended."""
    content: str | None = None
    """The entity's answer, when it completed."""
    error: str | None = None
    """Why it did not answer, otherwise."""


@event
class _BlockLifecycle(BaseEvent):
    block_id: str
    """The block this event is about."""


@event
class BlockStarted(_BlockLifecycle):
    """The engine is about to execute a block: all its predecessors are done."""

    type: Literal["block_started"] = "block_started"
    block_type: str
    """The block's type, e.g. ``agent`` or ``condition``."""


@event
class BlockOutput(_BlockLifecycle):
    """A block finished with this output, which downstream blocks may reference."""

    type: Literal["block_output"] = "block_output"
    output: dict[str, Any]
    """The block's output fields, e.g. ``{"content": ...}`` for an agent."""


@event
class BlockCompleted(_BlockLifecycle):
    """A block has fully finished, after its output."""

    type: Literal["block_completed"] = "block_completed"


@event
class BlockError(_BlockLifecycle):
    """A block failed. The workflow short-circuits unless the block has error edges, whose
    handlers run next with ``<block.error>``."""

    type: Literal["block_error"] = "block_error"
    error: str
    """What went wrong, for a person."""
    handled: bool
    """True when error edges lead on from here, so the execution continues."""


@event
class BlockSkipped(_BlockLifecycle):
    """The block will not run: every edge into it was not taken (a condition's other branch,
    a success edge of a failed block, or a skipped predecessor)."""

    type: Literal["block_skipped"] = "block_skipped"


Event = Annotated[
    RunStarted
    | StepStarted
    | ReasoningDelta
    | Reasoning
    | ReasoningSummary
    | TextDelta
    | TextRetracted
    | Text
    | ToolCall
    | ToolResult
    | ApprovalRequested
    | ContextHandlerCreated
    | RunPaused
    | StepCompleted
    | RunCompleted
    | RunFailed
    | DelegationStarted
    | EntityChunk
    | EntityText
    | DelegationCompleted
    | BlockStarted
    | BlockOutput
    | BlockCompleted
    | BlockError
    | BlockSkipped,
    Field(discriminator="type"),
]
"""Any canonical event."""

EventAdapter: TypeAdapter[Event] = TypeAdapter(Event)
"""Validates and serialises events, e.g. to and from the store's JSON."""

Emitted = tuple[type[BaseEvent], dict[str, Any]]
"""An event yet to be stamped with its run's seq and time: its kind and fields, as the
runtime hands over several that come at once (``RunContext.emit_all``)."""


def cancelled_tool_calls(open_calls: Mapping[str, tuple[int, str]], **scope: Any) -> list[Emitted]:
    """The results that settle the tool calls still open (step and tool name by call id) as
    cancelled, so no viewer's tool stays spinning; ``scope``: more fields of each."""
    return [
        (
            ToolResult,
            {**scope, "step": step, "call_id": call_id, "tool_name": name, "status": "cancelled"},
        )
        for call_id, (step, name) in open_calls.items()
    ]
