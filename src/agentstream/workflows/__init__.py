"""Workflows: DAGs of blocks (agents, orchestrations, conditions, functions, HTTP requests,
templates) executed concurrently where edges allow, streamed as canonical events
(``agentstream.events``) like every run.

Load and validate a definition with ``parse_workflow`` / ``load_workflow``; run it with a
``WorkflowEngine``: ``await engine.execution(workflow, sink=...).run(input)``.
"""

from agentstream.workflows.definition import Workflow
from agentstream.workflows.engine import Emitter, Execution, ExecutionResult, WorkflowEngine
from agentstream.workflows.errors import BlockFailed, Issue, WorkflowInvalid
from agentstream.workflows.http_block import SafeHttpClient
from agentstream.workflows.runners import (
    AgentEvents,
    AgentRunner,
    OrchestrationRunner,
)
from agentstream.workflows.validation import load_workflow, parse_workflow

__all__ = [
    "AgentEvents",
    "AgentRunner",
    "BlockFailed",
    "Emitter",
    "Execution",
    "ExecutionResult",
    "Issue",
    "OrchestrationRunner",
    "SafeHttpClient",
    "Workflow",
    "WorkflowEngine",
    "WorkflowInvalid",
    "load_workflow",
    "parse_workflow",
]
