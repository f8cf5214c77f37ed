"""AG-UI for an agent (``docs/ag-ui.md``): ``POST /api/agents/{id}/ag-ui`` takes AG-UI's
``RunAgentInput`` (the official package's model) and answers in AG-UI events
(``views.ag_ui``), for CopilotKit's ``HttpAgent`` and other AG-UI clients.

The thread is the agent's session, so the server keeps the conversation and reads only
the new user message; the client's ``runId`` is the run's id when it is free (else the
run gets a new one, which ``RUN_STARTED`` says). A run that stops for approvals finishes
with interrupts; a new run on the thread whose ``resume`` answers them continues it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated

from ag_ui.core import RunAgentInput, UserMessage
from ag_ui.core.types import ResumeEntry
from fastapi import Depends, Response
from pydantic import ConfigDict

from agentstream.agents import StoredAgent
from agentstream.errors import Conflict, UserError
from agentstream.events import Event
from agentstream.server.agents import agent_or_404
from agentstream.server.auth import require_api_key
from agentstream.server.openapi import POST_FRAMING, STARTS_RUN, event_stream, refusals
from agentstream.server.routing import Router
from agentstream.server.runs import decide_all
from agentstream.server.services import Services, services
from agentstream.server.streams import follow, stream_started
from agentstream.views.ag_ui import AGUIEvents
from agentstream.views.continued import continued

__all__ = ["router"]

router = Router(prefix="/api/agents", tags=["ag-ui"])
Svc = Annotated[Services, Depends(services)]
Caller = Annotated[str, Depends(require_api_key)]

RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,40}")
"""A client's ``runId`` that can be a run's id as it is."""


class RunInput(RunAgentInput):
    """AG-UI's ``RunAgentInput``, with ``runId`` optional: without one, the server names
    the run (``RUN_STARTED`` says how)."""

    run_id: str | None = None  # type: ignore[assignment]

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "threadId": "thread-1",
                    "runId": "run-1",
                    "messages": [{"id": "m1", "role": "user", "content": "What is 17 * 23?"}],
                    "state": {},
                    "tools": [],
                    "context": [],
                    "forwardedProps": {},
                }
            ]
        }
    )


@router.post(
    "/{agent_id}/ag-ui",
    response_class=Response,
    responses={
        **event_stream(
            "AG-UI events",
            POST_FRAMING.replace("no `id:`", "no `id:` (a resumed run's have them)").replace(
                "Leaving", "Leaving a new run's stream"
            ),
            protocol="the AG-UI protocol 1.0 (`RUN_STARTED`, `TEXT_MESSAGE_*`, "
            "`REASONING_*`, `TOOL_CALL_*`, `STEP_*`, `CUSTOM`, `RUN_FINISHED` with interrupts, "
            "`RUN_ERROR`)",
            ids=None,
        ),
        **refusals(
            {
                409: "The thread has a run in progress; or, with `resume`, no run of the "
                "thread waits for an answer, or it waits for more answers"
            },
            STARTS_RUN,
        ),
    },
)
async def run_agent(agent_id: str, body: RunInput, svc: Svc, caller: Caller) -> Response:
    """Run the agent on the thread's new message, or, with ``resume``, continue the run
    that stopped for approvals. Leaving a new run's stream cancels it."""
    agent = await agent_or_404(svc, agent_id)
    thread = body.thread_id
    if not 1 <= len(thread) <= 40:
        raise UserError("must be 1 to 40 characters", field="threadId")
    keepalive = svc.settings.keepalive_seconds
    if body.resume:
        run_id, after = await _resume(svc, agent, thread, body.resume, caller)

        async def persisted() -> list[Event]:
            return await svc.store.run_events(run_id)

        view = AGUIEvents(thread, run_id)
        shown = continued(view, after, view.opening)
        return await follow(svc.supervisor, run_id, persisted, shown, after=0, keepalive=keepalive)
    message = _new_message(body)
    wanted = body.run_id if body.run_id and RUN_ID.fullmatch(body.run_id) else None
    if wanted is not None and await svc.store.run_exists(wanted):
        wanted = None  # taken: a new id, which RUN_STARTED gives
    started = await svc.runs.start(
        agent, message, session_id=thread, create_session=True, run_id=wanted
    )
    view = AGUIEvents(thread, started.run_id)
    return stream_started(svc.supervisor, started.run_id, view, keepalive=keepalive)


def _new_message(body: RunInput) -> str:
    """The text of the last message, which must be the user's."""
    last = body.messages[-1] if body.messages else None
    if not isinstance(last, UserMessage):
        raise UserError("The last message must be the user's", field="messages")
    if isinstance(last.content, str):
        text = last.content
    else:
        text = "".join(getattr(part, "text", "") or "" for part in last.content)
    if not text:
        raise UserError("The last message has no text", field="messages")
    return text


async def _resume(
    svc: Services, agent: StoredAgent, thread: str, answers: Sequence[ResumeEntry], caller: str
) -> tuple[str, int]:
    """Record the answers to the interrupts (``resolved`` approves, unless its payload says
    ``{"approved": false}``; ``cancelled`` denies) and continue the paused run: the run,
    and the seq after which it goes on."""
    paused = [
        run
        for run in await svc.store.session_runs(thread)
        if run.status == "awaiting_approval" and run.agent_id == agent.spec.id
    ]
    if not paused:
        raise Conflict(f"Thread {thread!r} has no run waiting for an answer", field="resume")
    decisions = []
    for answer in answers:
        payload = answer.payload if isinstance(answer.payload, dict) else {}
        approved = answer.status == "resolved" and payload.get("approved", True) is not False
        reason = payload.get("reason") if isinstance(payload.get("reason"), str) else None
        decisions.append((answer.interrupt_id, approved, reason))
    run_id = paused[-1].id
    return run_id, await decide_all(svc, run_id, decisions, caller=caller, field="resume")
