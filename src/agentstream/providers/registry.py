"""Models by name: what an agent definition's ``model`` field refers to.

A name is a catalog entry (``gpt-4.1``), or ``provider:model`` for any model of a provider
the catalog knows (``openai:gpt-4o``, ``ollama:llama3.2``; ``provider/model`` works too),
whose capabilities are then unknown and whose cost is not computed. Models become live on
first use, with the provider's SDK client built from the environment; models handed in
directly (tests, embedders) take precedence.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from agentstream.errors import ModelUnavailable
from agentstream.providers.base import Model
from agentstream.providers.catalog import (
    ALIASES,
    PREFIXED_KINDS,
    Catalog,
    ModelInfo,
    ProviderInfo,
)
from agentstream.providers.offline import OfflineModel
from agentstream.providers.reachability import Reachability

__all__ = ["ClientOptions", "ModelRegistry"]


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """How SDK clients are made: the SDKs' own retry and timeout settings, not ours."""

    max_retries: int = 2
    timeout: float = 600.0
    offline_token_delay: float = 0.0


class ModelRegistry:
    """The models this server can run."""

    def __init__(
        self,
        catalog: Catalog,
        *,
        options: ClientOptions | None = None,
        custom: Iterable[Model] = (),
        reachability: Reachability | None = None,
    ) -> None:
        self.catalog = catalog
        self.options = options or ClientOptions()
        self.reachability = reachability or Reachability()
        self._prefixes = {
            prefix: key
            for key, provider in catalog.providers.items()
            if provider.kind in PREFIXED_KINDS
            for prefix in (key, *ALIASES.get(key, ()))
        }
        self._live: dict[str, Model] = {model.name: model for model in custom}
        self._infos: dict[str, ModelInfo] = {}
        self._closers: list[Callable[[], Awaitable[object]]] = []
        """How to close the SDK clients this registry made (their connection pools)."""

    def names(self) -> list[str]:
        return sorted({m.name for m in self.catalog.models} | set(self._live))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._live or self._described(name) is not None)

    def info(self, name: str) -> ModelInfo:
        """The catalog entry, or one made for a ``provider:model`` name (capabilities
        unknown, no prices); a custom model not in the catalog gets one without prices.
        Made once a name: every run keeps its model's for its whole life."""
        if (known := self._infos.get(name)) is None:
            known = self._infos[name] = self._described(name) or ModelInfo(
                name=name, provider="custom"
            )
        return known

    def _described(self, name: str) -> ModelInfo | None:
        if found := self.catalog.model(name):
            return found
        for separator in ":/":
            prefix, _, api_model = name.partition(separator)
            key = self._prefixes.get(prefix.lower())
            if key is not None and api_model:
                listed = next(
                    (
                        m
                        for m in self.catalog.models
                        if m.provider == key and m.provider_model == api_model
                    ),
                    None,
                )
                if listed is not None:
                    return listed.model_copy(update={"name": name})
                return ModelInfo(name=name, provider=key, api_model=api_model, capabilities=None)
        return None

    def provider(self, name: str) -> ProviderInfo:
        info = self.info(name)
        return self.catalog.providers.get(info.provider) or ProviderInfo(
            kind="custom", label="custom"
        )

    def available(self, name: str) -> str | None:
        """Why the model cannot run here (a missing key), or None if it can."""
        if name in self._live:
            return None
        provider = self.provider(name)
        if (
            provider.key_required
            and provider.api_key_env
            and not os.environ.get(provider.api_key_env)
        ):
            return f"Set {provider.api_key_env} to use {name} ({provider.label})"
        return None

    async def ready(self, name: str) -> str | None:
        """Why the model cannot run now, or None if it can: ``available``, and for a
        provider that needs no key (a local server), whether its server accepts a
        connection."""
        if reason := self.available(name):
            return reason
        provider = self.provider(name)
        url = _base_url(provider)
        if name in self._live or provider.key_required or url is None:
            return None
        if await self.reachability.answers(url):
            return None
        override = f", or set {provider.base_url_env}" if provider.base_url_env else ""
        return f"Nothing answers at {url} ({provider.label}): start it{override}"

    def get(self, name: str) -> Model:
        """The live model, connecting on first use. ``ModelUnavailable`` if it cannot run."""
        if name in self._live:
            return self._live[name]
        if name not in self:
            raise ModelUnavailable(
                f"Unknown model {name!r}; known: {', '.join(self.names())}", field="model"
            )
        if reason := self.available(name):
            raise ModelUnavailable(reason, field="model")
        model, close = _connect(self.info(name), self.provider(name), self.options)
        self._live[name] = model
        if close is not None:
            self._closers.append(close)
        return model

    async def aclose(self) -> None:
        """Close the SDK clients made for catalog models."""
        for close in self._closers:
            await close()
        self._closers.clear()


def _base_url(provider: ProviderInfo) -> str | None:
    """Where the provider is reached: its base-URL variable if set, else the catalog's."""
    from_env = os.environ.get(provider.base_url_env) if provider.base_url_env else None
    return from_env or provider.base_url


def _connect(
    info: ModelInfo, provider: ProviderInfo, options: ClientOptions
) -> tuple[Model, Callable[[], Awaitable[object]] | None]:
    """Build the SDK client for the provider and wrap it in its adapter.

    The SDKs are imported here, on first use, so a server that runs only the offline model
    does not pay for importing them.
    """
    key = os.environ.get(provider.api_key_env) if provider.api_key_env else None
    url = _base_url(provider)
    match provider.kind:
        case "offline":
            return OfflineModel(name=info.name, token_delay=options.offline_token_delay), None
        case "openai" | "openai_compatible":
            from openai import AsyncOpenAI

            from agentstream.providers.openai import OpenAIChatModel, OpenAIResponsesModel

            client = AsyncOpenAI(
                api_key=key or "not-needed",  # local servers take any key
                base_url=url,
                max_retries=options.max_retries,
                timeout=options.timeout,
            )
            adapter = OpenAIResponsesModel if info.api == "responses" else OpenAIChatModel
            chat = adapter(
                info.name, client=client, api_model=info.provider_model, provider=provider.label
            )
            return chat, client.close
        case "anthropic":
            from anthropic import AsyncAnthropic

            from agentstream.providers.anthropic import AnthropicModel

            anthropic = AsyncAnthropic(
                api_key=key,
                base_url=url,
                max_retries=options.max_retries,
                timeout=options.timeout,
            )
            claude = AnthropicModel(
                info.name, client=anthropic, api_model=info.provider_model, provider=provider.label
            )
            return claude, anthropic.close
        case "gemini":
            from google import genai

            from agentstream.providers.gemini import GeminiModel

            http = genai.types.HttpOptions(
                base_url=url,
                api_version="v1beta",  # thinking, signatures and JSON-schema tools live here
                timeout=int(options.timeout * 1000),
                retry_options=genai.types.HttpRetryOptions(attempts=options.max_retries + 1),
            )
            gemini = genai.Client(api_key=key, http_options=http)
            google = GeminiModel(
                info.name, client=gemini, api_model=info.provider_model, provider=provider.label
            )
            return google, gemini.aio.aclose
        case "custom":
            raise ModelUnavailable(f"Model {info.name!r} has no provider here", field="model")
