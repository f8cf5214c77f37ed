"""The ``agentstream`` command against a real server (output is not a TTY here)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from sqlalchemy import make_url
from typer.testing import CliRunner, Result

from agentstream import cli
from agentstream.client import Client, parse_frame
from agentstream.views.native import NativeFrame
from conftest import LiveServer, free_port, make_settings, serve, wait_until

QUESTION = "What is 17 * 23?"


@pytest.fixture(autouse=True)
def plain_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "AGENTSTREAM_URL", "AGENTSTREAM_API_KEY"):
        monkeypatch.delenv(name, raising=False)


def invoke(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli.app, list(args), input=input)


def store_of(server: LiveServer) -> tuple[str, ...]:
    """The flags that point a command at the server's data: its data directory, or its
    PostgreSQL database (``make test-postgresql``)."""
    if server.settings.database_url:
        return ("--database-url", server.settings.database_url)
    return ("--data-dir", str(server.settings.data_dir))


def where_data_is(server: LiveServer) -> str:
    """How a command names the server's data: its SQLite file, or its database's URL."""
    if server.settings.database_url:
        return make_url(server.settings.database).render_as_string(hide_password=True)
    return str(server.settings.data_dir / "agentstream.db")


def against(server: LiveServer, *args: str, key: str | None = None) -> list[str]:
    return [*args, "--url", server.url, "--key", key or server.key]


def footer_run_id(output: str) -> str:
    return output.rsplit("run ", 1)[1].split()[0]


@pytest.mark.parametrize(("one", "other"), [("serve", "check"), ("approve", "deny")])
def test_twin_commands_take_the_same_flags(one: str, other: str) -> None:
    """`check` checks what `serve` would start with, and `deny` is `approve`'s opposite:
    each pair has one list of flags (and its own help)."""
    commands = typer.main.get_group(cli.app).commands
    flags = {name: [p.opts for p in commands[name].params] for name in (one, other)}
    assert flags[one] == flags[other]
    assert commands[one].help != commands[other].help


def test_run_renders_tools_and_answer(server: LiveServer) -> None:
    result = invoke(*against(server, "run", "demo", QUESTION))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    tool_line = lines.index("⚙ calculator(expression='17 * 23')")
    assert lines[tool_line + 1] == "  ✓ 391"
    assert "The answer is 391." in lines[tool_line + 2 :]
    answer = lines.index("The answer is 391.")
    assert lines[answer - 1].startswith("💭 "), "no blank lines from the step separator"
    assert any(line.startswith("💭 ") and "calculator" in line for line in lines[:tool_line])
    with Client(server.url, server.key) as client:
        stored = client.get_run(footer_run_id(result.output))
    assert stored["content"] == "The answer is 391."


def test_run_json_prints_one_frame_per_line(server: LiveServer) -> None:
    result = invoke(*against(server, "run", "demo", QUESTION, "--json"))
    assert result.exit_code == 0, result.output
    frames = [json.loads(line) for line in result.stdout.splitlines()]
    assert all(parse_frame(frame) is not None for frame in frames)
    assert [frames[0]["event"], frames[-1]["event"]] == ["start", "complete"]
    assert frames[-1]["content"] == "The answer is 391."
    assert {"event": "tool_result"}.items() <= next(
        f for f in frames if f["event"] == "tool_result"
    ).items()


def test_run_continues_a_session(server: LiveServer) -> None:
    first = invoke(*against(server, "run", "demo", "Hello"))
    session = first.output.split("session ")[1].split()[0]
    second = invoke(*against(server, "run", "demo", "Hello again", "--session", session))
    assert second.exit_code == 0, second.output
    assert f"session {session}" in second.output


def test_run_failure_exits_1(tmp_path: Path) -> None:
    with serve(make_settings(tmp_path, offline_token_delay=0.05)) as live:
        agent = {"id": "hasty", "tools": ["calculator"], "timeout_seconds": 0.1}
        with live.client() as http:
            assert http.post("/api/agents", json=agent).status_code == 201
        result = invoke(*against(live, "run", "hasty", QUESTION))
    assert result.exit_code == 1
    assert "✗ run timeout" in result.output
    assert "Traceback" not in result.output


def test_replay_shows_the_stored_run(server: LiveServer) -> None:
    run_id = footer_run_id(invoke(*against(server, "run", "demo", QUESTION)).output)
    result = invoke(*against(server, "replay", run_id))
    assert result.exit_code == 0, result.output
    header, prompt, *timeline = result.output.splitlines()
    assert header.startswith(f"{run_id} · agent demo · completed · ")
    assert header.endswith("96 tokens (49 in, 47 out)")
    assert prompt == f"you> {QUESTION}"
    assert timeline == [
        "💭 The user asks: 'What is 17 * 23?'. I should not guess, so I will call calculator"
        ' with {"expression": "17 * 23"}.',
        "⚙ calculator(expression='17 * 23')",
        "  ✓ 391",
        "💭 I have the tool results now, so I can answer directly from them.",
        "The answer is 391.",
    ]

    raw = invoke(*against(server, "replay", run_id, "--json"))
    assert json.loads(raw.stdout)["tool_calls"][0]["result"] == 391


def test_chat_keeps_the_session_and_ctrl_c_cancels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, Any]] = []
    starts: list[NativeFrame] = []
    real_iter_events = Client.iter_events

    def recording(self: Client, agent: str, message: str, **kwargs: Any) -> Iterator[NativeFrame]:
        calls.append({"message": message, **kwargs})
        for frame in real_iter_events(self, agent, message, **kwargs):
            if frame.event == "start":
                starts.append(frame)
            yield frame

    real_feed = cli.StreamRenderer.feed

    def impatient(self: cli.StreamRenderer, frame: NativeFrame) -> None:
        if frame.event == "reasoning_delta" and len(calls) == 1:
            raise KeyboardInterrupt  # the user presses Ctrl-C mid-answer
        real_feed(self, frame)

    monkeypatch.setattr(Client, "iter_events", recording)
    monkeypatch.setattr(cli.StreamRenderer, "feed", impatient)
    with serve(make_settings(tmp_path, offline_token_delay=0.05)) as live:
        result = invoke(*against(live, "chat", "demo"), input=f"{QUESTION}\nHello\n\n")
        assert result.exit_code == 0, result.output
        with Client(live.url, live.key) as client:
            first = starts[0]
            assert first.event == "start"
            wait_until(lambda: client.get_run(first.run_id)["status"] != "running")
            assert client.get_run(first.run_id)["status"] == "cancelled"
    assert "✗ cancelled" in result.output
    assert "Hi! I'm the offline demo model" in result.output
    assert [c["message"] for c in calls] == [QUESTION, "Hello"]
    assert calls[0]["session_id"] is None
    assert calls[1]["session_id"] == first.session_id


def test_keys_create_prints_a_working_key(server: LiveServer) -> None:
    result = invoke("keys", "create", "ci", *store_of(server))
    assert result.exit_code == 0, result.output
    key = result.stdout.strip()
    assert key.startswith("as_")
    assert key != server.key
    assert "not shown again" in result.stderr
    with httpx.Client(base_url=server.url) as http:
        assert http.get("/api/agents", headers={"apikey": key}).status_code == 200
        assert http.get("/api/agents", headers={"apikey": key + "x"}).status_code == 401


def test_keys_create_makes_a_new_database_only_when_asked(tmp_path: Path) -> None:
    database = tmp_path / "elsewhere" / "agentstream.db"
    refused = invoke("keys", "create", "ci", "--data-dir", str(database.parent))
    assert refused.exit_code == 1
    assert refused.stderr == (
        f"No agentstream data in {database}: run this where the server keeps its data, or pass"
        " --data-dir or --database-url, or --create to start a new one.\n"
    )
    assert not database.parent.exists()
    created = invoke("keys", "create", "ci", "--data-dir", str(database.parent), "--create")
    assert created.exit_code == 0, created.output
    assert created.stderr.splitlines()[0] == f"data: {database} (new)"
    assert database.exists()


def test_keys_list_shows_no_key_and_a_revoked_key_stops_working_at_once(
    server: LiveServer,
) -> None:
    data_dir = store_of(server)
    key = invoke("keys", "create", "ci", *data_dir).stdout.strip()
    with httpx.Client(base_url=server.url) as http:
        assert http.get("/api/agents", headers={"apikey": key}).status_code == 200

        listed = invoke("keys", "list", *data_dir)
        assert listed.exit_code == 0, listed.output
        assert listed.stderr == f"data: {where_data_is(server)}\n"
        rows = [line.split("│")[1:-1] for line in listed.stdout.splitlines() if "│" in line]
        assert "┃ id ┃ name ┃ created" in listed.stdout
        assert [[cell.strip() for cell in row[:2]] for row in rows] == [
            ["1", "demo"],
            ["2", "ci"],
        ]
        assert key not in listed.output
        assert server.key not in listed.output

        revoked = invoke("keys", "revoke", "ci", *data_dir)
        assert revoked.exit_code == 0, revoked.output
        assert revoked.stdout == "Revoked API key 2 ('ci').\n"
        assert http.get("/api/agents", headers={"apikey": key}).status_code == 401
        assert http.get("/api/agents", headers={"apikey": server.key}).status_code == 200


def test_keys_revoke_by_id_when_names_are_shared(server: LiveServer) -> None:
    data_dir = store_of(server)
    first, second = (invoke("keys", "create", "ci", *data_dir).stdout.strip() for _ in "12")
    ambiguous = invoke("keys", "revoke", "ci", *data_dir)
    assert ambiguous.exit_code == 1
    assert ambiguous.stderr.splitlines()[-1] == (
        "2 keys are named 'ci' (ids 2, 3): revoke one by its id."
    )
    assert invoke("keys", "revoke", "3", *data_dir).exit_code == 0
    unknown = invoke("keys", "revoke", "3", *data_dir)
    assert unknown.exit_code == 1
    assert unknown.stderr.splitlines()[-1] == (
        "No API key '3' (an id or a name from `agentstream keys list`)."
    )
    with httpx.Client(base_url=server.url) as http:
        assert http.get("/api/agents", headers={"apikey": first}).status_code == 200
        assert http.get("/api/agents", headers={"apikey": second}).status_code == 401


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("run", "demo", "hi"), "Error 401: Missing or invalid API key"),
        (("replay", "run_x"), "Error 401: Missing or invalid API key"),
    ],
)
def test_bad_key_is_one_readable_line(
    server: LiveServer, args: tuple[str, ...], message: str
) -> None:
    result = invoke(*against(server, *args, key="wrong"))
    assert result.exit_code == 1
    assert result.output.startswith(message)
    assert "AGENTSTREAM_API_KEY" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_unknown_agent_and_run_exit_1(server: LiveServer) -> None:
    result = invoke(*against(server, "run", "nope", "hi"))
    assert (result.exit_code, result.output) == (1, "Error 404: No agent 'nope'.\n")
    result = invoke(*against(server, "replay", "run_x"))
    assert (result.exit_code, result.output) == (1, "Error 404: No run 'run_x'.\n")


def test_no_server_says_how_to_start_one() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = invoke("run", "demo", "hi", "--url", url, "--key", "k")
    assert result.exit_code == 1
    assert f"Could not reach the agentstream server at {url}" in result.output
    assert "agentstream serve --demo" in result.output
    assert "Traceback" not in result.output


def test_serve_starts_the_demo_and_logs_its_key(tmp_path: Path) -> None:
    port = free_port()
    command = Path(sys.executable).with_name("agentstream")
    args = [str(command), "serve", "--demo", "--port", str(port), "--data-dir", str(tmp_path)]
    process = subprocess.Popen(
        args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: process.poll() is not None or _healthy(url), timeout=30)
        key = (tmp_path / "demo-key").read_text().strip()
        with Client(url, key) as client:
            assert client.run("demo", QUESTION).content == "The answer is 391."
    finally:
        process.terminate()
        output, _ = process.communicate(timeout=10)
    assert url in output
    assert f"Demo API key: {key}" in output


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz").status_code == 200
    except httpx.TransportError:
        return False


def test_deployments_lifecycle(server: LiveServer) -> None:
    common = ["--url", server.url, "--key", server.key]
    created = invoke(
        *[
            "deployments",
            "set",
            "cli-chat",
            "--agent",
            "demo",
            "--thinking",
            "--access",
            "password",
            "--password",
            "long enough",
            *common,
        ],
    )
    assert created.exit_code == 0, created.output
    assert "cli-chat" in created.output
    listed = invoke(*["deployments", "list", *common])
    assert "your-slug" in listed.output
    assert "cli-chat" in listed.output
    updated = invoke(
        *["deployments", "set", "cli-chat", "--tool-calls", "--runs-per-minute-per-client", "5"],
        *common,
    )
    assert updated.exit_code == 0, updated.output
    with server.client() as client:
        stored = client.get("/api/chat-deployments/cli-chat").json()
    assert stored["deployment"]["runs_per_minute_per_client"] == 5
    assert stored["deployment"]["include_thinking"] is True
    assert stored["deployment"]["include_tool_calls"] is True
    assert stored["has_password"] is True
    assert invoke(*["deployments", "redeploy", "cli-chat", *common]).exit_code == 0
    assert invoke(*["deployments", "delete", "cli-chat", *common]).exit_code == 0
    missing = invoke(*["deployments", "delete", "cli-chat", *common])
    assert missing.exit_code == 1
    assert "No chat deployment 'cli-chat'" in missing.output


def test_deployments_set_warns_when_the_model_cannot_run(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with server.client() as client:
        client.post("/api/agents", json={"id": "keyless", "model": "gpt-4o-mini"})
    common = ["--url", server.url, "--key", server.key]
    created = invoke("deployments", "set", "keyless", "--agent", "keyless", *common)
    assert created.exit_code == 0, created.output
    warnings = [line for line in created.output.splitlines() if line.startswith("⚠")]
    assert warnings == [
        "⚠ keyless cannot answer yet: Set OPENAI_API_KEY to use gpt-4o-mini (OpenAI)"
    ]
    fine = invoke("deployments", "set", "fine", "--agent", "demo", *common)
    assert "⚠" not in fine.output


def test_deploy_a_workflow(server: LiveServer) -> None:
    common = ["--url", server.url, "--key", server.key]
    args = ["deployments", "set", "cli-flow", "--workflow", "demo-parallel"]
    blocks = ["--output-block", "clock", "--output-block", "arithmetic"]
    created = invoke(*args, *blocks, *common)
    assert created.exit_code == 0, created.output
    assert "workflow demo-parallel" in " ".join(created.output.split())
    with server.client() as client:
        stored = client.get("/api/chat-deployments/cli-flow").json()
    assert stored["deployment"]["output_blocks"] == ["clock", "arithmetic"]
    assert stored["workflow_version"] == 1
    refused = invoke(*args, "--output-block", "nope", *common)
    assert refused.exit_code == 1
    assert "nope" in refused.output


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server whose ``guarded`` agent asks before each calculator call."""
    from agentstream.agents import AgentSpec

    agent = AgentSpec(id="guarded", tools=["calculator"], approval_required=["calculator"])
    with serve(make_settings(tmp_path_factory.mktemp("guarded")), agents=[agent]) as live:
        yield live


def paused_run(server: LiveServer) -> str:
    result = invoke(*against(server, "run", "guarded", "What is 6 * 7?"))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    run_id = footer_run_id(result.output)
    waiting = lines.index("⏸ calculator(expression='6 * 7') waits for approval")
    assert lines[waiting - 1] == "⚙ calculator(expression='6 * 7')"
    assert (
        lines[-1]
        == f"⏸ paused: agentstream approve {run_id}  ·  agentstream deny {run_id} --reason …"
    )
    return run_id


def test_run_shows_the_pause_and_approve_continues_it(guarded: LiveServer) -> None:
    run_id = paused_run(guarded)
    approved = invoke(*against(guarded, "approve", run_id))
    assert approved.exit_code == 0, approved.output
    lines = approved.output.splitlines()
    assert lines[0] == "✓ approved calculator(expression='6 * 7')"
    assert lines[1] == "  ✓ 42"
    assert "The answer is 42." in lines[2:]
    with Client(guarded.url, guarded.key) as client:
        assert client.get_run(run_id)["status"] == "completed"
    again = invoke(*against(guarded, "approve", run_id))
    assert again.exit_code == 1
    assert f"Run {run_id} is not waiting for approval (status: completed)." in again.output


def test_deny_tells_the_model_why(guarded: LiveServer) -> None:
    run_id = paused_run(guarded)
    denied = invoke(*against(guarded, "deny", run_id, "--reason", "not today"))
    assert denied.exit_code == 0, denied.output
    assert denied.output.splitlines()[0] == "✗ denied calculator(expression='6 * 7')"
    assert "The calculator tool failed: demo denied this call: not today" in denied.output


@pytest.mark.parametrize(("answer", "said"), [("y", "✓ approved"), ("n", "✗ denied")])
def test_chat_asks_to_approve_then_goes_on(guarded: LiveServer, answer: str, said: str) -> None:
    result = invoke(*against(guarded, "chat", "guarded"), input=f"What is 6 * 7?\n{answer}\n\n")
    assert result.exit_code == 0, result.output
    assert "⏸ calculator(expression='6 * 7') waits for approval" in result.output
    assert "Approve calculator(expression='6 * 7')? [y/N]" in result.output
    assert f"{said} calculator(expression='6 * 7')" in result.output
    expected = "The answer is 42." if answer == "y" else "demo denied this call"
    assert expected in result.output
