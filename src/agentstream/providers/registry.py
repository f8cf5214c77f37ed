"""Models by name: what an agent definition's ``model`` field refers to."""

from __future__ import annotations

from collections.abc import Iterable

from agentstream.providers.base import Model

__all__ = ["ModelRegistry"]


class ModelRegistry:
    """The models this server can run."""

    def __init__(self, models: Iterable[Model] = ()) -> None:
        self._models: dict[str, Model] = {}
        for model in models:
            self.register(model)

    def register(self, model: Model) -> None:
        self._models[model.name] = model

    def get(self, name: str) -> Model:
        try:
            return self._models[name]
        except KeyError:
            raise KeyError(f"Unknown model {name!r}; known: {', '.join(self.names())}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._models

    def names(self) -> list[str]:
        return sorted(self._models)
