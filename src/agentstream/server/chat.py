"""The public chat endpoint (spec 000): ``POST /api/chat/{slug}``, following an answer
(``GET /api/chat/{slug}/runs/{run_id}/stream``) and the deployment's info.

A deployment serves an agent (a run in the conversation's session) or a workflow (an
execution; its output blocks answer).

Access is the deployment's: public, password, email code or API key. The stream is the
chat view's frames, then ``data: "[DONE]"``. Disconnecting (the page's Stop) cancels. The
response's headers name the run and the conversation, so that any process can serve the
answer again, from where a client left off, by the same rules; following only watches.

Visitors are not the operator: a refusal that is the server's problem (a model with no key,
a pinned snapshot this server cannot run) reads generically here and goes to the log in
full; the authenticated API keeps the details.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any

import anyio.to_thread
from fastapi import Depends, Header, Query, Request, Response
from fastapi.responses import JSONResponse
from limits import RateLimitItem
from pydantic import BaseModel, ConfigDict, Field

from agentstream.agents import StoredAgent
from agentstream.deployments import (
    DeploymentSettings,
    email_allowed,
    normalize_email,
    verify_password,
)
from agentstream.errors import (
    AccessDenied,
    Conflict,
    Forbidden,
    ModelUnavailable,
    NotFound,
    Unavailable,
    UserError,
)
from agentstream.events import ContextHandlerCreated, Event
from agentstream.inputs import InputModel
from agentstream.markdown import render_markdown
from agentstream.redaction import redact
from agentstream.server.auth import api_key_of
from agentstream.server.chat_access import CODES_SENT, DEPLOYMENT_GUESSES, GUESSES, ChatAccess
from agentstream.server.deployments import deployment_or_404
from agentstream.server.openapi import FOLLOW_FRAMING, POST_FRAMING, event_stream, refusals
from agentstream.server.rate_limits import Release, per_minute, too_many
from agentstream.server.routing import Router
from agentstream.server.services import Services, services
from agentstream.server.streams import ResumeAfter, follow, stream_started
from agentstream.server.validation import MessageText
from agentstream.store.store import StoredDeployment
from agentstream.views.chat import (
    PROTOCOL_HEADER,
    PROTOCOL_V1,
    ChatFrameAdapter,
    ChatPolicy,
    ChatView,
    ends_answer,
)
from agentstream.workflows import parse_workflow

__all__ = ["router"]

router = Router(prefix="/api/chat", tags=["public chat"])
Svc = Annotated[Services, Depends(services)]
CADENCE = (
    'The answer\'s frames, then `"[DONE]"`. With `X-Sim-Stream-Protocol: agent-events-v1`, '
    "text streams live (`chunk`, `chunk_reset`), with thinking and tool frames where the "
    "deployment shows them; without it, only settled text"
)

NOT_SIGNED_IN = {
    401: "The deployment is not public and the request has no (or wrong) credentials: its "
    "`field` says which to send (`apikey`, `password`, `email`, `otp`)"
}

DONE = b'data: "[DONE]"\n\n'
RUN_HEADER = "X-Run-Id"
"""The run that answers a message, to follow from any process."""
CONVERSATION_HEADER = "X-Conversation-Id"
"""The conversation a message went to: chosen by the client, or new."""
CONVERSATION_ID = r"^[A-Za-z0-9_.:-]{1,100}$"


logger = logging.getLogger("agentstream.chat")

UNAVAILABLE = "The assistant is unavailable right now."
"""What a visitor reads when the deployment cannot run here; the reason goes to the log."""
AWAITING_APPROVAL = (
    "The answer to your last message is waiting for an approval. Try again once it has "
    "been decided, or start a new conversation."
)
STILL_ANSWERING = "The answer to your last message is still coming; wait for it to finish."


class ChatRequest(InputModel):
    """A message, or credentials only (then nothing runs: the reply says you're in)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"input": "Think briefly, then say hi", "conversationId": "c-42"},
                {"password": "correct horse battery staple"},
            ]
        }
    )

    input: MessageText | None = None
    conversationId: str | None = Field(default=None, pattern=CONVERSATION_ID)
    """Continue this conversation; a new one is started (and returned) if absent."""
    password: str | None = Field(default=None, max_length=200)
    email: str | None = Field(default=None, max_length=320)
    otp: str | None = Field(default=None, max_length=20)
    """The one-time code sent to ``email``."""
    files: list[Any] | None = None


class ChatInfo(BaseModel):
    slug: str
    title: str
    greeting: str
    accentColor: str
    logoUrl: str | None
    suggestedPrompts: list[str]
    access: str
    authenticated: bool
    includeThinking: bool
    includeToolCalls: bool
    includeCitations: bool


class Source(BaseModel):
    """A passage an answer cites, as a source card shows it."""

    number: int
    """As the answer cites it: ``[1]`` is number 1."""
    document: str
    page: int | None
    excerpt: str
    """The passage's start, up to ``EXCERPT`` characters."""


EXCERPT = 240


def _cookie(slug: str) -> str:
    return f"agentstream_chat_{slug}"


def _binding(deployment: StoredDeployment) -> str:
    return deployment.password_hash or "email"


async def _has_access(svc: Services, deployment: StoredDeployment, request: Request) -> bool:
    """Access without presenting credentials in the body: public, key, or cookie."""
    settings = deployment.settings
    if settings.access == "public":
        return True
    if settings.access == "api_key":
        key = api_key_of(request.headers.get("apikey"), request.headers.get("authorization"))
        return key is not None and await svc.store.is_api_key(key)
    token = request.cookies.get(_cookie(settings.slug))
    if token is None:
        return False
    identity = svc.chat_access.signer.verify(token, settings.slug, binding=_binding(deployment))
    if identity is None:
        return False
    return settings.access == "password" or email_allowed(identity, settings.allowed_emails)


async def _authenticate(
    svc: Services, deployment: StoredDeployment, body: ChatRequest, client: str
) -> str:
    """Check the credentials in the body; the identity to sign into a cookie."""
    settings, access = deployment.settings, svc.chat_access
    slug = settings.slug
    if settings.access == "api_key":
        raise _not_signed_in(settings)
    if settings.access == "password":
        if body.password is None:
            raise _not_signed_in(settings)
        await _limit(access, "password", (GUESSES, client, slug), (DEPLOYMENT_GUESSES, slug))
        assert deployment.password_hash is not None
        # scrypt takes tens of milliseconds: off the event loop, so streams keep flowing
        if not await anyio.to_thread.run_sync(
            verify_password, body.password, deployment.password_hash
        ):
            raise AccessDenied("Wrong password", field="password")
        return ""
    if not body.email:
        raise _not_signed_in(settings)
    email = normalize_email(body.email)
    if email is None:
        raise UserError(f"Not an email address: {body.email!r}", field="email")
    if not email_allowed(email, settings.allowed_emails):
        raise Forbidden("This email is not invited to this chat", field="email")
    if body.otp is None:
        await _limit(access, "email", (CODES_SENT, email, slug), (CODES_SENT, client, slug))
        code = await access.codes.issue(slug, email)
        await access.send_email(
            email,
            f"Your code for {settings.title or slug}",
            f"Your sign-in code is {code}. It is valid for 10 minutes.",
        )
        raise AccessDenied(f"We sent a code to {email}: send it as 'otp'", field="otp")
    await _limit(access, "otp", (GUESSES, client, slug), (DEPLOYMENT_GUESSES, slug))
    if not await access.codes.redeem(slug, email, body.otp):
        raise AccessDenied("Wrong or expired code", field="otp")
    return email


def _not_signed_in(settings: DeploymentSettings) -> AccessDenied:
    """What a request without the deployment's credentials is told."""
    match settings.access:
        case "api_key":
            return AccessDenied("This chat needs an API key: send 'apikey: KEY'", field="apikey")
        case "password":
            return AccessDenied("This chat is password protected", field="password")
        case _:
            return AccessDenied("This chat is for invited emails: send your email", field="email")


async def _limit(
    access: ChatAccess, field: str, *limits: tuple[RateLimitItem, str, *tuple[str, ...]]
) -> None:
    """Count an attempt against each limit; 429 at the first one that is used up."""
    for item, *key in limits:
        if wait := await access.windows.retry_after(item, *key):
            raise too_many("Too many attempts; try again in {seconds} seconds", wait, field)


@router.post(
    "/{slug}",
    response_class=Response,
    responses={
        **event_stream(
            CADENCE,
            POST_FRAMING,
            ChatFrameAdapter,
            name="ChatFrame",
            json={
                "schema": {
                    "type": "object",
                    "properties": {"authenticated": {"const": True}},
                    "required": ["authenticated"],
                },
                "example": {"authenticated": True},
            },
        ),
        **refusals(
            NOT_SIGNED_IN,
            {
                403: "This email is not invited to this chat",
                409: "The conversation's last answer is still coming, or waits for an approval",
                429: "Too many messages, answers at once, or sign-in attempts: "
                "`Retry-After` says when to try again",
                503: "The assistant cannot answer now (`model_unavailable`: the reason is in "
                "the server's log), this process is shutting down (`shutting_down`), or, in "
                "cluster mode, Redis is away (`unavailable`)",
            },
        ),
    },
)
async def chat(
    slug: str,
    body: ChatRequest,
    request: Request,
    svc: Svc,
    protocol: Annotated[str | None, Header(alias=PROTOCOL_HEADER)] = None,
) -> Response:
    """Send a message and stream the answer; or, with only credentials, sign in. The
    answer's headers: ``X-Run-Id`` and ``X-Conversation-Id``, to follow it with ``GET
    /api/chat/{slug}/runs/{run_id}/stream``."""
    deployment = await deployment_or_404(svc, slug)
    if body.files:
        raise UserError("File uploads are not supported by this server yet", field="files")
    signed_in: str | None = None
    client = request.client.host if request.client else "unknown"
    if not await _has_access(svc, deployment, request):
        identity = await _authenticate(svc, deployment, body, client)
        signed_in = svc.chat_access.signer.sign(
            slug, identity=identity, binding=_binding(deployment)
        )
    response = (
        JSONResponse({"authenticated": True})
        if body.input is None
        else await _stream(svc, deployment, body.input, body.conversationId, protocol, client)
    )
    if signed_in is not None:
        response.set_cookie(
            _cookie(slug),
            signed_in,
            max_age=int(svc.chat_access.signer.max_age),
            httponly=True,
            samesite="lax",
            secure=request.url.scheme == "https",
            path="/",
        )
    return response


@router.get("/{slug}")
async def chat_info(slug: str, request: Request, svc: Svc) -> ChatInfo:
    """What the hosted page needs to render the chat. Until a visitor is signed in, only
    the title and how to sign in: the greeting and settings are for invited people."""
    deployment = await deployment_or_404(svc, slug)
    s = deployment.settings
    inside = await _has_access(svc, deployment, request)
    return ChatInfo(
        slug=s.slug,
        title=s.title or _name(deployment) or s.slug,
        greeting=s.greeting if inside else "",
        accentColor=s.accent_color,
        logoUrl=s.logo_url,
        suggestedPrompts=s.suggested_prompts if inside else [],
        access=s.access,
        authenticated=inside,
        includeThinking=s.include_thinking and inside,
        includeToolCalls=s.include_tool_calls and inside,
        includeCitations=s.include_citations and inside,
    )


class MarkdownIn(InputModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"text": "**17 × 23** is `391`."}]})

    text: str = Field(max_length=1_000_000)
    """An answer's text, as far as it has come."""


class MarkdownOut(BaseModel):
    html: str
    """The text as Markdown, rendered and sanitized: safe to set as a page's HTML."""


@router.post("/{slug}/markdown", responses=refusals(NOT_SIGNED_IN))
async def markdown(slug: str, body: MarkdownIn, request: Request, svc: Svc) -> MarkdownOut:
    """The hosted page's renderer: an answer's text as HTML, for visitors of the chat."""
    deployment = await deployment_or_404(svc, slug)
    if not await _has_access(svc, deployment, request):
        raise _not_signed_in(deployment.settings)
    return MarkdownOut(html=render_markdown(body.text))


def _name(deployment: StoredDeployment) -> str:
    target = deployment.target
    if isinstance(target, StoredAgent):
        return target.spec.name
    name = target.definition.get("name")
    return name if isinstance(name, str) else ""


async def _stream(
    svc: Services,
    deployment: StoredDeployment,
    message: str,
    conversation_id: str | None,
    protocol: str | None,
    client: str,
) -> Response:
    settings, target = deployment.settings, deployment.target
    release = await _admit(svc.chat_access, settings, client)
    policy = _policy(settings, protocol)
    conversation_id = conversation_id or secrets.token_hex(16)

    try:
        if isinstance(target, StoredAgent):
            run_id = await _start_agent(svc, deployment, target, message, conversation_id)
        else:  # a workflow keeps no memory: each message runs the pinned version
            workflow = parse_workflow(target.definition, functions=svc.executions.engine.functions)
            run_id = await svc.executions.start(workflow, message, version=target.version)
        # The run's slot is held until the stream ends, however it ends: the answer is
        # complete, the run failed or paused, or the client left.
        return stream_started(
            svc.supervisor,
            run_id,
            _view(deployment, policy, conversation_id).frames,
            keepalive=svc.settings.keepalive_seconds,
            trailer=DONE,
            headers={
                RUN_HEADER: run_id,
                CONVERSATION_HEADER: conversation_id,
                **_echo(policy),
            },
            on_end=release,
        )
    except BaseException as exc:
        release()
        if isinstance(exc, UserError) and not isinstance(exc, (Conflict, Unavailable)):
            # the server's problem, not the visitor's (a Conflict is about their own
            # conversation, an Unavailable says when to try again: both public words)
            logger.warning("Chat %r cannot answer: %s", settings.slug, exc.message)
            raise ModelUnavailable(UNAVAILABLE) from None
        raise


@router.get("/{slug}/runs/{run_id}/sources", responses=refusals(NOT_SIGNED_IN))
async def answer_sources(
    slug: str,
    run_id: str,
    request: Request,
    svc: Svc,
    conversation_id: Annotated[str, Query(alias="conversationId", pattern=CONVERSATION_ID)],
) -> list[Source]:
    """The passages the answer ``run_id`` retrieved with ``knowledge_search``, numbered as
    it cites them, when the deployment shows citations (``include_citations``); else none."""
    deployment = await deployment_or_404(svc, slug)
    if not await _has_access(svc, deployment, request):
        raise _not_signed_in(deployment.settings)
    events = await (await _answer_events(svc, deployment, run_id, conversation_id))()
    if not deployment.settings.include_citations:
        return []
    sources: list[Source] = []
    for event in events:
        if isinstance(event, ContextHandlerCreated):
            handler = await svc.knowledge.store.get_handler(event.context_handler_id)
            sources += [
                Source(
                    number=c.number,
                    document=c.document_name,
                    page=c.page,
                    excerpt=_excerpt(c.text),
                )
                for c in (handler.citations if handler is not None else [])
            ]
    return sources


def _excerpt(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= EXCERPT else flat[: EXCERPT - 1].rsplit(" ", 1)[0] + "…"


@router.get(
    "/{slug}/runs/{run_id}/stream",
    response_class=Response,
    responses={
        **event_stream(CADENCE, FOLLOW_FRAMING, ChatFrameAdapter, ids=True, name="ChatFrame"),
        204: {"description": "The answer has nothing more after `after`"},
        **refusals(NOT_SIGNED_IN),
    },
)
async def follow_answer(
    slug: str,
    run_id: str,
    request: Request,
    svc: Svc,
    after: ResumeAfter,
    conversation_id: Annotated[str, Query(alias="conversationId", pattern=CONVERSATION_ID)],
    protocol: Annotated[str | None, Header(alias=PROTOCOL_HEADER)] = None,
    protocol_query: Annotated[str | None, Query(alias="protocol", max_length=40)] = None,
) -> Response:
    """Follow the answer ``run_id`` (the message's ``X-Run-Id``) in the conversation
    ``conversationId``, from after ``Last-Event-ID`` or ``?after=`` (the later): the frames
    the message's own stream had from there, each with an ``id:`` line, up to the answer's
    ``final`` or ``error`` and ``[DONE]``. The same access, toggles and cadence as a message
    (``protocol=agent-events-v1`` stands for the header, which an EventSource cannot send).
    Disconnecting does not cancel. ``204 No Content`` when there is nothing more."""
    deployment = await deployment_or_404(svc, slug)
    if not await _has_access(svc, deployment, request):
        raise _not_signed_in(deployment.settings)
    persisted = await _answer_events(svc, deployment, run_id, conversation_id)
    policy = _policy(deployment.settings, protocol or protocol_query)
    return await follow(
        svc.supervisor,
        run_id,
        persisted,
        _view(deployment, policy, conversation_id).frames,
        after=after,
        keepalive=svc.settings.keepalive_seconds,
        whole_run=True,
        ends=ends_answer,
        trailer=DONE,
        headers=_echo(policy),
    )


def _policy(settings: DeploymentSettings, protocol: str | None) -> ChatPolicy:
    """What a request may see: its protocol, the deployment's toggles and redaction."""
    return ChatPolicy(
        protocol_v1=(protocol or "").strip().lower() == PROTOCOL_V1,
        include_thinking=settings.include_thinking,
        include_tool_calls=settings.include_tool_calls,
        redact=redact if settings.redact_pii else None,
        outputs=tuple(settings.outputs),
    )


def _echo(policy: ChatPolicy) -> dict[str, str]:
    """The protocol header, echoed where the client negotiated it."""
    return {PROTOCOL_HEADER: PROTOCOL_V1} if policy.protocol_v1 else {}


def _view(deployment: StoredDeployment, policy: ChatPolicy, conversation_id: str) -> ChatView:
    """An answer of the deployment: the agent's run, or the workflow's output blocks."""
    target = deployment.target
    if isinstance(target, StoredAgent):
        return ChatView(
            policy,
            output_blocks=[target.spec.id],
            run_block=target.spec.id,
            conversation_id=conversation_id,
        )
    return ChatView(
        policy, output_blocks=deployment.settings.output_blocks, conversation_id=conversation_id
    )


async def _answer_events(
    svc: Services, deployment: StoredDeployment, run_id: str, conversation_id: str
) -> Callable[[], Awaitable[Sequence[Event]]]:
    """How to read the stored events of ``run_id``, if it answered a message of this
    deployment: an agent's run in the conversation's session, or an execution of the
    workflow version it serves. Anything else is no answer here (404), whatever it is."""
    settings, target = deployment.settings, deployment.target
    if isinstance(target, StoredAgent):
        run = await svc.store.get_run(run_id)
        session_id = _session_id(settings.slug, target.spec.id, conversation_id)
        if run is not None and run.session_id == session_id:
            return lambda: svc.store.run_events(run_id)
    else:
        record = await svc.workflows.get_execution(run_id)
        if (
            record is not None
            and not record.draft
            and (record.workflow_id, record.workflow_version)
            == (settings.workflow_id, target.version)
        ):
            return lambda: svc.workflows.execution_events(run_id)
    raise NotFound(f"No answer {run_id!r} in this conversation", field="run_id")


async def _admit(access: ChatAccess, settings: DeploymentSettings, client: str) -> Release:
    """Room for one more run of this client, or 429: a slot among the runs going now (the
    client's and the deployment's), and a place in the client's last minute."""
    slug = settings.slug
    minute = per_minute(settings.runs_per_minute_per_client, name="chat-runs")
    if wait := await access.windows.retry_after(minute, slug, client):
        raise too_many("Too many messages; try again in {seconds} seconds", wait)
    # No await from here until the stream owns the release: a slot cannot be lost.
    release = access.in_flight.acquire(
        [((slug, client), settings.concurrent_runs_per_client), ((slug,), settings.concurrent_runs)]
    )
    if release is None:
        raise too_many("Too many answers are coming at once; try again in a moment", 1)
    return release


async def _start_agent(
    svc: Services,
    deployment: StoredDeployment,
    agent: StoredAgent,
    message: str,
    conversation_id: str,
) -> str:
    """A run of the agent in the conversation's session, so it remembers earlier turns; its
    id."""
    session_id = _session_id(deployment.settings.slug, agent.spec.id, conversation_id)
    try:
        run = await svc.runs.start(
            agent,
            message,
            session_id=session_id,
            create_session=True,  # reasoning as the agent says: the view decides what is shown
            entities=deployment.entities,
        )
    except Conflict:
        paused = await svc.store.session_paused(session_id)
        raise Conflict(
            AWAITING_APPROVAL if paused else STILL_ANSWERING, field="conversationId"
        ) from None
    return run.run_id


def _session_id(slug: str, agent_id: str, conversation_id: str) -> str:
    """The session of a conversation with a deployment's agent."""
    key = f"{slug}\n{agent_id}\n{conversation_id}".encode()
    return "cnv_" + hashlib.sha256(key).hexdigest()[:36]
