"""Agent definitions: model, instructions, tools and limits, from the API or a YAML file
(which may also declare chat deployments of them)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import (
    ConfigDict,
    Field,
    PrivateAttr,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from agentstream.deployments import DeploymentCreate, reject_null
from agentstream.inputs import InputModel
from agentstream.yamlfile import YamlFile, read_yaml

__all__ = [
    "AgentId",
    "AgentSpec",
    "AgentUpdate",
    "Definitions",
    "StoredAgent",
    "load_definitions",
]

AgentId = Annotated[
    str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,99}$"), Field(examples=["demo"])
]
EntityId = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,51}$")]
"""An agent id short enough for its ``delegate_to_<id>`` tool name (64 characters at most)."""


class AgentUpdate(InputModel):
    """The editable part of an agent; every field optional for partial updates."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"instructions": "Answer in one sentence.", "max_steps": 4}]
        }
    )

    _not_null = field_validator("*", mode="before")(reject_null)

    name: str | None = Field(default=None, max_length=200)
    model: str | None = None
    instructions: str | None = Field(default=None, max_length=100_000)
    tools: list[str] | None = None
    model_settings: dict[str, Any] | None = None
    approval_required: list[str] | None = None
    knowledge_bases: list[str] | None = None
    delegates: list[EntityId] | None = None
    reasoning: bool | None = None
    max_steps: int | None = Field(default=None, ge=1, le=100)
    timeout_seconds: float | None = Field(default=None, gt=0, le=86_400)


class AgentSpec(InputModel):
    """An agent: what it runs on, what it is told, what it may call, and its limits."""

    model_config = ConfigDict(
        frozen=True,
        json_schema_extra={
            "examples": [
                {
                    "id": "support",
                    "name": "Support",
                    "model": "offline",
                    "instructions": "You answer questions about our product, briefly.",
                    "tools": ["calculator", "current_time"],
                    "reasoning": True,
                }
            ]
        },
    )

    id: AgentId
    """URL-safe identifier: lowercase letters, digits, '-' and '_'."""
    name: str = Field(default="", max_length=200)
    model: str = "offline"
    """A model name from the registry (``GET /api/models``)."""
    instructions: str = Field(default="You are a helpful assistant.", max_length=100_000)
    tools: list[str] = Field(default_factory=list)
    """Names of registered tools the agent may call."""
    model_settings: dict[str, Any] = Field(default_factory=dict)
    """Options for the provider, e.g. ``max_tokens`` or ``thinking_budget``."""
    approval_required: list[str] = Field(default_factory=list)
    """Tools whose calls wait for a person to approve them (``POST .../approve``)."""
    knowledge_bases: list[str] = Field(default_factory=list)
    """Ids of knowledge bases the agent searches with its ``knowledge_search`` tool."""
    delegates: list[EntityId] = Field(default_factory=list)
    """Agents this one coordinates (an orchestration): it gets a ``delegate_to_<id>`` tool
    for each, which runs that agent on a task and returns its answer."""
    reasoning: bool = False
    """Request the model's reasoning by default; a run request may override it."""
    max_steps: int = Field(default=8, ge=1, le=100)
    """Model turns per run before it stops with an error."""
    timeout_seconds: float = Field(default=300.0, gt=0, le=86_400)
    """Execution timeout: past it the run ends with status ``timeout``."""

    @model_validator(mode="after")
    def _delegates_to_others(self) -> Self:
        if self.id in self.delegates:
            raise ValueError(f"Agent {self.id!r} cannot delegate to itself")
        return self

    def updated(self, update: AgentUpdate) -> AgentSpec:
        """This agent with the update applied, validated as a whole."""
        return AgentSpec.model_validate(
            {**self.model_dump(), **update.model_dump(exclude_unset=True)}
        )


@dataclass(frozen=True, slots=True)
class StoredAgent:
    """An agent as saved: its spec at this version. Runs pin it (the version they ran)."""

    spec: AgentSpec
    version: int
    created_at: datetime
    updated_at: datetime


class Definitions(InputModel):
    """A definitions file: agents, chat deployments of them, and workflows."""

    agents: list[AgentSpec] = Field(default_factory=list)
    deployments: list[DeploymentCreate] = Field(default_factory=list)
    workflows: list[dict[str, Any]] = Field(default_factory=list)
    """Workflow definitions, validated when the server applies them (``parse_workflow``:
    a workflow's blocks refer to agents, so they are checked after the agents are in)."""
    _source: YamlFile | None = PrivateAttr(default=None)

    def where(self, loc: tuple[str | int, ...]) -> str:
        """``file:line`` of the declaration at ``loc``, to name it in an error."""
        return self._source.where(loc) if self._source is not None else "definitions"


def load_definitions(path: Path) -> Definitions:
    """Agents, deployments and workflows from a YAML file; a mistake is a ``ConfigError``
    naming the file and line."""
    source = read_yaml(path)
    try:
        definitions = Definitions.model_validate({} if source.data is None else source.data)
    except ValidationError as exc:
        raise source.invalid(exc) from None
    definitions._source = source
    return definitions
