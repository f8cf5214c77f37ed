"""The ``agentstream`` command: check a configuration and serve the API, chat with an agent,
run one message, approve or deny the tool calls a run waits for, replay a stored run,
manage API keys. Streams render live through one `StreamRenderer`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar
from urllib.parse import quote

import typer
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text
from rich.traceback import Traceback

from agentstream.client import DEFAULT_URL, Client, RunAccumulator, RunResult, parse_frame
from agentstream.config import Settings
from agentstream.errors import APIStatusError, ClientError, ConfigError, ServeRefused
from agentstream.views import native
from agentstream.views.native import NativeFrame

if TYPE_CHECKING:
    from agentstream.server.checks import DatabaseState, Problem, Report
    from agentstream.store import Store

__all__ = ["StreamRenderer", "app"]

T = TypeVar("T")

app = typer.Typer(
    name="agentstream",
    help="Run AI agents and stream everything they do.",
    no_args_is_help=True,
    add_completion=False,
)
keys_app = typer.Typer(help="Manage API keys.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")
deployments_app = typer.Typer(help="Publish agents as public chats.", no_args_is_help=True)
app.add_typer(deployments_app, name="deployments")

_STYLES = {"reasoning": "dim italic", "content": ""}
_TOOL_STATUS = {"success": ("✓", "green"), "error": ("✗", "red"), "cancelled": ("✗", "yellow")}


def _short(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _call_text(tool: str, arguments: dict[str, Any]) -> str:
    """``name(key=value, …)``, shortened."""
    return f"{tool}({_short(', '.join(f'{k}={v!r}' for k, v in arguments.items()))})"


class StreamRenderer:
    """Native frames in, terminal output out: reasoning dimmed as it arrives, each tool call
    as ``⚙ name(args)`` with a spinner (on a terminal) until its ``✓ result`` (or ``⏸`` when
    it waits for approval), answer text as it arrives. Works the same from a live stream or
    a stored run's events."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._open: str | None = None  # the kind of text on the unfinished line
        self._step_text = False  # answer text shown since the step started
        self._reasoning_streamed = False  # deltas shown for the current reasoning segment
        self._pending: dict[str, str] = {}  # tool call id -> tool name, awaiting a result
        self._live: Live | None = None

    def feed(self, frame: NativeFrame) -> None:
        match frame:
            case native.StepStartedFrame():
                self._step_text = False
            case native.ReasoningDeltaFrame():
                self._write(frame.delta, "reasoning")
                self._reasoning_streamed = True
            case native.ReasoningFrame():
                if not self._reasoning_streamed:
                    self._write(frame.text, "reasoning")
                self._reasoning_streamed = False
                self._end_line()
            case native.ContentDeltaFrame():
                # A later step's text starts with a blank line; here it starts a line anyway.
                fresh = self._open != "content"
                self._write(frame.delta.lstrip("\n") if fresh else frame.delta, "content")
                self._step_text = True
            case native.ChunkFrame() | native.CompleteFrame() if not self._step_text:
                self._write(frame.content, "content")
                self._step_text = True
            case native.ToolCallFrame():
                call = _call_text(frame.tool_name, frame.arguments)
                self._line(Text.assemble(("⚙ ", "cyan"), call))
                self._pending[frame.tool_call_id] = frame.tool_name
            case native.ToolResultFrame():
                mark, style = _TOOL_STATUS[frame.status]
                name = f"{frame.tool_name}: " if len(self._pending) > 1 else ""
                self._pending.pop(frame.tool_call_id, None)
                shown = "cancelled" if frame.status == "cancelled" else _short(frame.result)
                self._line(Text.assemble("  ", (mark, style), f" {name}{shown}"))
            case native.ApprovalRequestedFrame():
                self._pending.pop(frame.tool_call_id, None)
                call = _call_text(frame.tool_name, frame.tool_input)
                self._line(Text.assemble(("⏸ ", "yellow"), f"{call} waits for approval"))
            case native.ErrorFrame():
                self._line(Text(f"✗ run {frame.status}: {frame.message}", style="red"))
        self._spin()

    def close(self) -> None:
        """End the last line and stop any spinner (also after Ctrl-C)."""
        self._pending.clear()
        self._end_line()

    def _write(self, text: str, kind: str) -> None:
        self._stop_spinner()
        if self._open != kind:
            self._end_line()
            if kind == "reasoning":
                self._console.print("💭 ", end="", style="dim")
            self._open = kind
        self._console.print(Text(text, style=_STYLES[kind]), end="", soft_wrap=True)

    def _line(self, text: Text) -> None:
        self._end_line()
        self._console.print(text, soft_wrap=True)

    def _end_line(self) -> None:
        self._stop_spinner()
        if self._open is not None:
            self._console.print()
            self._open = None

    def _spin(self) -> None:
        if not self._pending or not self._console.is_terminal:
            return self._stop_spinner()
        spinner = Spinner("dots", f"running {', '.join(self._pending.values())}…", style="cyan")
        if self._live is None:
            self._live = Live(spinner, console=self._console, transient=True)
            self._live.start()
        else:
            self._live.update(spinner)

    def _stop_spinner(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


# Shared plumbing


def _fail(message: str) -> NoReturn:
    Console(stderr=True, highlight=False).print(Text(message, style="red"), soft_wrap=True)
    raise typer.Exit(1)


@contextmanager
def _friendly_errors() -> Iterator[None]:
    """Client errors become one red line and exit code 1, never a traceback."""
    try:
        yield
    except APIStatusError as exc:
        hint = ""
        if exc.status_code == 401:
            hint = (
                " Pass --key KEY or set AGENTSTREAM_API_KEY"
                " (create one with `agentstream keys create NAME`)."
            )
        _fail(f"Error {exc.status_code}: {exc.message.rstrip('.')}.{hint}")
    except ClientError as exc:
        _fail(str(exc))


def _settings(**overrides: Any) -> Settings:
    """Settings from the environment, with the flags that were given on top."""
    try:
        return Settings.load(**overrides)
    except ConfigError as exc:
        _fail(str(exc))


def _show_problems(problems: Iterable[Problem], *, debug: bool, serving: bool) -> None:
    """Each problem as its line or two, in red; when ``serving``, those that do not stop the
    server as yellow warnings. With ``debug``, the traceback of what caused each."""
    console = Console(stderr=True, highlight=False)
    for problem in problems:
        if problem.blocking or not serving:
            console.print(Text(problem.message, style="red"), soft_wrap=True)
        else:
            console.print(Text(f"warning: {problem.message}", style="yellow"), soft_wrap=True)
        if debug and problem.cause is not None:
            console.print(
                Traceback.from_exception(
                    type(problem.cause), problem.cause, problem.cause.__traceback__
                )
            )


def _with_store(
    settings: Settings, use: Callable[[Store], Awaitable[T]], *, create: bool | None
) -> T:
    """Run ``use`` on the settings' store, after saying (on stderr) which database it is.
    A database with no agentstream data is made only with ``create`` (None: this command
    has nothing to do in a new one)."""
    from agentstream.server.checks import inspect_database
    from agentstream.store import Store

    async def run() -> T:
        try:
            state = await inspect_database(settings.database)
        except ConfigError as exc:
            _fail(str(exc))
        if state.new and not create:
            how = ", or --create to start a new one" if create is not None else ""
            _fail(
                f"No agentstream data in {state.where}: run this where the server keeps its"
                f" data, or pass --data-dir or --database-url{how}."
            )
        Console(stderr=True, highlight=False).print(
            f"[dim]data: {escape(state.where)}{' (new)' if state.new else ''}[/]", soft_wrap=True
        )
        store = await Store.open(settings.database)
        try:
            return await use(store)
        finally:
            await store.close()

    return asyncio.run(run())


@dataclass(frozen=True, slots=True)
class Streamed:
    """What a stream added up to, and the tool calls it stopped at to wait for approval."""

    result: RunResult
    awaiting: list[native.ApprovalRequestedFrame]

    @property
    def paused(self) -> bool:
        return bool(self.awaiting) and self.result.status == "incomplete"


def _stream(
    frames: Iterator[NativeFrame], accumulator: RunAccumulator, console: Console, as_json: bool
) -> Streamed:
    renderer = StreamRenderer(console)
    awaiting: list[native.ApprovalRequestedFrame] = []
    try:
        for frame in frames:
            accumulator.feed(frame)
            if isinstance(frame, native.ApprovalRequestedFrame):
                awaiting.append(frame)
            if as_json:
                typer.echo(frame.model_dump_json())
            else:
                renderer.feed(frame)
    finally:
        renderer.close()
    return Streamed(accumulator.result(), awaiting)


def _decide(
    client: Client,
    run_id: str,
    console: Console,
    *,
    approve: bool,
    reason: str | None = None,
    only: str | None = None,
) -> int:
    """Approve (or deny) the run's pending tool calls, or the one ``only`` names; the seq to
    follow the continued run from."""
    stored = client.get_run(run_id)
    pending = [
        a
        for a in stored["approvals"]
        if a["decision"] == "pending" and only in (None, a["tool_call_id"])
    ]
    if not pending:
        what = f"tool call {only!r}" if only else "approval"
        _fail(f"Run {run_id} is not waiting for {what} (status: {stored['status']}).")
    after = max(event["seq"] for event in stored["events"])
    action = "approve" if approve else "deny"
    for approval in pending:
        client.request(
            "POST",
            f"/api/agents/runs/{quote(run_id, safe='')}/{action}",
            json={"tool_call_id": approval["tool_call_id"], "reason": reason},
        )
        call = _call_text(approval["tool_name"], approval["tool_input"])
        mark = ("✓ approved", "green") if approve else ("✗ denied", "red")
        console.print(Text.assemble(mark, f" {call}"), soft_wrap=True)
    return int(after)


def _ask_and_follow(client: Client, console: Console, streamed: Streamed) -> Streamed | None:
    """Ask about each call the run waits for, then stream what the run does next; None
    (leaving the run paused) if the user quits instead of answering."""
    run_id = streamed.result.run_id
    assert run_id is not None
    after: int | None = None
    for call in streamed.awaiting:
        question = f"Approve {_call_text(call.tool_name, call.tool_input)}? [y/N] "
        try:
            answer = console.input(f"[yellow]{escape(question)}[/]").strip().lower()
        except (EOFError, KeyboardInterrupt):
            console.print()
            _paused_hint(console, run_id)
            return None
        seq = _decide(
            client, run_id, console, approve=answer in ("y", "yes"), only=call.tool_call_id
        )
        after = seq if after is None else after
    assert after is not None
    return _follow(client, run_id, after, console, as_json=False)


def _follow(client: Client, run_id: str, after: int, console: Console, as_json: bool) -> Streamed:
    """Stream the rest of a run that goes on after a decision."""
    accumulator = RunAccumulator()
    accumulator.run_id = run_id
    return _stream(client.iter_resume(run_id, after), accumulator, console, as_json)


def _paused_hint(console: Console, run_id: str | None) -> None:
    console.print(
        f"⏸ paused: agentstream approve {run_id}  ·  agentstream deny {run_id} --reason …",
        style="yellow",
        soft_wrap=True,
    )


def _settle(client: Client, run_id: str) -> None:
    """Cancel a run; the server answers once it has ended and its session is free."""
    with suppress(APIStatusError):  # 409: it has ended already
        client.cancel(run_id)


Url = Annotated[str, typer.Option(envvar="AGENTSTREAM_URL", help="Server URL.")]
Key = Annotated[
    str | None,
    typer.Option(
        envvar="AGENTSTREAM_API_KEY",
        help="API key. Default: the demo key in .agentstream/demo-key.",
        show_default=False,
    ),
]
Session = Annotated[str | None, typer.Option(help="Continue this session.")]
Json = Annotated[bool, typer.Option("--json", help="Print raw JSON instead of rendering.")]
NoReasoning = Annotated[bool, typer.Option("--no-reasoning", help="Do not ask for reasoning.")]
DataDir = Annotated[Path | None, typer.Option(help="Data directory. Default: .agentstream.")]
DatabaseUrl = Annotated[str | None, typer.Option(help="SQLAlchemy async database URL.")]


# Commands


Host = Annotated[str | None, typer.Option(help="Interface. Default: 127.0.0.1.")]
Port = Annotated[int | None, typer.Option(help="Port. Default: 3000.")]
Demo = Annotated[bool | None, typer.Option("--demo/--no-demo", help="Seed the demo agent and key.")]
AgentsFile = Annotated[
    Path | None, typer.Option(help="YAML file of agents.", exists=True, dir_okay=False)
]
TrustedProxies = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated addresses or networks of reverse proxies whose"
        " X-Forwarded-For is believed. Default: none."
    ),
]
Workers = Annotated[
    int | None,
    typer.Option(
        help="Server processes on the one port (cluster mode: PostgreSQL and Redis). Default: 1.",
        min=1,
        show_default=False,
    ),
]
Debug = Annotated[
    bool, typer.Option("--debug", help="Show the traceback behind a configuration problem.")
]


def _server_command(command: Callable[[Settings, bool], None]) -> Callable[..., None]:
    """`serve` and `check` take the same flags: ``command`` gets the settings they make
    and ``--debug``, under its own name and help."""

    def with_flags(
        host: Host = None,
        port: Port = None,
        demo: Demo = None,
        data_dir: DataDir = None,
        database_url: DatabaseUrl = None,
        agents: AgentsFile = None,
        trusted_proxies: TrustedProxies = None,
        workers: Workers = None,
        debug: Debug = False,
    ) -> None:
        settings = _settings(
            host=host,
            port=port,
            demo=demo,
            data_dir=data_dir,
            database_url=database_url,
            agents_file=agents,
            trusted_proxies=trusted_proxies,
            workers=workers,
        )
        command(settings, debug)

    with_flags.__name__, with_flags.__doc__ = command.__name__, command.__doc__
    return with_flags


@app.command()
@_server_command
def serve(settings: Settings, debug: bool) -> None:
    """Run the server. Flags override AGENTSTREAM_* environment variables. The checks of
    `agentstream check` run first: a problem that stops the server is printed, not raised.
    SIGTERM (or Ctrl-C) drains: no new runs, and the live ones get
    AGENTSTREAM_SHUTDOWN_GRACE_SECONDS (default 30) to finish before they are interrupted."""
    from agentstream.server import create_app
    from agentstream.server.checks import Report, check_database, check_declared, check_redis
    from agentstream.server.serving import claim, log_to_console, run, run_workers

    report = Report()
    _serve_check(check_declared(settings, report), report, debug=debug)
    log_to_console(settings.log_format)  # the app logs the demo key at start-up
    url = f"http://{settings.host}:{settings.port}"
    try:
        with claim(settings) as listener:  # before anything reads or changes data
            _serve_check(check_database(settings, report), report, debug=debug)
            _serve_check(check_redis(settings, report), report, debug=debug)
            assert report.database is not None
            _banner(settings, url, report.database)
            if settings.workers > 1:
                started = run_workers(settings, listener)
            else:
                started = run(create_app(settings), settings, listener)
    except ServeRefused as exc:
        _fail(str(exc))
    if not started:
        raise typer.Exit(3)


def _serve_check(step: Coroutine[Any, Any, None], report: Report, *, debug: bool) -> None:
    """Run one step of the checks; show the problems it found; stop if one is blocking."""
    shown = len(report.problems)
    asyncio.run(step)
    _show_problems(report.problems[shown:], debug=debug, serving=True)
    if report.blocking:
        raise typer.Exit(1)


def _banner(settings: Settings, url: str, database: DatabaseState) -> None:
    """Where the server listens and keeps its data: a panel on a terminal; where logs are
    JSON lines (``AGENTSTREAM_LOG_FORMAT``), one more of them, so a log collector reading
    the output reads nothing but JSON."""
    data = database.where + (" (new)" if database.new else "")
    from agentstream.telemetry.logs import uses_json

    if uses_json(settings.log_format):
        logging.getLogger("agentstream").info(
            "agentstream on %s, data: %s, workers: %d", url, data, settings.workers
        )
        return
    lines = [f"[bold]agentstream[/] on {escape(url)}", f"data: {escape(data)}"]
    if settings.workers > 1:
        lines.append(f"workers: {settings.workers}")
    if settings.demo:
        chat = "agentstream chat demo" + ("" if url == DEFAULT_URL else f" --url {url}")
        lines.append(f"demo agent: [cyan]demo[/]  try [bold]{escape(chat)}[/]")
    Console().print(Panel.fit("\n".join(lines), border_style="cyan"))


@app.command("check")
@_server_command
def check_command(settings: Settings, debug: bool) -> None:
    """Check the configuration `serve` would start with, changing nothing: settings, the
    agents and models files, the database and its migrations, the models the agents name
    (their keys, or their local server), the port. Exit 1 if anything is wrong."""
    from agentstream.server.checks import check

    report = asyncio.run(check(settings))
    _show_problems(report.problems, debug=debug, serving=False)
    console = Console(highlight=False)
    for line in report.passed:
        console.print(Text.assemble(("✓ ", "green"), line), soft_wrap=True)
    if report.problems:
        count = len(report.problems)
        console.print(f"{count} problem{'s' if count > 1 else ''}", style="red")
        raise typer.Exit(1)
    console.print("ok", style="green")


@app.command()
def chat(
    agent: Annotated[str, typer.Argument(help="Agent id.")],
    url: Url = DEFAULT_URL,
    key: Key = None,
    session: Session = None,
    no_reasoning: NoReasoning = False,
) -> None:
    """Chat with an agent. Empty line or Ctrl-D quits; Ctrl-C stops the current answer."""
    console = Console(highlight=False)
    console.print(
        f"[dim]Chatting with [bold]{escape(agent)}[/] at {escape(url)}."
        " Empty line or Ctrl-D quits; Ctrl-C stops an answer.[/]"
    )
    with _friendly_errors(), Client(url, key) as client:
        while True:
            try:
                message = console.input("[bold cyan]you>[/] ").strip()
            except (EOFError, KeyboardInterrupt):
                message = ""
            if not message:
                console.print()
                return
            accumulator = RunAccumulator()
            frames = client.iter_events(
                agent, message, session_id=session, reasoning=False if no_reasoning else None
            )
            streamed: Streamed | None = None
            try:
                streamed = _stream(frames, accumulator, console, as_json=False)
                while streamed is not None and streamed.paused:
                    streamed = _ask_and_follow(client, console, streamed)
            except KeyboardInterrupt:
                frames.close()
                if accumulator.run_id:
                    _settle(client, accumulator.run_id)
                console.print("[yellow]✗ cancelled[/]")
            else:
                if streamed is None:
                    return  # left paused: its session takes no message until it is decided
            session = accumulator.session_id or session
            console.print()


@app.command()
def run(
    agent: Annotated[str, typer.Argument(help="Agent id.")],
    message: Annotated[str, typer.Argument(help="The message to send.")],
    url: Url = DEFAULT_URL,
    key: Key = None,
    session: Session = None,
    as_json: Json = False,
    no_reasoning: NoReasoning = False,
) -> None:
    """Send one message and stream the answer. Exit code 1 if the run fails; 0 if it pauses
    for an approval (decide with `agentstream approve` or `deny`)."""
    console = Console(highlight=False)
    with _friendly_errors(), Client(url, key) as client:
        frames = client.iter_events(
            agent, message, session_id=session, reasoning=False if no_reasoning else None
        )
        streamed = _stream(frames, RunAccumulator(), console, as_json)
    result = streamed.result
    if not as_json:
        tokens = f" · {result.usage.total_tokens} tokens" if result.usage else ""
        footer = f"run {result.run_id} · session {result.session_id}{tokens}"
        console.print(footer, style="dim", soft_wrap=True)
    if streamed.paused:
        if not as_json:
            _paused_hint(console, result.run_id)
        return
    if result.status == "incomplete":
        _fail(result.error or "The stream ended early")
    if not result.ok:
        raise typer.Exit(1)


@app.command()
def replay(
    run_id: Annotated[str, typer.Argument(help="Run id (from the start event).")],
    url: Url = DEFAULT_URL,
    key: Key = None,
    as_json: Json = False,
) -> None:
    """Show a stored run: who, status, duration, usage, then what happened in order."""
    with _friendly_errors(), Client(url, key) as client:
        stored = client.get_run(run_id)
    if as_json:
        typer.echo(json.dumps(stored, indent=2, ensure_ascii=False))
        return
    console = Console(highlight=False)
    usage = stored["usage"]
    duration = f"{stored['duration_ms']} ms" if stored["duration_ms"] is not None else "running"
    style = "green" if stored["status"] == "completed" else "red"
    console.print(
        f"[bold]{stored['id']}[/] · agent [cyan]{stored['agent_id']}[/] · "
        f"[{style}]{stored['status']}[/] · {duration} · {usage['total_tokens']} tokens "
        f"({usage['input_tokens']} in, {usage['output_tokens']} out)",
        soft_wrap=True,
    )
    console.print(Text.assemble(("you> ", "bold cyan"), stored["input"]), soft_wrap=True)
    renderer = StreamRenderer(console)
    for event in stored["events"]:
        frame = parse_frame(event)
        if frame is not None:
            renderer.feed(frame)
    renderer.close()


Reason = Annotated[str | None, typer.Option(help="Why: shown to the model.")]
Call = Annotated[
    str | None, typer.Option("--call", help="Only this tool call id (default: every pending).")
]


def _decision_command(*, approve: bool) -> Callable[..., None]:
    """`approve` and `deny`: the same flags and steps, but for the decision they send."""

    def decide_and_follow(
        run_id: Annotated[str, typer.Argument(help="The paused run.")],
        reason: Reason = None,
        call: Call = None,
        url: Url = DEFAULT_URL,
        key: Key = None,
        as_json: Json = False,
    ) -> None:
        console = Console(highlight=False, stderr=as_json)
        with _friendly_errors(), Client(url, key) as client:
            after = _decide(client, run_id, console, approve=approve, reason=reason, only=call)
            streamed = _follow(client, run_id, after, Console(highlight=False), as_json)
        if streamed.paused:
            if not as_json:
                _paused_hint(console, run_id)
        elif not streamed.result.ok:
            raise typer.Exit(1)

    return decide_and_follow


app.command(
    "approve", help="Let the tool calls a paused run waits for go ahead, then follow the run."
)(_decision_command(approve=True))
app.command(
    "deny",
    help="Refuse the tool calls a paused run waits for (the model is told, with --reason),\n"
    "then follow the run.",
)(_decision_command(approve=False))


@keys_app.command("create")
def create_key(
    name: Annotated[str, typer.Argument(help="A name to recognise the key by.")],
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
    create: Annotated[
        bool, typer.Option("--create", help="Start a new database if there is none yet.")
    ] = False,
) -> None:
    """Create an API key in the store and print it (only this once)."""
    settings = _settings(data_dir=data_dir, database_url=database_url)
    key = _with_store(settings, lambda store: store.create_api_key(name), create=create)
    typer.echo(key)
    Console(stderr=True).print(f"[dim]API key {name!r} created; it is not shown again.[/]")


@keys_app.command("list")
def list_keys(data_dir: DataDir = None, database_url: DatabaseUrl = None) -> None:
    """The API keys: id, name and when each was made (never the key: only its hash is kept)."""
    settings = _settings(data_dir=data_dir, database_url=database_url)
    keys = _with_store(settings, lambda store: store.list_api_keys(), create=None)
    table = Table("id", "name", "created")
    for key in keys:
        table.add_row(str(key.id), key.name, key.created_at.strftime("%Y-%m-%d %H:%M UTC"))
    Console(highlight=False).print(table)


@keys_app.command("revoke")
def revoke_key(
    which: Annotated[str, typer.Argument(help="The key's id, or its name.", metavar="ID|NAME")],
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Revoke an API key: requests with it are refused from now on."""
    settings = _settings(data_dir=data_dir, database_url=database_url)

    async def revoke(store: Store) -> str:
        keys = await store.list_api_keys()
        found = [k for k in keys if str(k.id) == which] or [k for k in keys if k.name == which]
        if not found:
            _fail(f"No API key {which!r} (an id or a name from `agentstream keys list`).")
        if len(found) > 1:
            ids = ", ".join(str(k.id) for k in found)
            _fail(f"{len(found)} keys are named {which!r} (ids {ids}): revoke one by its id.")
        await store.revoke_api_key(found[0].id)
        return f"Revoked API key {found[0].id} ({found[0].name!r})."

    typer.echo(_with_store(settings, revoke, create=None))


# Chat deployments

Access = Annotated[
    str | None,
    typer.Option(help="Who may chat: public, password, email (invited, with a code), api_key."),
]
Thinking = Annotated[
    bool | None,
    typer.Option(
        "--thinking/--no-thinking", help="Thinking frames (default off).", show_default=False
    ),
]
ToolCalls = Annotated[
    bool | None,
    typer.Option(
        "--tool-calls/--no-tool-calls",
        help="Tool lifecycle frames (default off).",
        show_default=False,
    ),
]
Password = Annotated[
    str | None,
    typer.Option(
        envvar="AGENTSTREAM_CHAT_PASSWORD",
        help="Password for --access password (or $AGENTSTREAM_CHAT_PASSWORD).",
        show_default=False,
    ),
]
Emails = Annotated[
    list[str] | None,
    typer.Option(
        "--allow-email", help="Invited address or @domain; repeat for more.", show_default=False
    ),
]
Redact = Annotated[
    bool | None,
    typer.Option(
        "--redact-pii/--no-redact-pii",
        help="Mask PII; answer text then comes settled.",
        show_default=False,
    ),
]
ClientRuns = Annotated[
    int | None,
    typer.Option(help="Answers one client may have coming at once (default 4).", min=1),
]
DeploymentRuns = Annotated[
    int | None,
    typer.Option(help="Answers coming at once, all clients together (default 100).", min=1),
]
RunsPerMinute = Annotated[
    int | None,
    typer.Option(help="Messages one client may send per minute (default 30).", min=1),
]
Title = Annotated[str | None, typer.Option(help="Title shown on the chat page.")]
Greeting = Annotated[str | None, typer.Option(help="First message shown on the chat page.")]


def _deployment_body(**options: Any) -> dict[str, Any]:
    names = {
        "thinking": "include_thinking",
        "tool_calls": "include_tool_calls",
        "emails": "allowed_emails",
        "agent": "agent_id",
        "workflow": "workflow_id",
        "redact": "redact_pii",
    }
    return {names.get(k, k): v for k, v in options.items() if v is not None}


def _print_deployments(deployments: list[dict[str, Any]], url: str) -> None:
    table = Table("slug", "serves", "access", "thinking", "tools", "redact")
    table.columns[0].no_wrap = True
    for item in deployments:
        d = item["deployment"]
        flags = [
            ("on" if d[k] else "off")
            for k in ("include_thinking", "include_tool_calls", "redact_pii")
        ]
        serves = (
            f"{d['agent_id']} v{item['agent_version']}"
            if d["agent_id"]
            else f"workflow {d['workflow_id']} v{item['workflow_version']} "
            f"({', '.join(d['output_blocks'])})"
        )
        table.add_row(d["slug"], serves, d["access"], *flags)
    console = Console(highlight=False)
    console.print(table)
    for item in deployments:
        console.print(
            f"{item['deployment']['slug']}: {url.rstrip('/')}{item['url']}", soft_wrap=True
        )
    for item in deployments:
        if reason := item.get("unavailable"):
            console.print(
                f"⚠ {item['deployment']['slug']} cannot answer yet: {reason}",
                style="yellow",
                soft_wrap=True,
            )


@deployments_app.command("list")
def list_deployments(url: Url = DEFAULT_URL, key: Key = None) -> None:
    """Every chat deployment, with its pinned agent version and settings."""
    with _friendly_errors(), Client(url, key) as client:
        _print_deployments(client.request("GET", "/api/chat-deployments"), url)


@deployments_app.command("set")
def set_deployment(
    slug: Annotated[str, typer.Argument(help="URL name: /chat/SLUG.")],
    agent: Annotated[str | None, typer.Option(help="The agent to publish.")] = None,
    workflow: Annotated[
        str | None, typer.Option(help="Or the workflow to publish (with --output-block).")
    ] = None,
    output_blocks: Annotated[
        list[str] | None,
        typer.Option(
            "--output-block",
            help="A workflow block whose output answers; repeat, in order.",
            show_default=False,
        ),
    ] = None,
    title: Title = None,
    greeting: Greeting = None,
    thinking: Thinking = None,
    tool_calls: ToolCalls = None,
    access: Access = None,
    password: Password = None,
    emails: Emails = None,
    redact: Redact = None,
    concurrent_runs_per_client: ClientRuns = None,
    concurrent_runs: DeploymentRuns = None,
    runs_per_minute_per_client: RunsPerMinute = None,
    url: Url = DEFAULT_URL,
    key: Key = None,
) -> None:
    """Publish an agent (or a workflow) as /chat/SLUG, or change a deployment's settings.
    Either way the chat serves a snapshot of it as it is now."""
    changes = _deployment_body(
        agent=agent,
        workflow=workflow,
        output_blocks=output_blocks,
        title=title,
        greeting=greeting,
        thinking=thinking,
        tool_calls=tool_calls,
        access=access,
        password=password,
        emails=emails,
        redact=redact,
        concurrent_runs_per_client=concurrent_runs_per_client,
        concurrent_runs=concurrent_runs,
        runs_per_minute_per_client=runs_per_minute_per_client,
    )
    path = f"/api/chat-deployments/{quote(slug)}"
    with _friendly_errors(), Client(url, key) as client:
        try:
            deployed = client.request("PATCH", path, json=changes)
        except APIStatusError as exc:
            if exc.status_code != 404 or exc.field != "slug":
                raise  # e.g. the agent does not exist: say that, do not try to create
            if agent is None and workflow is None:
                _fail(f"No chat deployment {slug!r} yet: pass --agent or --workflow to create it.")
            deployed = client.request(
                "POST", "/api/chat-deployments", json={"slug": slug, **changes}
            )
        _print_deployments([deployed], url)


@deployments_app.command("redeploy")
def redeploy(
    slug: Annotated[str, typer.Argument(help="The deployment.")],
    url: Url = DEFAULT_URL,
    key: Key = None,
) -> None:
    """Pick up the agent's current model, tools and instructions."""
    with _friendly_errors(), Client(url, key) as client:
        path = f"/api/chat-deployments/{quote(slug)}/redeploy"
        _print_deployments([client.request("POST", path)], url)


@deployments_app.command("delete")
def delete_deployment(
    slug: Annotated[str, typer.Argument(help="The deployment.")],
    url: Url = DEFAULT_URL,
    key: Key = None,
) -> None:
    """Unpublish the chat (its conversations and runs stay)."""
    with _friendly_errors(), Client(url, key) as client:
        client.request("DELETE", f"/api/chat-deployments/{quote(slug)}")
    typer.echo(f"Deleted {slug}")


@app.command()
def models(url: Url = DEFAULT_URL, key: Key = None, as_json: Json = False) -> None:
    """The model registry: provider, context, prices, capabilities, and whether each model
    can run on the server (its provider's key is set; a local server answers)."""
    with _friendly_errors(), Client(url, key) as client:
        listed: list[dict[str, Any]] = client.request("GET", "/api/models")
    if as_json:
        typer.echo(json.dumps(listed, indent=2))
        return
    table = Table("model", "provider", "context", "$/M in", "$/M out", "tools", "thinking", "ready")
    table.columns[0].no_wrap = True
    for item in listed:
        m, caps = item["model"], item["model"]["capabilities"]
        price = [("—" if p is None else f"{p:g}") for p in (m["input_price"], m["output_price"])]
        table.add_row(
            m["name"],
            item["provider_label"],
            f"{m['context_window']:,}" if m["context_window"] else "—",
            *price,
            "?" if caps is None else "yes" if caps["tools"] else "no",
            "?" if caps is None else caps["thinking"],
            "[green]yes[/]" if item["available"] else f"[dim]{item['unavailable_reason']}[/]",
        )
    Console().print(table)
