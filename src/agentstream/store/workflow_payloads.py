"""TEMPORARY: today's workflow events (``workflows/events.py``) to and from the payloads of
the one event vocabulary that ``run_events`` keeps for runs of both kinds.

Migration 0009 rewrote stored executions into that vocabulary and new ones are written in
it, while the engine, the views and the server still speak today's workflow classes. Delete
this module, and its two uses in ``store/workflows.py``, once they emit and read the one
vocabulary (``events.py``): the store then dumps and validates events as for agent runs.
"""

from __future__ import annotations

from typing import Any

from agentstream.store.runs import Payload, RunStore
from agentstream.workflows.events import (
    BlockReasoning,
    BlockTool,
    WorkflowCancelled,
    WorkflowComplete,
    WorkflowError,
    WorkflowEvent,
    WorkflowEventAdapter,
    WorkflowEventBase,
    WorkflowStart,
)

__all__ = ["unified_payload", "workflow_event"]

_NO_USAGE = {"input_tokens": 0, "output_tokens": 0, "cost_usd": None}


async def unified_payload(event: WorkflowEventBase, runs: RunStore) -> dict[str, Any]:
    """``event`` as the one vocabulary has it (the mapping migration 0009 applied). A block's
    reasoning is numbered by the block's reasoning so far; its tool calls are step 1."""
    body: dict[str, Any]
    match event:
        case WorkflowStart(workflow_id=workflow_id):
            body = {
                "type": "run_started",
                "workflow_id": workflow_id,
                "agent_id": None,
                "session_id": None,
            }
        case WorkflowComplete(result=result):
            body = {"type": "run_completed", "result": result, "content": "", "usage": _NO_USAGE}
        case WorkflowError(error=error, block_id=block_id):
            body = {
                "type": "run_failed",
                "status": "error",
                "message": error,
                "failed_block": block_id,
            }
        case WorkflowCancelled(reason=reason, status=status):
            body = {"type": "run_failed", "status": status, "message": reason, "failed_block": None}
        case BlockReasoning(block_id=block_id, text=text):
            earlier = await runs.events(event.execution_id)
            step = 1 + sum(p["type"] == "reasoning" and p["block_id"] == block_id for p in earlier)
            body = {"type": "reasoning", "block_id": block_id, "step": step, "text": text}
        case BlockTool(phase="start"):
            body = {
                "type": "tool_call",
                "block_id": event.block_id,
                "step": 1,
                "call_id": event.call_id,
                "tool_name": event.name,
                "arguments": event.arguments or {},
            }
        case BlockTool():
            body = {
                "type": "tool_result",
                "block_id": event.block_id,
                "step": 1,
                "call_id": event.call_id,
                "tool_name": event.name,
                "status": event.status or "success",
                "result": event.result,
            }
        case _:
            body = WorkflowEventAdapter.dump_python(event, mode="json")  # type: ignore[arg-type]
            del body["execution_id"], body["seq"], body["ts"]
    return {"run_id": event.execution_id, "seq": event.seq, "ts": event.ts, **body}


def workflow_event(payload: Payload) -> WorkflowEvent:
    """The workflow event a stored payload was (or, for an interruption, would have been)."""
    fields: dict[str, Any]
    match payload["type"]:
        case "run_started":
            fields = {"type": "workflow_start", "workflow_id": payload["workflow_id"]}
        case "run_completed":
            fields = {"type": "workflow_complete", "result": payload.get("result")}
        case "run_failed" if payload["status"] == "error":
            fields = {"type": "workflow_error", "error": payload["message"]}
            fields["block_id"] = payload.get("failed_block")
        case "run_failed":
            fields = {"type": "workflow_cancelled", "reason": payload["message"]}
            fields["status"] = payload["status"]
        case "reasoning":
            fields = {"type": "block_reasoning", "block_id": payload["block_id"]}
            fields["text"] = payload["text"]
        case "tool_call" | "tool_result" as kind:
            fields = {"type": "block_tool", "block_id": payload["block_id"]}
            fields |= {"call_id": payload["call_id"], "name": payload["tool_name"]}
            if kind == "tool_call":
                fields |= {"phase": "start", "arguments": payload["arguments"]}
            else:
                fields |= {"phase": "end", "status": payload["status"]}
                fields["result"] = payload.get("result")
        case _:
            fields = {key: value for key, value in payload.items() if key != "run_id"}
    head = {"execution_id": payload["run_id"], "seq": payload["seq"], "ts": payload["ts"]}
    return WorkflowEventAdapter.validate_python({**fields, **head})
