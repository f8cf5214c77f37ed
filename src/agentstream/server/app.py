"""The ASGI application: store, runs and routers, wired in the lifespan."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI

from agentstream.agents import AgentSpec, load_agents_file
from agentstream.config import Settings
from agentstream.providers.base import Model
from agentstream.providers.offline import OfflineModel
from agentstream.providers.registry import ModelRegistry
from agentstream.runlog import RunLog
from agentstream.runtime.builtin_tools import BUILTIN_TOOLS
from agentstream.runtime.runs import RunManager
from agentstream.runtime.tools import Tool, ToolRegistry
from agentstream.server.agents import router as agents_router
from agentstream.server.errors import BodyLimit, install_error_handlers
from agentstream.server.runs import router as runs_router
from agentstream.server.services import Services
from agentstream.store import Store

__all__ = ["create_app"]

logger = logging.getLogger("agentstream")

DEMO_AGENTS = Path(str(files("agentstream.demo").joinpath("agents.yaml")))


def create_app(
    settings: Settings | None = None,
    *,
    tools: Iterable[Tool] = (),
    models: Iterable[Model] = (),
    agents: Iterable[AgentSpec] = (),
) -> FastAPI:
    """The app. ``tools``, ``models`` and ``agents`` add to the built-ins and the agents file."""
    settings = settings or Settings()
    tool_registry = ToolRegistry([*BUILTIN_TOOLS, *tools])
    model_registry = ModelRegistry([OfflineModel(token_delay=settings.token_delay), *models])
    extra_agents = list(agents)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = await Store.open(settings.database)
        try:
            if interrupted := await store.interrupt_unfinished_runs():
                logger.warning(
                    "Marked %d run(s) left running by a crash as interrupted", interrupted
                )
            log = RunLog(retention=settings.run_retention_seconds)
            async with RunManager(
                store=store, log=log, models=model_registry, tools=tool_registry
            ) as manager:
                for spec in _startup_agents(settings, extra_agents):
                    manager.check_agent(spec)
                    await store.put_agent(spec)
                if settings.demo:
                    await _demo_key(store, settings)
                app.state.services = Services(settings=settings, store=store, runs=manager)
                yield
        finally:
            await store.close()

    app = FastAPI(
        title="agentstream",
        summary="Run AI agents and stream everything they do over Server-Sent Events.",
        version="0.1.0",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.include_router(runs_router)
    app.include_router(agents_router)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def _startup_agents(settings: Settings, extra: list[AgentSpec]) -> list[AgentSpec]:
    found = load_agents_file(DEMO_AGENTS) if settings.demo else []
    if settings.agents_file is not None:
        found += load_agents_file(settings.agents_file)
    return found + extra


async def _demo_key(store: Store, settings: Settings) -> None:
    """Reuse the demo key kept in the data directory, or make one; say where it is."""
    path = settings.demo_key_file
    key = path.read_text().strip() if path.exists() else ""
    if not key or not await store.is_api_key(key):
        key = await store.create_api_key("demo")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(key + "\n")
        path.chmod(0o600)
    logger.info("Demo API key: %s  (also in %s)", key, path)
