"""The model registry's data: providers, models, prices and capabilities, from catalog.yaml.

One file is the source of truth for ``GET /api/models``, ``agentstream models``, cost
accounting and the capability table in docs/models.md.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentstream.errors import ConfigError
from agentstream.events import Usage
from agentstream.yamlfile import read_yaml

__all__ = [
    "Capabilities",
    "Catalog",
    "ModelInfo",
    "ProviderInfo",
    "capability_table",
    "load_catalog",
]

BUILTIN = Path(str(files("agentstream.providers").joinpath("catalog.yaml")))

ProviderKind = Literal["offline", "openai", "anthropic", "gemini", "openai_compatible", "custom"]
Thinking = Literal["none", "summary", "thinking"]

PREFIXED_KINDS = frozenset({"openai", "anthropic", "gemini", "openai_compatible"})
"""The providers whose models can be named ``provider:model`` without a catalog entry."""
ALIASES = {"gemini": ("google",)}
"""Other prefixes people write for a provider."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Capabilities(_Strict):
    streaming: bool = True
    tools: bool = False
    parallel_tool_calls: bool = False
    thinking: Thinking = "none"
    """What the model exposes of its reasoning: nothing, summaries, or thinking text."""
    vision: bool = False


class ProviderInfo(_Strict):
    kind: ProviderKind
    label: str
    api_key_env: str | None = None
    """The environment variable that holds the key."""
    key_required: bool = True
    base_url: str | None = None
    base_url_env: str | None = None
    """An environment variable that overrides ``base_url`` (e.g. to use a proxy)."""


class ModelInfo(_Strict):
    name: str
    """What agents put in ``model``."""
    provider: str
    api: Literal["chat", "responses"] = "chat"
    """For OpenAI: Chat Completions, or the Responses API (reasoning models)."""
    api_model: str | None = None
    """The provider's id for the model, when it differs from ``name``."""
    context_window: int | None = None
    input_price: float | None = None
    """USD per million input tokens."""
    output_price: float | None = None
    """USD per million output tokens (reasoning included)."""
    capabilities: Capabilities | None = Field(default_factory=Capabilities)
    """None: unknown (a ``provider:model`` name the catalog does not list)."""
    notes: str = ""

    @property
    def provider_model(self) -> str:
        return self.api_model or self.name

    def priced(self, usage: Usage) -> Usage:
        """The usage with its cost at this model's prices (None if a price is unknown)."""
        if self.input_price is None or self.output_price is None:
            return Usage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens)
        cost = (
            usage.input_tokens * self.input_price + usage.output_tokens * self.output_price
        ) / 1_000_000
        return Usage(
            input_tokens=usage.input_tokens, output_tokens=usage.output_tokens, cost_usd=cost
        )


class Catalog(_Strict):
    providers: dict[str, ProviderInfo]
    models: list[ModelInfo]

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        names = [m.name for m in self.models]
        if duplicates := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"models listed twice: {duplicates}")
        if unknown := sorted({m.provider for m in self.models} - set(self.providers)):
            raise ValueError(f"models name unknown providers: {unknown}")
        return self

    def model(self, name: str) -> ModelInfo | None:
        return next((m for m in self.models if m.name == name), None)


def load_catalog(extra: Path | None = None) -> Catalog:
    """The built-in catalog, merged with the user's own file if given; a mistake in that file
    is a ``ConfigError`` naming the file and line."""
    catalog = Catalog.model_validate(read_yaml(BUILTIN).data)
    if extra is None:
        return catalog
    source = read_yaml(extra)
    document = source.data or {}
    if not isinstance(document, dict):
        raise ConfigError(f"{source.where(())}: expected `providers:` and `models:`")
    try:
        own = _UserCatalog.model_validate(document)
        merged = Catalog(
            providers={**catalog.providers, **own.providers},
            models=[m for m in catalog.models if m.name not in {o.name for o in own.models}]
            + own.models,
        )
    except ValidationError as exc:
        raise source.invalid(exc) from None
    return merged


class _UserCatalog(_Strict):
    """A models file: providers and models to add to the built-in ones (or replace)."""

    providers: dict[str, ProviderInfo] = Field(default_factory=dict)
    models: list[ModelInfo] = Field(default_factory=list)


def _price(value: float | None) -> str:
    return "—" if value is None else ("free" if value == 0 else f"${value:.2f}")


def capability_table(catalog: Catalog) -> str:
    """docs/models.md: capabilities by provider family, then every model."""
    thinking = {"none": "no", "summary": "summaries", "thinking": "yes"}
    lines = [
        "# Models and capabilities",
        "",
        "Generated from `src/agentstream/providers/catalog.yaml` by `make docs`; do not edit.",
        "Prices are USD per million tokens (input / output), list prices for the base tier.",
        "",
        "## By provider family",
        "",
        "| family | streaming | tool calls | parallel tool calls | exposed thinking | vision |",
        "|---|---|---|---|---|---|",
    ]
    yes = {True: "yes", False: "no"}
    for key, provider in catalog.providers.items():
        known = [c for m in catalog.models if m.provider == key if (c := m.capabilities)]
        if not known:
            continue

        def some(flag: str, known: list[Capabilities] = known) -> str:
            count = sum(bool(getattr(c, flag)) for c in known)
            return yes[count == len(known)] if count in (0, len(known)) else "some models"

        exposed = {c.thinking for c in known}
        shown = (
            thinking[exposed.pop()]
            if len(exposed) == 1
            else "some models: " + ", ".join(thinking[t] for t in sorted(exposed - {"none"}))
        )
        lines.append(
            f"| {provider.label} | {some('streaming')} | {some('tools')} | "
            f"{some('parallel_tool_calls')} | {shown} | {some('vision')} |"
        )
    lines += [
        "",
        "## Every model",
        "",
        "| model | provider | context | input | output | tools | thinking | notes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in catalog.models:
        context = f"{m.context_window:,}" if m.context_window else "—"
        caps = m.capabilities
        lines.append(
            f"| `{m.name}` | {catalog.providers[m.provider].label} | {context} | "
            f"{_price(m.input_price)} | {_price(m.output_price)} | "
            f"{yes[caps.tools] if caps else 'unknown'} | "
            f"{thinking[caps.thinking] if caps else 'unknown'} | {m.notes} |"
        )
    lines += [
        "",
        "## Models beyond the catalog",
        "",
        "Name any model of a provider as `provider:model` (the provider's own id after the",
        "colon), e.g. `openai:gpt-4o`, `anthropic:claude-3-5-sonnet-latest`,",
        "`ollama:llama3.2`. Such a model runs without a catalog entry; its capabilities are",
        "unknown and its cost is not computed (`cost_usd` is null), unless the name after the",
        "colon is a catalog model of that provider, whose entry it then uses.",
        "",
        "| prefix | provider | default base URL | base URL variable |",
        "|---|---|---|---|",
    ]
    for key, provider in catalog.providers.items():
        if provider.kind in PREFIXED_KINDS:
            prefixes = ", ".join(f"`{p}:`" for p in (key, *ALIASES.get(key, ())))
            default = f"`{provider.base_url}`" if provider.base_url else "the SDK's"
            variable = f"`{provider.base_url_env}`" if provider.base_url_env else "—"
            lines.append(f"| {prefixes} | {provider.label} | {default} | {variable} |")
    lines += [
        "",
        "A provider that needs no key (a server on your machine) is ready when its server",
        "accepts a connection: `agentstream models` and `GET /api/models` try it.",
        "",
        "Set the provider's key in the environment to use its models: "
        + ", ".join(
            f"`{p.api_key_env}` ({p.label})"
            for p in catalog.providers.values()
            if p.api_key_env and p.key_required
        )
        + ".",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(capability_table(load_catalog()), end="")
