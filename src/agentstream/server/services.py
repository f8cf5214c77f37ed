"""What the routers share: settings, store, the supervisor of runs, agent runs, workflows,
chat access. Built by the lifespan."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from agentstream.config import Settings
from agentstream.knowledge.service import Knowledge
from agentstream.runtime.executions import ExecutionManager
from agentstream.runtime.runs import RunManager
from agentstream.runtime.supervisor import Supervisor
from agentstream.server.chat_access import ChatAccess
from agentstream.store import Store
from agentstream.store.workflows import WorkflowStore

__all__ = ["Services", "services"]


@dataclass(frozen=True, slots=True)
class Services:
    settings: Settings
    store: Store
    supervisor: Supervisor
    """Every live run: follow (``subscribe``) or ``cancel`` one, agent run or execution."""
    runs: RunManager
    chat_access: ChatAccess
    knowledge: Knowledge
    workflows: WorkflowStore
    executions: ExecutionManager


async def services(request: Request) -> Services:
    """A dependency, async as every dependency here: FastAPI runs a plain function in its
    thread pool, a trip there and back on every request."""
    svc: Services = request.app.state.services
    return svc
