"""A workflow definition: blocks and the edges between them, as YAML, JSON or an API body.

These models check the shape of each block (its type and required configuration); the
checks that need the whole graph (cycles, references, reachability) are in ``validation``.
Strings in a block's templated fields may reference upstream outputs: ``<agent1.content>``.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, StringConstraints, field_validator, model_validator

from agentstream.agents import AgentSpec
from agentstream.inputs import InputModel

__all__ = [
    "AgentBlock",
    "Block",
    "Branch",
    "ConditionBlock",
    "Edge",
    "FunctionBlock",
    "HttpBlock",
    "OrchestrationBlock",
    "ResponseBlock",
    "StartBlock",
    "TemplateBlock",
    "Workflow",
]

BlockId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")]
"""An identifier, so that expressions can name the block: ``agent1.content``."""


class _Block(InputModel):
    model_config = ConfigDict(frozen=True)

    outputs: ClassVar[tuple[str, ...]]
    """The fields of the block's output, what ``<id.field>`` may name."""
    templated: ClassVar[tuple[str, ...]] = ()
    """The configuration fields whose strings may hold references."""

    id: BlockId
    """Unique in the workflow; what references and edges name."""
    name: str = Field(default="", max_length=200)
    """A label for people."""
    redact_output: bool = False
    """PII redaction on this block's output: the canvas then shows it only redacted, once the
    block completes, and never streams it live."""

    def expressions(self) -> dict[str, str]:
        """The block's expressions by configuration field."""
        return {}


class StartBlock(_Block):
    """Where every execution begins: its output is the execution's input."""

    outputs = ("input",)
    type: Literal["start"]


class AgentBlock(_Block):
    """Runs an agent on a message; its answer is the output."""

    outputs = ("content",)
    templated = ("input",)
    type: Literal["agent"]
    agent: Annotated[str, StringConstraints(min_length=1)] | AgentSpec
    """A saved agent's id, or an agent defined inline."""
    input: str
    """The message for the agent, e.g. ``<start.input>``."""
    reasoning: bool | None = None
    """Request the model's reasoning; default: the agent's own setting."""


class OrchestrationBlock(_Block):
    """Runs an orchestration (a coordinator delegating to entity agents) on a message."""

    outputs = ("content",)
    templated = ("input",)
    type: Literal["orchestration"]
    orchestration: Annotated[str, StringConstraints(min_length=1)]
    """The orchestration's id."""
    input: str
    """The task for the coordinator."""


class Branch(InputModel):
    """One way out of a condition block: edges with ``branch: <name>`` leave through it."""

    model_config = ConfigDict(frozen=True)

    name: BlockId
    when: str | None = None
    """An expression; the first branch whose expression is true is taken. None: "else"."""


class ConditionBlock(_Block):
    """Routes to exactly one branch; the others, and what only they lead to, are skipped."""

    outputs = ("branch",)
    type: Literal["condition"]
    branches: list[Branch] = Field(min_length=1)

    @model_validator(mode="after")
    def _else_last(self) -> ConditionBlock:
        names = [branch.name for branch in self.branches]
        if len(set(names)) != len(names):
            raise ValueError("branch names must be unique")
        if any(branch.when is None for branch in self.branches[:-1]):
            raise ValueError("only the last branch may omit 'when' (the else branch)")
        return self

    def expressions(self) -> dict[str, str]:
        return {
            f"branches.{i}.when": branch.when
            for i, branch in enumerate(self.branches)
            if branch.when is not None
        }


class FunctionBlock(_Block):
    """Computes a value: a sandboxed expression, or a Python function registered by name
    with the engine (never code sent with the definition)."""

    outputs = ("result",)
    templated = ("args",)
    type: Literal["function"]
    expression: str | None = None
    """E.g. ``len(agent1.content) > 100``; see ``expressions`` for what is allowed."""
    function: str | None = None
    """The name of a function registered with the engine."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for ``function``, references resolved."""

    @model_validator(mode="after")
    def _one_kind(self) -> FunctionBlock:
        if (self.expression is None) == (self.function is None):
            raise ValueError("give exactly one of 'expression' and 'function'")
        if self.args and self.function is None:
            raise ValueError("'args' go with 'function'")
        return self

    def expressions(self) -> dict[str, str]:
        return {"expression": self.expression} if self.expression is not None else {}


class HttpBlock(_Block):
    """Sends an HTTP request; private, loopback and other internal addresses are refused
    unless the server's allow-list permits them. A status of 400 or more fails the block."""

    outputs = ("status", "headers", "body")
    templated = ("url", "headers", "body")
    type: Literal["http"]
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"] = "GET"
    url: Annotated[str, StringConstraints(min_length=1)]
    headers: dict[str, str] = Field(default_factory=dict)
    body: Any = None
    """Sent as JSON when not null."""
    timeout_seconds: float = Field(default=30.0, gt=0, le=300)


class TemplateBlock(_Block):
    """Text with references filled in."""

    outputs = ("text",)
    templated = ("template",)
    type: Literal["template"]
    template: str


class ResponseBlock(_Block):
    """The workflow's result: any JSON value, references resolved. Ends its branch."""

    outputs = ("result",)
    templated = ("output",)
    type: Literal["response"]
    output: Any
    """E.g. ``{"answer": "<agent1.content>"}``."""


Block = Annotated[
    StartBlock
    | AgentBlock
    | OrchestrationBlock
    | ConditionBlock
    | FunctionBlock
    | HttpBlock
    | TemplateBlock
    | ResponseBlock,
    Field(discriminator="type"),
]
"""Any block."""


class Edge(InputModel):
    """``to`` runs after ``from``: when it succeeds (and, from a condition, took ``branch``),
    or, for an error edge (``on: error``), when it fails."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    source: BlockId = Field(alias="from")
    target: BlockId = Field(alias="to")
    on: Literal["success", "error"] = "success"
    branch: BlockId | None = None
    """For edges leaving a condition block: the branch they belong to."""


class Workflow(InputModel):
    """A DAG of blocks. Independent branches run concurrently."""

    model_config = ConfigDict(frozen=True)

    id: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,99}$")]
    name: str = Field(default="", max_length=200)
    description: str = Field(default="", max_length=10_000)
    blocks: list[Block] = Field(min_length=1)
    edges: list[Edge] = Field(default_factory=list)

    @field_validator("id")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        if value == "executions":  # GET /api/workflows/executions lists every execution
            raise ValueError("'executions' is reserved: choose another id")
        return value
