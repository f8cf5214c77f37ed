"""The one interface every model provider implements: a request in, a stream of parts out.

Each provider adapts its API's stream to these parts; the agent loop sees nothing else.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar, dataclass_transform

from agentstream.errors import ProviderError, ProviderErrorKind
from agentstream.events import Usage

__all__ = [
    "Message",
    "Model",
    "ModelPart",
    "ModelRequest",
    "ProviderStatePart",
    "ReasoningPart",
    "ReasoningSummaryPart",
    "RequestedToolCall",
    "SDKModel",
    "TextPart",
    "ToolCallArgsPart",
    "ToolCallEndPart",
    "ToolCallStartPart",
    "ToolSpec",
    "TurnEndPart",
    "UsagePart",
    "system_prompt",
]

Role = Literal["system", "user", "assistant", "tool"]
StopReason = Literal["end_turn", "tool_calls", "max_tokens"]
ClientT = TypeVar("ClientT")
T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestedToolCall:
    """A tool call the model made in an earlier turn, replayed to it as history."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """One entry of the conversation the model sees."""

    role: Role
    content: str = ""
    tool_calls: tuple[RequestedToolCall, ...] = ()
    """For assistant turns that called tools."""
    tool_call_id: str | None = None
    """For tool results: the call answered."""
    provider_state: dict[str, Any] | None = None
    """For assistant turns: what the provider needs replayed verbatim next turn (e.g.
    Anthropic thinking blocks with their signatures), keyed by provider name."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolSpec:
    """What the model is told about a tool."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRequest:
    messages: Sequence[Message]
    tools: Sequence[ToolSpec] = ()
    reasoning: bool = False
    """Ask for the model's reasoning (where the model exposes it)."""
    settings: Mapping[str, Any] = field(default_factory=dict)
    """Provider-specific options from the agent's ``model_settings`` (e.g. max_tokens):
    read only, the agent's own, which later runs of it share."""


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def part(cls: type[T]) -> type[T]:
    """A model part: a dataclass with slots, frozen to the type checker but not at run time
    (as ``events.event``), because a provider makes one a token and a frozen dataclass sets
    each field through ``object.__setattr__``; hashable by its fields, as a frozen one is."""
    return dataclass(slots=True, unsafe_hash=True)(cls)


@part
class TextPart:
    delta: str


@part
class ReasoningPart:
    delta: str


@part
class ReasoningSummaryPart:
    """The provider's summary of this turn's reasoning, whole."""

    summary: str


@part
class ToolCallStartPart:
    id: str
    name: str


@part
class ToolCallArgsPart:
    id: str
    delta: str
    """A piece of the arguments' JSON text."""


@part
class ToolCallEndPart:
    id: str


@part
class UsagePart:
    usage: Usage


@part
class ProviderStatePart:
    """Opaque state to keep on this turn's assistant message (see ``Message.provider_state``)."""

    state: dict[str, Any]


@part
class TurnEndPart:
    stop_reason: StopReason


ModelPart = (
    TextPart
    | ReasoningPart
    | ReasoningSummaryPart
    | ToolCallStartPart
    | ToolCallArgsPart
    | ToolCallEndPart
    | UsagePart
    | ProviderStatePart
    | TurnEndPart
)


class Model(Protocol):
    """A model: streams one turn. Closing the generator early must close the provider stream.

    The parts of a turn: any number of ``ReasoningPart`` / ``TextPart`` / tool-call parts
    (each call: ``ToolCallStartPart``, ``ToolCallArgsPart``..., ``ToolCallEndPart``), then
    ``UsagePart`` and optionally ``ReasoningSummaryPart`` and ``ProviderStatePart``, and
    last ``TurnEndPart``. Failures
    raise ``ProviderError``.
    """

    name: str

    def stream(self, request: ModelRequest) -> AsyncGenerator[ModelPart, None]: ...


class SDKModel(Generic[ClientT]):
    """What the adapters of the providers' SDKs share: the SDK's ``client`` (created by the
    caller: key, base URL, timeout and retries are its business), ``api_model`` (the
    provider's id for the model), and the provider's name, which their errors carry."""

    provider: str
    """Names the provider in errors ("Groq rate limit (429): ...") and keys its state; each
    adapter class sets its own as the default."""

    def __init__(
        self, name: str, *, client: ClientT, api_model: str, provider: str | None = None
    ) -> None:
        self.name = name
        self.client = client
        self.api_model = api_model
        if provider is not None:
            self.provider = provider

    def _error(
        self,
        kind: ProviderErrorKind,
        message: str,
        *,
        status_code: int | None = None,
        body: object = None,
        headers: Mapping[str, str] | None = None,
    ) -> ProviderError:
        return ProviderError(
            message,
            provider=self.provider,
            kind=kind,
            status_code=status_code,
            body=body,
            headers=headers,
        )


def system_prompt(messages: Sequence[Message]) -> str:
    """The system messages as one prompt, for the APIs that take it apart from the turns."""
    return "\n\n".join(m.content for m in messages if m.role == "system" and m.content)
