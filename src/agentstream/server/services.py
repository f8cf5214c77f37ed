"""What the routers share: settings, store, runs. Built by the app's lifespan."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from agentstream.config import Settings
from agentstream.runtime.runs import RunManager
from agentstream.store import Store

__all__ = ["Services", "services"]


@dataclass(frozen=True, slots=True)
class Services:
    settings: Settings
    store: Store
    runs: RunManager


def services(request: Request) -> Services:
    svc: Services = request.app.state.services
    return svc
