"""The ASGI application: store, runs and routers, wired in the lifespan."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from importlib.metadata import version
from importlib.resources import files
from pathlib import Path

from fastapi import Depends, FastAPI
from fastapi.responses import FileResponse

from agentstream.agents import AgentSpec, Definitions, load_definitions
from agentstream.config import Settings, write_private
from agentstream.deployments import DeploymentSettings, hash_password
from agentstream.errors import NotFound
from agentstream.knowledge.embedding import MiniLM
from agentstream.knowledge.service import Knowledge
from agentstream.providers.base import Model
from agentstream.providers.catalog import load_catalog
from agentstream.providers.registry import ClientOptions, ModelRegistry
from agentstream.runlog import RunLog
from agentstream.runtime.builtin_tools import BUILTIN_TOOLS
from agentstream.runtime.executions import ExecutionLog, ExecutionManager
from agentstream.runtime.runs import RunManager
from agentstream.runtime.tools import Tool, ToolRegistry
from agentstream.server.agents import router as agents_router
from agentstream.server.canvas import router as canvas_router
from agentstream.server.chat import router as chat_router
from agentstream.server.chat_access import ChatAccess, EmailSender, SessionSigner, log_code
from agentstream.server.deployments import deploy
from agentstream.server.deployments import router as deployments_router
from agentstream.server.errors import BodyLimit, install_error_handlers
from agentstream.server.knowledge import DOCUMENT_UPLOADS
from agentstream.server.knowledge import router as knowledge_router
from agentstream.server.models import router as models_router
from agentstream.server.pages import StaticAssets, page
from agentstream.server.runs import router as runs_router
from agentstream.server.services import Services
from agentstream.server.sessions import router as sessions_router
from agentstream.server.validation import check_request
from agentstream.server.workflows import router as workflows_router
from agentstream.store import Store
from agentstream.store.knowledge import KnowledgeStore
from agentstream.store.workflows import WorkflowStore
from agentstream.workflows import (
    RuntimeAgentRunner,
    RuntimeOrchestrationRunner,
    SafeHttpClient,
    WorkflowEngine,
    parse_workflow,
)

__all__ = ["create_app"]

logger = logging.getLogger("agentstream")

DEMO_DEFINITIONS = Path(str(files("agentstream.demo").joinpath("agents.yaml")))


def create_app(
    settings: Settings | None = None,
    *,
    tools: Iterable[Tool] = (),
    models: Iterable[Model] = (),
    agents: Iterable[AgentSpec] = (),
    email_sender: EmailSender = log_code,
    functions: Mapping[str, Callable[..., object]] | None = None,
) -> FastAPI:
    """The app. ``tools``, ``models`` and ``agents`` add to the built-ins and the agents
    file; ``email_sender`` delivers chat sign-in codes (default: to the server log);
    ``functions`` are the Python callables workflow function blocks may call, by name."""
    settings = settings or Settings()
    tool_registry = ToolRegistry([*BUILTIN_TOOLS, *tools])
    model_registry = ModelRegistry(
        load_catalog(settings.models_file),
        options=ClientOptions(
            max_retries=settings.provider_max_retries,
            timeout=settings.provider_timeout_seconds,
            offline_token_delay=settings.token_delay,
        ),
        custom=models,
    )
    extra_agents = list(agents)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = await Store.open(settings.database)
        try:
            if interrupted := await store.interrupt_unfinished_runs():
                logger.warning(
                    "Marked %d run(s) left running by a crash as interrupted", interrupted
                )
            workflows = WorkflowStore(store.db)
            if interrupted := await workflows.interrupt_unfinished():
                logger.warning(
                    "Marked %d workflow execution(s) left running by a crash as interrupted",
                    interrupted,
                )
            log = RunLog(retention=settings.run_retention_seconds)
            knowledge = Knowledge(KnowledgeStore(store.db), MiniLM())
            manager = RunManager(
                store=store,
                log=log,
                models=model_registry,
                tools=tool_registry,
                knowledge=knowledge,
            )
            engine = WorkflowEngine(
                agents=RuntimeAgentRunner(
                    models=model_registry, tools=tool_registry, agents=saved_agent(store)
                ),
                orchestrations=RuntimeOrchestrationRunner(manager),
                functions=functions,
                http=SafeHttpClient(allow=settings.workflow_http_allow),
            )
            async with (
                manager,  # exits after the executions, so a cancelled one still stops its runs
                ExecutionManager(
                    engine=engine,
                    store=workflows,
                    log=ExecutionLog(retention=settings.run_retention_seconds),
                    timeout_seconds=settings.workflow_timeout_seconds,
                ) as executions,
            ):
                services = Services(
                    settings=settings,
                    store=store,
                    runs=manager,
                    chat_access=ChatAccess(SessionSigner(settings.secret()), email_sender),
                    knowledge=knowledge,
                    workflows=workflows,
                    executions=executions,
                )
                await _define_all(services, settings, extra_agents)
                await manager.resume_decided()
                if settings.demo:
                    await _demo_key(store, settings)
                app.state.services = services
                yield
        finally:
            await model_registry.aclose()
            await store.close()

    app = FastAPI(
        title="agentstream",
        summary="Run AI agents and stream everything they do over Server-Sent Events.",
        version=version("agentstream"),
        lifespan=lifespan,
        dependencies=[Depends(check_request)],
    )
    install_error_handlers(app)
    app.add_middleware(
        BodyLimit,
        limit=settings.max_body_bytes,
        uploads=DOCUMENT_UPLOADS,
        upload_limit=settings.max_document_bytes,
    )
    app.include_router(runs_router)
    app.include_router(agents_router)
    app.include_router(deployments_router)
    app.include_router(models_router)
    app.include_router(sessions_router)
    app.include_router(knowledge_router)
    app.include_router(workflows_router)
    app.include_router(canvas_router)
    app.include_router(chat_router)
    app.mount("/static", StaticAssets(), name="static")

    @app.get("/chat/{slug}", include_in_schema=False)
    async def chat_page(slug: str) -> FileResponse:
        """The hosted chat page; it reads the deployment from its URL."""
        return page("chat.html")

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def saved_agent(store: Store) -> Callable[[str], Awaitable[AgentSpec]]:
    """How agent blocks find the agent they name: its current version."""

    async def find(agent_id: str) -> AgentSpec:
        stored = await store.get_agent(agent_id)
        if stored is None:
            raise NotFound(f"No agent {agent_id!r}", field="agent")
        return stored.spec

    return find


async def _define_all(services: Services, settings: Settings, extra: list[AgentSpec]) -> None:
    """The demo's definitions are created once and then left to the user's changes; the
    agents file is the source of truth for what it declares and is applied at each start."""
    if settings.demo:
        await _define(services, load_definitions(DEMO_DEFINITIONS), replace=False)
    declared = load_definitions(settings.agents_file) if settings.agents_file else Definitions()
    declared = declared.model_copy(update={"agents": declared.agents + extra})
    await _define(services, declared, replace=True)


async def _define(services: Services, definitions: Definitions, *, replace: bool) -> None:
    """Create what is declared; with ``replace``, also bring what exists in line (saying so)."""
    store = services.store
    for spec in definitions.agents:
        services.runs.check_agent(spec)
        await services.knowledge.check_bases(spec.knowledge_bases)
        existing = await store.get_agent(spec.id)
        if existing is None or (replace and existing.spec != spec):
            if existing is not None:
                logger.warning("Agent %r updated from the agents file", spec.id)
            await store.put_agent(spec)
    for data in definitions.workflows:
        workflow = parse_workflow(data, functions=services.executions.engine.functions)
        existing_workflow = await services.workflows.get_workflow(workflow.id)
        if existing_workflow is not None and not (
            replace and existing_workflow.workflow != workflow
        ):
            continue
        if existing_workflow is not None:
            logger.warning("Workflow %r updated from the agents file", workflow.id)
        await services.workflows.put_workflow(workflow)
    for declared in definitions.deployments:
        existing_deployment = await store.get_deployment(declared.slug)
        settings = DeploymentSettings.model_validate(declared.model_dump(exclude={"password"}))
        if existing_deployment is not None and not (
            replace and existing_deployment.settings != settings
        ):
            continue
        if existing_deployment is not None:
            logger.warning("Chat deployment %r updated from the agents file", declared.slug)
        password_hash = (
            hash_password(declared.password)
            if declared.password
            else (existing_deployment.password_hash if existing_deployment else None)
        )
        await deploy(services, settings, password_hash)


async def _demo_key(store: Store, settings: Settings) -> None:
    """Reuse the demo key kept in the data directory, or make one; say where it is."""
    path = settings.demo_key_file
    key = path.read_text().strip() if path.exists() else ""
    if not key or not await store.is_api_key(key):
        key = await store.create_api_key("demo")
        write_private(path, key)
    logger.info("Demo API key: %s  (also in %s)", key, path)
