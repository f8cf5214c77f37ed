"""What the agents file (and the demo) declare: checked before the server touches any data,
then applied at each start.

Checking needs only the registries, so a mistake in the file is one readable line naming
the file and line (``agentstream serve`` prints it and exits) instead of a traceback from
the middle of start-up.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from agentstream.agents import AgentSpec, Definitions, load_definitions
from agentstream.config import Settings
from agentstream.deployments import DeploymentSettings, hash_password
from agentstream.errors import ConfigError, UserError
from agentstream.providers.registry import ModelRegistry
from agentstream.runtime.runs import check_agent
from agentstream.runtime.tools import ToolRegistry
from agentstream.server.deployments import deploy
from agentstream.server.services import Services
from agentstream.workflows import WorkflowInvalid, parse_workflow

__all__ = ["Declared", "apply_declared", "declared"]

logger = logging.getLogger("agentstream")

DEMO_DEFINITIONS = Path(str(files("agentstream.demo").joinpath("agents.yaml")))


@dataclass(frozen=True, slots=True)
class Declared:
    """The demo's definitions (created once, then left to the user's changes) and the
    agents file's (the source of truth for what it declares, applied at each start)."""

    demo: Definitions | None
    file: Definitions


def declared(
    settings: Settings,
    models: ModelRegistry,
    tools: ToolRegistry,
    *,
    functions: Collection[str],
    extra: Sequence[AgentSpec] = (),
) -> Declared:
    """Load and check what is declared; ``ConfigError`` names the first mistake."""
    demo = load_definitions(DEMO_DEFINITIONS) if settings.demo else None
    file = load_definitions(settings.agents_file) if settings.agents_file else Definitions()
    for definitions in (demo, file):
        if definitions is not None:
            _check(definitions, models, tools, functions)
    return Declared(demo, file.model_copy(update={"agents": [*file.agents, *extra]}))


def _check(
    definitions: Definitions,
    models: ModelRegistry,
    tools: ToolRegistry,
    functions: Collection[str],
) -> None:
    for i, spec in enumerate(definitions.agents):
        try:
            check_agent(spec, models, tools)
        except UserError as exc:
            loc = ("agents", i, exc.field) if exc.field else ("agents", i)
            raise ConfigError(f"{definitions.where(loc)}: agent {spec.id!r}: {exc}") from None
    for i, data in enumerate(definitions.workflows):
        try:
            parse_workflow(data, functions=functions)
        except WorkflowInvalid as exc:
            name = data.get("id", i) if isinstance(data, dict) else i
            where = definitions.where(_workflow_loc(i, data, exc))
            raise ConfigError(f"{where}: workflow {name!r}: {exc}") from None


def _workflow_loc(i: int, data: object, exc: WorkflowInvalid) -> tuple[str | int, ...]:
    """Where the first problem is: the block it names, if the file has it."""
    block_id = exc.issues[0].block_id
    blocks = data.get("blocks") if isinstance(data, dict) else None
    if block_id is not None and isinstance(blocks, list):
        for j, block in enumerate(blocks):
            if isinstance(block, dict) and block.get("id") == block_id:
                return ("workflows", i, "blocks", j)
    return ("workflows", i)


async def apply_declared(services: Services, declared: Declared) -> None:
    if declared.demo is not None:
        await _apply(services, declared.demo, replace=False)
    await _apply(services, declared.file, replace=True)


async def _apply(services: Services, definitions: Definitions, *, replace: bool) -> None:
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
    for deployment in definitions.deployments:
        existing_deployment = await store.get_deployment(deployment.slug)
        settings = DeploymentSettings.model_validate(deployment.model_dump(exclude={"password"}))
        if existing_deployment is not None and not (
            replace and existing_deployment.settings != settings
        ):
            continue
        if existing_deployment is not None:
            logger.warning("Chat deployment %r updated from the agents file", deployment.slug)
        password_hash = (
            hash_password(deployment.password)
            if deployment.password
            else (existing_deployment.password_hash if existing_deployment else None)
        )
        await deploy(services, settings, password_hash)
