"""``agentstream check``, and ``serve`` running the same checks: every problem of a
configuration one or two readable lines (the file and line where there is one), never a
traceback unless asked for with ``--debug``, and nothing written while checking."""

from __future__ import annotations

import socket
import sqlite3
import textwrap
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import anyio
import pytest
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from redis.asyncio import Redis
from sqlalchemy import Connection, make_url
from sqlalchemy.ext.asyncio import create_async_engine
from typer.testing import CliRunner, Result

from agentstream import cli
from agentstream.config import Settings
from agentstream.server import checks
from agentstream.store import Store
from conftest import free_port, make_settings, serve, stream_frames

MIGRATIONS = Path(cli.__file__).parent / "store" / "migrations"


@pytest.fixture(autouse=True)
def plain_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "ANTHROPIC_API_KEY", "OLLAMA_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    for name in ("DATABASE_URL", "AGENTS_FILE", "DEMO", "PORT", "MODELS_FILE"):
        monkeypatch.delenv(f"AGENTSTREAM_{name}", raising=False)


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli.app, list(args), env={"COLUMNS": "400"})


def check(data_dir: Path, *args: str) -> Result:
    return invoke("check", "--data-dir", str(data_dir), "--port", str(free_port()), *args)


def problems(result: Result) -> list[str]:
    return result.stderr.splitlines()


def test_a_good_configuration_is_ok_and_nothing_is_created(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    result = check(data_dir, "--demo")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "✓ models ready: offline",
        f"✓ database {data_dir / 'agentstream.db'}: new (no agentstream tables yet); made at"
        " start-up",
        result.stdout.splitlines()[2],
        "ok",
    ]
    assert result.stdout.splitlines()[2].endswith(": free")
    assert not data_dir.exists(), "a check writes nothing"


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def test_every_problem_is_listed_with_its_file_and_line(tmp_path: Path) -> None:
    agents = write(
        tmp_path / "agents.yaml",
        """\
        agents:
          - id: helper
            model: claude-sonnet-4-5
          - id: local
            model: ollama:llama3.2
        """,
    )
    nothing = f"http://127.0.0.1:{free_port()}/v1"
    with closing(socket.create_server(("127.0.0.1", 0))) as taken:
        port = taken.getsockname()[1]
        result = CliRunner().invoke(
            cli.app,
            ["check", "--data-dir", str(tmp_path), "--agents", str(agents), "--port", str(port)],
            env={"COLUMNS": "400", "OLLAMA_BASE_URL": nothing},
        )
    assert result.exit_code == 1
    assert problems(result) == [
        f"{agents}:3: agent 'helper': Set ANTHROPIC_API_KEY to use claude-sonnet-4-5 (Anthropic)",
        f"{agents}:5: agent 'local': Nothing answers at {nothing} (Ollama (local)): start it,"
        " or set OLLAMA_BASE_URL",
        f"Cannot listen on 127.0.0.1:{port}: the address is in use (another server?); "
        "choose another --port",
    ]
    assert result.stdout.splitlines()[0] == f"✓ {agents}: 2 agents, 0 workflows, 0 deployments"
    assert result.stdout.splitlines()[-1] == "3 problems"


def test_a_mistake_in_the_agents_file_does_not_hide_the_others(tmp_path: Path) -> None:
    agents = write(tmp_path / "agents.yaml", "agents:\n  - id: helper\n    modle: offline\n")
    result = check(tmp_path, "--agents", str(agents), "--database-url", "mysql://h/db")
    assert result.exit_code == 1
    assert problems(result)[0] == (f"{agents}:3: agents[0].modle: Extra inputs are not permitted")
    assert problems(result)[1].startswith("Database URL mysql://h/db: not one agentstream can use")
    assert "Traceback" not in result.output


def test_a_mistake_in_the_models_file_names_file_and_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = write(
        tmp_path / "models.yaml",
        """\
        models:
          - name: mine
            provider: openai
            context_window: lots
        """,
    )
    monkeypatch.setenv("AGENTSTREAM_MODELS_FILE", str(models))
    result = check(tmp_path)
    assert result.exit_code == 1
    assert problems(result) == [
        f"{models}:4: models[0].context_window: Input should be a valid integer, unable to parse"
        " string as an integer"
    ]


def test_a_bad_setting_names_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTSTREAM_KEEPALIVE_SECONDS", "soon")
    result = invoke("check")
    assert result.exit_code == 1
    assert problems(result) == [
        "AGENTSTREAM_KEEPALIVE_SECONDS: Input should be a valid number, unable to parse string"
        " as a number (got 'soon')"
    ]


def test_a_cors_origin_with_a_path_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTSTREAM_CORS_ORIGINS", "https://app.example.com, https://x.io/app")
    result = invoke("check")
    assert result.exit_code == 1
    assert problems(result) == [
        "AGENTSTREAM_CORS_ORIGINS: 'https://x.io/app' is not an origin: write"
        " scheme://host[:port], no path (got 'https://app.example.com, https://x.io/app')"
    ]


POSTGRES = "postgresql://postgres@127.0.0.1"


def postgres_mistakes() -> Iterator[tuple[str, str]]:
    port = free_port()
    yield (
        f"postgresql://postgres@127.0.0.1:{port}/agentstream",
        f"Cannot reach PostgreSQL at 127.0.0.1:{port}: connection refused (is the server running?)",
    )
    yield (
        f"{POSTGRES}:5432/no_such_database",
        "PostgreSQL at 127.0.0.1:5432 has no database 'no_such_database': create it"
        " (createdb no_such_database) or fix the database URL",
    )
    yield (
        "postgresql://no_such_user:secret@127.0.0.1:5432/postgres",
        "PostgreSQL at 127.0.0.1:5432 refused user 'no_such_user': role \"no_such_user\" does"
        " not exist; check the user and password in the database URL",
    )


@pytest.mark.parametrize(
    ("url", "message"),
    list(postgres_mistakes()),
    ids=["server down", "no such database", "no such user"],  # the same in every test worker
)
@pytest.mark.parametrize("command", ["check", "serve"])
def test_a_postgresql_mistake_is_one_line_for_check_and_serve(
    postgres_url: str, tmp_path: Path, url: str, message: str, command: str
) -> None:
    args = [command, "--database-url", url, "--port", str(free_port())]
    result = invoke(*args, "--data-dir", str(tmp_path / "data"))
    assert result.exit_code == 1
    assert problems(result) == [message]
    assert "secret" not in result.output
    assert "Traceback" not in result.output


def test_serve_shows_the_traceback_with_debug(tmp_path: Path) -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/agentstream"
    result = invoke("serve", "--database-url", url, "--port", str(free_port()), "--debug")
    assert result.exit_code == 1
    assert "Cannot reach PostgreSQL" in result.stderr
    assert "Traceback" in result.stderr
    assert "ConnectionRefusedError" in result.stderr


def test_postgresql_urls_get_their_async_driver(postgres_url: str, tmp_path: Path) -> None:
    plain = make_url(postgres_url).set(drivername="postgresql").render_as_string(False)
    assert plain.startswith("postgresql://")
    assert Settings(database_url=plain).database == postgres_url
    assert Settings(database_url="postgres://h/db").database == "postgresql+asyncpg://h/db"
    assert Settings(database_url="sqlite:///x.db").database == "sqlite+aiosqlite:///x.db"
    with serve(make_settings(tmp_path, database_url=plain)) as live:
        _, frames = stream_frames(live, "demo", {"message": "What is 17 * 23?"})
    assert frames[-1]["content"] == "The answer is 391."
    result = check(tmp_path, "--database-url", plain)
    assert result.exit_code == 0, result.output
    assert "(the latest)" in result.stdout


def previous_and_head() -> tuple[str, str]:
    script = ScriptDirectory(str(MIGRATIONS))
    current = script.get_current_head()
    assert current is not None
    head = script.get_revision(current)
    assert head is not None
    assert isinstance(head.down_revision, str)
    return head.down_revision, head.revision


def upgrade_to(database: Path, revision: str) -> None:
    async def upgrade() -> None:
        engine = create_async_engine(f"sqlite+aiosqlite:///{database}")

        def run(connection: Connection) -> None:
            config = Config()
            config.set_main_option("script_location", str(MIGRATIONS))
            config.attributes["connection"] = connection
            command.upgrade(config, revision)

        async with engine.begin() as connection:
            await connection.run_sync(run)
        await engine.dispose()

    anyio.run(upgrade)


def test_check_says_which_migrations_start_up_applies(tmp_path: Path) -> None:
    previous, head = previous_and_head()
    database = tmp_path / "agentstream.db"
    upgrade_to(database, previous)
    before = database.read_bytes()
    result = check(tmp_path)
    assert result.exit_code == 0, result.output
    assert f"✓ database {database}: at migration {previous}; start-up applies {head}" in (
        result.stdout.splitlines()
    )
    assert database.read_bytes() == before, "a check migrates nothing"


def test_a_database_newer_than_this_version_is_a_problem(tmp_path: Path) -> None:
    database = tmp_path / "agentstream.db"
    upgrade_to(database, previous_and_head()[1])
    with closing(sqlite3.connect(database)) as db, db:
        db.execute("update alembic_version set version_num = '9999'")
    result = check(tmp_path)
    assert result.exit_code == 1
    assert problems(result) == [
        f"{database}: the database is at migration 9999, which this version of agentstream"
        " does not know (was it made by a newer one?)"
    ]


def test_stored_agents_models_are_checked_too(tmp_path: Path) -> None:
    from agentstream.agents import AgentSpec

    async def store_agent() -> None:
        store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'agentstream.db'}")
        await store.put_agent(AgentSpec(id="api-made", model="anthropic:claude-3-5-haiku-latest"))
        await store.close()

    anyio.run(store_agent)
    result = check(tmp_path)
    assert result.exit_code == 1
    assert problems(result) == [
        f"{tmp_path / 'agentstream.db'}: agent 'api-made' (stored): Set ANTHROPIC_API_KEY to use"
        " anthropic:claude-3-5-haiku-latest (Anthropic)"
    ]


def test_serve_warns_about_a_model_that_cannot_run_and_starts(tmp_path: Path) -> None:
    """A missing key stops only the agents that need it: serve says so and goes on (here it
    then stops at the taken port, after the warning)."""
    agents = write(tmp_path / "agents.yaml", "agents:\n  - {id: helper, model: gpt-4.1}\n")
    with closing(socket.create_server(("127.0.0.1", 0))) as taken:
        port = str(taken.getsockname()[1])
        result = CliRunner().invoke(
            cli.app,
            ["serve", "--agents", str(agents), "--data-dir", str(tmp_path), "--port", port],
            env={"COLUMNS": "400", "OPENAI_API_KEY": ""},
        )
    assert problems(result) == [
        f"warning: {agents}:2: agent 'helper': Set OPENAI_API_KEY to use gpt-4.1 (OpenAI)",
        f"Cannot listen on 127.0.0.1:{port}: the address is in use (another server?); "
        "choose another --port",
    ]


@pytest.mark.parametrize("command", ["check", "serve"])
def test_a_redis_that_does_not_answer_is_one_line_for_check_and_serve(
    postgres_url: str, tmp_path: Path, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = f"127.0.0.1:{free_port()}/0"
    monkeypatch.setenv("AGENTSTREAM_REDIS_URL", f"redis://{where}")
    args = [command, "--database-url", postgres_url, "--port", str(free_port())]
    result = invoke(*args, "--data-dir", str(tmp_path / "data"))
    assert result.exit_code == 1
    assert problems(result) == [
        f"Cannot reach Redis at {where}: connection refused (is the server running?)"
    ]


@pytest.mark.parametrize("command", ["check", "serve"])
def test_a_redis_older_than_the_live_log_needs_is_one_line_for_check_and_serve(
    postgres_url: str, tmp_path: Path, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The live log trims by seq (``XADD ... MINID``, Redis 6.2): on an older server every
    event's write would be refused, and viewers elsewhere would see none."""

    async def info(self: Redis, section: str) -> dict[str, str]:
        return {"redis_version": "6.0.16"}

    monkeypatch.setattr(Redis, "info", info)
    monkeypatch.setenv("AGENTSTREAM_REDIS_URL", "redis://127.0.0.1:6379/0")
    args = [command, "--database-url", postgres_url, "--port", str(free_port())]
    result = invoke(*args, "--data-dir", str(tmp_path / "data"))
    assert result.exit_code == 1
    assert problems(result) == [
        "Redis at 127.0.0.1:6379/0 is 6.0.16: cluster mode needs 6.2 or later"
    ]


@pytest.mark.parametrize(
    ("version", "older"),
    [
        ("6.0.16", True),
        ("5.0.14", True),
        ("6.2.0", False),
        ("6.2.0-rc1", False),
        ("7.2.4", False),
        ("10.0.0", False),
        ("v7.0", False),  # another form: not judged
        ("7", False),
    ],
)
def test_a_redis_version_is_older_by_its_major_and_minor(version: str, older: bool) -> None:
    assert checks._older(version, checks.REDIS_NEEDED) is older


def test_check_says_that_redis_answers(
    postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTSTREAM_REDIS_URL", "redis://127.0.0.1:6379/0")
    result = invoke("check", "--database-url", postgres_url, "--port", str(free_port()))
    assert result.exit_code == 0, result.output
    assert "Redis at 127.0.0.1:6379/0: answers (keys under 'agentstream')" in result.stdout
