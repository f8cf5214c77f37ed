"""The ASGI application: store, runs and routers, wired in the lifespan."""

from __future__ import annotations

import functools
import gc
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from importlib.metadata import version
from typing import Annotated, Any

import anyio
from fastapi import Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.types import ASGIApp

from agentstream.agents import AgentSpec
from agentstream.cluster import Cluster
from agentstream.config import Settings, write_private
from agentstream.datadir import make_private
from agentstream.deployments import image_origin
from agentstream.errors import NotFound
from agentstream.knowledge.embedding import MiniLM, embeddings_installed
from agentstream.knowledge.service import Knowledge
from agentstream.knowledge.tool import knowledge_search_tool
from agentstream.providers.base import Model
from agentstream.providers.catalog import load_catalog
from agentstream.providers.registry import ClientOptions, ModelRegistry
from agentstream.runlog import RunLog
from agentstream.runtime.blocks import RuntimeAgentRunner, RuntimeOrchestrationRunner
from agentstream.runtime.builtin_tools import BUILTIN_TOOLS
from agentstream.runtime.executions import ExecutionManager
from agentstream.runtime.leases import Leases
from agentstream.runtime.runs import RunManager
from agentstream.runtime.supervisor import Supervisor
from agentstream.runtime.tools import Tool, ToolRegistry
from agentstream.server.ag_ui import router as ag_ui_router
from agentstream.server.agents import router as agents_router
from agentstream.server.api_docs import install_api_docs
from agentstream.server.canvas import router as canvas_router
from agentstream.server.chat import router as chat_router
from agentstream.server.chat_access import EmailSender, log_code, open_chat_access
from agentstream.server.console import pages as console_pages
from agentstream.server.console import router as console_router
from agentstream.server.definitions import Declared, apply_declared, declared
from agentstream.server.deployments import router as deployments_router
from agentstream.server.errors import BodyLimit, install_error_handlers
from agentstream.server.knowledge import DOCUMENT_UPLOADS
from agentstream.server.knowledge import router as knowledge_router
from agentstream.server.models import router as models_router
from agentstream.server.observability import install_observability
from agentstream.server.openai import router as openai_router
from agentstream.server.openapi import document_errors
from agentstream.server.pages import StaticAssets, page, script
from agentstream.server.routing import Route
from agentstream.server.runs import router as runs_router
from agentstream.server.services import Services, services
from agentstream.server.sessions import router as sessions_router
from agentstream.server.streaming import StreamsOutside
from agentstream.server.ui_messages import router as ui_messages_router
from agentstream.server.workflows import router as workflows_router
from agentstream.store import Store
from agentstream.store.knowledge import KnowledgeStore
from agentstream.store.processes import ProcessStore
from agentstream.store.store import sqlite_file
from agentstream.store.workflows import WorkflowStore
from agentstream.workflows import SafeHttpClient, WorkflowEngine

__all__ = ["check_config", "create_app"]

EXPOSED_HEADERS = [
    "X-Run-Id",
    "X-Conversation-Id",
    "X-Execution-Id",
    "X-Sim-Stream-Protocol",
    "Retry-After",
    "X-Request-Id",
]
"""Response headers a page on another origin may read (``AGENTSTREAM_CORS_ORIGINS``)."""

logger = logging.getLogger("agentstream")


def create_app(
    settings: Settings | None = None,
    *,
    tools: Iterable[Tool] = (),
    models: Iterable[Model] = (),
    agents: Iterable[AgentSpec] = (),
    email_sender: EmailSender = log_code,
    functions: Mapping[str, Callable[..., object]] | None = None,
    embeddings: bool | None = None,
) -> FastAPI:
    """The app. ``tools``, ``models`` and ``agents`` add to the built-ins and the agents
    file; ``email_sender`` delivers chat sign-in codes (default: to the server log);
    ``functions`` are the Python callables workflow function blocks may call, by name;
    ``embeddings`` makes knowledge search hybrid (default: if the extra is installed)."""
    settings = settings or Settings()
    model_registry, tool_registry = _registries(settings, models, tools)
    extra_agents = list(agents)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        definitions = declared(
            settings,
            model_registry,
            tool_registry,
            functions=(functions or {}).keys(),
            extra=extra_agents,
        )
        for path in (settings.data_dir, settings.secret_key_file, settings.demo_key_file):
            make_private(path)  # an older version left them readable by others
        store = await Store.open(settings.database, pool_size=settings.database_pool_size)
        try:
            cluster = Cluster(settings) if settings.cluster else None
            log = RunLog(
                retention=settings.run_retention_seconds,
                mirror=cluster.log if cluster is not None else None,
            )
            supervisor = Supervisor(log, peers=cluster)
            workflows = WorkflowStore(store.db)
            knowledge = Knowledge(
                KnowledgeStore(store.db),
                MiniLM(),
                vectors=embeddings_installed() if embeddings is None else embeddings,
            )
            manager = RunManager(
                store=store,
                supervisor=supervisor,
                models=model_registry,
                tools=tool_registry,
                knowledge_search=functools.partial(knowledge_search_tool, knowledge),
            )
            engine = WorkflowEngine(
                agents=RuntimeAgentRunner(
                    models=model_registry, tools=tool_registry, agents=saved_agent(store)
                ),
                orchestrations=RuntimeOrchestrationRunner(manager, agents=store),
                functions=functions,
                http=SafeHttpClient(allow=settings.workflow_http_allow),
            )
            executions = ExecutionManager(
                engine=engine,
                store=workflows,
                supervisor=supervisor,
                timeout_seconds=settings.workflow_timeout_seconds,
            )
            leases = Leases(
                ProcessStore(store.db),
                supervisor,
                lease_seconds=settings.lease_seconds,
                each_round=manager.resume_decided,
            )
            async with AsyncExitStack() as stack:
                if cluster is not None:
                    await stack.enter_async_context(cluster.connected(supervisor.cancel))
                await leases.join(
                    f"{settings.host}:{settings.port}",
                    alone=sqlite_file(settings.database) is not None,
                )
                stack.push_async_callback(leases.leave)
                leasing = await stack.enter_async_context(anyio.create_task_group())
                stack.callback(leasing.cancel_scope.cancel)
                leasing.start_soon(leases.keep)
                chat = await stack.enter_async_context(
                    open_chat_access(settings, store.db, email_sender)
                )
                await stack.enter_async_context(supervisor)
                services = Services(
                    settings=settings,
                    store=store,
                    supervisor=supervisor,
                    runs=manager,
                    chat_access=chat,
                    knowledge=knowledge,
                    workflows=workflows,
                    executions=executions,
                )
                await apply_declared(services, definitions)
                await manager.resume_decided()
                if settings.demo:
                    await _demo_key(store, settings)
                app.state.services = services
                app.state.drain = functools.partial(
                    supervisor.drain, settings.shutdown_grace_seconds
                )
                stack.enter_context(_collector_set_for_serving())
                yield
        finally:
            await model_registry.aclose()
            await store.close()

    app = _App(
        title="agentstream",
        summary="Run AI agents and stream everything they do over Server-Sent Events.",
        version=version("agentstream"),
        lifespan=lifespan,
        docs_url=None,  # install_api_docs serves them, with no CDN
        redoc_url=None,
    )
    install_error_handlers(app)
    app.add_middleware(
        BodyLimit,
        limit=settings.max_body_bytes,
        uploads=DOCUMENT_UPLOADS,
        upload_limit=settings.max_document_bytes,
    )
    install_observability(app, settings)  # request ids: on refusals too
    if settings.cors_origins:  # outermost: refusals carry the headers too
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=EXPOSED_HEADERS,
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
    app.include_router(openai_router)
    app.include_router(ui_messages_router)
    app.include_router(ag_ui_router)
    app.include_router(console_router)
    app.include_router(console_pages)
    app.mount("/static", StaticAssets(), name="static")
    install_api_docs(app)
    document_errors(app)

    @app.get("/chat/{slug}", include_in_schema=False)
    async def chat_page(slug: str, svc: Annotated[Services, Depends(services)]) -> FileResponse:
        """The hosted chat page; it reads the deployment from its URL. The sites the
        deployment lists in ``embed_origins`` may frame it (``widget.js``)."""
        deployment = await svc.store.get_deployment(slug)
        if deployment is None:
            return page("chat.html")
        settings = deployment.settings
        logo = settings.logo_url and image_origin(settings.logo_url)
        images = [logo] if logo else []
        return page("chat.html", embed_origins=settings.embed_origins, image_origins=images)

    @app.get("/chat/{slug}/widget.js", include_in_schema=False)
    async def chat_widget(slug: str) -> FileResponse:
        """A launcher bubble that opens the chat on another site (which the deployment
        lists in ``embed_origins``)."""
        return script("widget.js")

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


class _App(FastAPI):
    def __init__(self, **kwargs: Any) -> None:
        """The app's own routes are ``Route``s too, as the routers' are (``Router``): each
        checks its request (``check_request``), and serves a valid one directly."""
        super().__init__(**kwargs)
        self.router.route_class = Route

    def build_middleware_stack(self) -> ASGIApp:
        """Streams are sent from outside the stack (``StreamsOutside``), unless middleware
        that handles whole responses was added to the app (``BaseHTTPMiddleware``, which
        ``@app.middleware("http")`` makes): then from within it, as any response is."""
        stack = super().build_middleware_stack()
        if any(
            isinstance(added.cls, type) and issubclass(added.cls, BaseHTTPMiddleware)
            for added in self.user_middleware
        ):
            return stack
        return StreamsOutside(stack)


def check_config(settings: Settings) -> Declared:
    """What ``create_app(settings)`` would refuse at start-up, checked before serving:
    ``ConfigError`` with one readable line. Returns what the files declare."""
    models, tools = _registries(settings, (), ())
    return declared(settings, models, tools, functions=())


def _registries(
    settings: Settings, models: Iterable[Model], tools: Iterable[Tool]
) -> tuple[ModelRegistry, ToolRegistry]:
    """The models and tools this server offers: the built-ins and the catalog, plus
    ``models`` and ``tools``."""
    model_registry = ModelRegistry(
        load_catalog(settings.models_file),
        options=ClientOptions(
            max_retries=settings.provider_max_retries,
            timeout=settings.provider_timeout_seconds,
            offline_token_delay=settings.token_delay,
        ),
        custom=models,
    )
    return model_registry, ToolRegistry([*BUILTIN_TOOLS, *tools])


def saved_agent(store: Store) -> Callable[[str], Awaitable[AgentSpec]]:
    """How agent blocks find the agent they name: its current version."""

    async def find(agent_id: str) -> AgentSpec:
        stored = await store.get_agent(agent_id)
        if stored is None:
            raise NotFound(f"No agent {agent_id!r}", field="agent")
        return stored.spec

    return find


YOUNG_COLLECTED_AT = 10_000
"""Objects made and not freed at which the collector passes over the young ones while the
app serves (Python 3.11's default: 700; a program's own higher setting is kept, and so is
the collector turned off). A cluster process holds each run's pending tokens until its
next batch (a quarter of a second when measured, up to a second now): at 700, at 300
streams, each pass moved them on to be walked again by the older generations' passes: in a
6 s window, some 30 passes and a full one, 80 to 100 ms in all; none at this
(docs/benchmarks.md)."""

_SERVING: list[tuple[int, int, int]] = []
"""The collector's thresholds as the first app that now serves found them, once for each
app serving: the last one to stop gives them back (apps may stop in any order)."""


@contextmanager
def _collector_set_for_serving() -> Iterator[None]:
    """What startup made (modules, the app, the definitions: some 200,000 objects) lives as
    long as the server, so it is kept out of the cyclic garbage collector's full passes:
    each of them walked it all, and every stream stood still meanwhile (about 100 ms). No
    collection first: it found a few hundred objects to free, and takes 100 ms or more.
    The young objects are passed over less often (``YOUNG_COLLECTED_AT``)."""
    found = _SERVING[0] if _SERVING else gc.get_threshold()
    if not _SERVING and 0 < found[0] < YOUNG_COLLECTED_AT:  # 0: the collector is off
        gc.set_threshold(YOUNG_COLLECTED_AT, *found[1:])
    _SERVING.append(found)
    gc.freeze()  # process-wide: what a run resumed at startup made stays until the app stops
    try:
        yield
    finally:
        _SERVING.pop()
        if not _SERVING:
            gc.set_threshold(*found)
        gc.unfreeze()  # an app that stops can be collected (in tests, several a process; a
        # second app still serving then has its startup heap walked again, as before)


async def _demo_key(store: Store, settings: Settings) -> None:
    """Reuse the demo key kept in the data directory, or make one; say where it is."""
    path = settings.demo_key_file
    key = path.read_text().strip() if path.exists() else ""
    if not key or not await store.is_api_key(key):
        key = await store.create_api_key("demo")
        write_private(path, key)
    logger.info("Demo API key: %s  (also in %s); sign in to the console at /console", key, path)
