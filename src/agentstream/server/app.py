"""The ASGI application: store, runs and routers, wired in the lifespan."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from agentstream.agents import AgentSpec, Definitions, load_definitions
from agentstream.config import Settings
from agentstream.deployments import DeploymentSettings, hash_password
from agentstream.providers.base import Model
from agentstream.providers.offline import OfflineModel
from agentstream.providers.registry import ModelRegistry
from agentstream.runlog import RunLog
from agentstream.runtime.builtin_tools import BUILTIN_TOOLS
from agentstream.runtime.runs import RunManager
from agentstream.runtime.tools import Tool, ToolRegistry
from agentstream.server.agents import router as agents_router
from agentstream.server.chat import router as chat_router
from agentstream.server.chat_access import ChatAccess, EmailSender, SessionSigner, log_code
from agentstream.server.deployments import deploy
from agentstream.server.deployments import router as deployments_router
from agentstream.server.errors import BodyLimit, install_error_handlers
from agentstream.server.runs import router as runs_router
from agentstream.server.services import Services
from agentstream.store import Store

__all__ = ["create_app"]

logger = logging.getLogger("agentstream")

DEMO_DEFINITIONS = Path(str(files("agentstream.demo").joinpath("agents.yaml")))
WEB = Path(str(files("agentstream.web")))


def create_app(
    settings: Settings | None = None,
    *,
    tools: Iterable[Tool] = (),
    models: Iterable[Model] = (),
    agents: Iterable[AgentSpec] = (),
    email_sender: EmailSender = log_code,
) -> FastAPI:
    """The app. ``tools``, ``models`` and ``agents`` add to the built-ins and the agents
    file; ``email_sender`` delivers chat sign-in codes (default: to the server log)."""
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
                services = Services(
                    settings=settings,
                    store=store,
                    runs=manager,
                    chat_access=ChatAccess(SessionSigner(settings.secret()), email_sender),
                )
                await _define(services, _startup_definitions(settings, extra_agents))
                if settings.demo:
                    await _demo_key(store, settings)
                app.state.services = services
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
    app.include_router(deployments_router)
    app.include_router(chat_router)
    app.mount("/static", StaticFiles(directory=WEB), name="static")

    @app.get("/chat/{slug}", include_in_schema=False)
    async def chat_page(slug: str) -> FileResponse:
        """The hosted chat page; it reads the deployment from its URL."""
        return FileResponse(WEB / "chat.html")

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def _startup_definitions(settings: Settings, extra_agents: list[AgentSpec]) -> Definitions:
    files_ = [DEMO_DEFINITIONS] if settings.demo else []
    files_ += [settings.agents_file] if settings.agents_file else []
    found = [load_definitions(path) for path in files_]
    return Definitions(
        agents=[a for d in found for a in d.agents] + extra_agents,
        deployments=[dep for d in found for dep in d.deployments],
    )


async def _define(services: Services, definitions: Definitions) -> None:
    """Create or update what the definitions file declares; deployments re-snapshot."""
    for spec in definitions.agents:
        services.runs.check_agent(spec)
        await services.store.put_agent(spec)
    for declared in definitions.deployments:
        existing = await services.store.get_deployment(declared.slug)
        password_hash = (
            hash_password(declared.password)
            if declared.password
            else existing.password_hash
            if existing
            else None
        )
        settings = DeploymentSettings.model_validate(declared.model_dump(exclude={"password"}))
        await deploy(services, settings, password_hash)


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
