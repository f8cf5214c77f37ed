"""A database written before runs and workflow executions shared one table (revision 0008),
migrated as the server starts, loses nothing: every replay gives exactly the frames it gave
before, on SQLite and on PostgreSQL.

``fixtures/migration_0008.sql`` is the ``sqlite3 .dump`` of a database that the server of
commit aee29a2 wrote (an agent run with tool calls and reasoning, an orchestration, and
workflow executions that completed with agent blocks, failed, were cancelled, or ran as a
canvas draft); ``fixtures/migration_0008_replays.json`` holds what that server answered to
each run's and execution's record, stream and canvas replay. Ids and times are those of the
fixture, so the comparison is exact, but for one change made on purpose since: a canvas
replay no longer has the live-only ``stream:*`` frames (spec 000, "Reconnect").
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Integer, MetaData, create_engine, make_url, select
from sqlalchemy.ext.asyncio import create_async_engine

from agentstream.store import Store
from agentstream.views.canvas import LIVE_ONLY
from conftest import LiveServer, make_settings, new_postgres_database, postgres_admin, serve

FIXTURES = Path(__file__).with_name("fixtures")
DUMP = FIXTURES / "migration_0008.sql"
REPLAYS: dict[str, dict[str, dict[str, str]]] = json.loads(
    (FIXTURES / "migration_0008_replays.json").read_text(encoding="utf-8")
)


def _without_live_only(canvas: str) -> str:
    """A canvas replay of the fixture's server, less the frames no replay has any more."""
    frames = canvas.removesuffix("\n\n").split("\n\n")
    kept = [f for f in frames if json.loads(f.partition("data: ")[2])["type"] not in LIVE_ONLY]
    return "".join(f"{frame}\n\n" for frame in kept)


for _replay in REPLAYS["executions"].values():
    _replay["canvas"] = _without_live_only(_replay["canvas"])
MIGRATIONS = Path(__file__).parents[1] / "src" / "agentstream" / "store" / "migrations"


def replays(live: LiveServer) -> dict[str, dict[str, dict[str, str]]]:
    """What the server answers now for each run and execution of the fixture."""
    with live.client() as client:
        return {
            "agent_runs": {
                run_id: {
                    "record": as_of_fixture(client.get(f"/api/agents/runs/{run_id}").json()),
                    "stream": client.get(f"/api/agents/runs/{run_id}/stream").text,
                }
                for run_id in REPLAYS["agent_runs"]
            },
            "executions": {
                execution_id: {
                    "record": client.get(f"/api/workflows/executions/{execution_id}").text,
                    "stream": client.get(f"/api/workflows/executions/{execution_id}/stream").text,
                    "canvas": client.get(f"/api/workflows/executions/{execution_id}/canvas").text,
                }
                for execution_id in REPLAYS["executions"]
            },
        }


def as_of_fixture(record: dict[str, Any]) -> str:
    """An agent run's record as the fixture's server rendered it: without the fields added
    since (the parent run, step and tool call timings), which are checked here instead."""
    assert record.pop("parent_run_id") is None  # no run had a recorded parent then
    steps = record.pop("steps")
    assert [step["step"] for step in steps] == list(range(1, len(steps) + 1))
    assert all(step["duration_ms"] >= 0 for step in steps)
    for call in record["tool_calls"]:
        assert call.pop("duration_ms") >= 0
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def load_dump(path: Path) -> None:
    with closing(sqlite3.connect(path)) as db:
        db.executescript(DUMP.read_text(encoding="utf-8"))


def test_a_sqlite_database_of_revision_0008_migrates_and_replays_the_same_frames(
    tmp_path: Path,
) -> None:
    database = tmp_path / "agentstream.db"
    load_dump(database)
    with serve(make_settings(tmp_path, database_url=None)) as live:  # that SQLite file
        assert replays(live) == REPLAYS
    with closing(sqlite3.connect(database)) as db:
        tables = {name for (name,) in db.execute("select name from sqlite_master")}
        assert not {"workflow_executions", "workflow_events"} & tables
        kinds = dict(db.execute("select kind, count(*) from runs group by kind"))
        assert kinds == {"agent": 3, "workflow": 4}  # with the orchestration's entity run
        rows = db.execute("select type, payload from run_events").fetchall()
        assert len(rows) == 45 + 76  # every event of both tables
        assert all(json.loads(payload)["type"] == kind for kind, payload in rows)
        assert not db.execute("pragma foreign_key_check").fetchall()


def test_deleting_a_migrated_session_deletes_its_runs_and_their_events(tmp_path: Path) -> None:
    database = tmp_path / "agentstream.db"
    load_dump(database)
    run_id = next(iter(REPLAYS["agent_runs"]))
    with serve(make_settings(tmp_path, database_url=None)) as live, live.client() as client:
        session_id = client.get(f"/api/agents/runs/{run_id}").json()["session_id"]
        assert client.delete(f"/api/sessions/{session_id}").status_code == 204
        assert client.get(f"/api/agents/runs/{run_id}").status_code == 404
    with closing(sqlite3.connect(database)) as db:
        left = db.execute("select count(*) from run_events where run_id = ?", (run_id,))
        assert left.fetchone() == (0,)


@pytest.fixture
def postgres_at_0008(postgres_url: str) -> Iterator[str]:
    """A database of its own (the session's shared one is at the latest revision)."""
    name = f"agentstream_migration_{uuid.uuid4().hex[:12]}"
    postgres_admin(f'CREATE DATABASE "{name}"')
    url = make_url(postgres_url).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        postgres_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_postgresql_database_of_revision_0008_migrates_and_replays_the_same_frames(
    tmp_path: Path, postgres_at_0008: str
) -> None:
    """The fixture's rows copied into PostgreSQL at revision 0008, then the server starts."""
    source = tmp_path / "fixture.db"
    load_dump(source)
    anyio.run(copy_at_0008, source, postgres_at_0008)
    with serve(make_settings(tmp_path, database_url=postgres_at_0008)) as live:
        assert replays(live) == REPLAYS


async def copy_at_0008(source: Path, url: str) -> None:
    engine = create_async_engine(url)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(copy_rows, source)
    finally:
        await engine.dispose()


def copy_rows(target: Connection, source: Path) -> None:
    """Migrate ``target`` to 0008, then insert every row of ``source`` (SQLite) into it."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = target
    command.upgrade(config, "0008")
    schema = MetaData()
    schema.reflect(target)
    origin = create_engine(f"sqlite:///{source}")
    origin_schema = MetaData()
    origin_schema.reflect(origin, only=[t.name for t in schema.sorted_tables])
    with origin.connect() as rows:
        for table in schema.sorted_tables:
            if table.name == "alembic_version":
                continue
            found = [_aware(row) for row in rows.execute(select(origin_schema.tables[table.name]))]
            if found:
                target.execute(table.insert(), found)
            if "id" in table.c and isinstance(table.c.id.type, Integer) and found:
                serial = f"pg_get_serial_sequence('{table.name}', 'id')"
                target.exec_driver_sql(
                    f"SELECT setval({serial}, (SELECT max(id) FROM {table.name}))"
                )
    origin.dispose()


def _aware(row: Any) -> dict[str, Any]:
    """SQLite keeps UTC times without their zone."""
    return {
        key: value.replace(tzinfo=UTC) if isinstance(value, datetime) else value
        for key, value in row._mapping.items()
    }


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database of this test's own: its migrations go down and up again."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}"
        return
    with new_postgres_database() as url:
        yield url


def test_the_definitions_counter_moves_at_each_change_by_sql_and_its_migration_goes_both_ways(
    database_url: str,
) -> None:
    """Migration 0014's triggers move ``definitions_revision`` at every change to a
    definition, made by a bare SQL statement too, and not at a save that changes nothing;
    the migration goes down and up again, and the counter then starts somewhere else."""
    agent = (
        "INSERT INTO agents (id, version, spec, created_at, updated_at) VALUES "
        "('counted', 1, '{}', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP) ON CONFLICT DO NOTHING"
    )
    changes = [
        agent,
        agent,  # finds the row: no change
        "UPDATE agents SET version = 2 WHERE id = 'counted'",
        "DELETE FROM agents WHERE id = 'counted'",
    ]

    def revisions(connection: Connection) -> list[int]:
        def revision() -> int:
            return int(
                connection.exec_driver_sql("SELECT revision FROM definitions_revision").scalar_one()
            )

        seen = [revision()]
        for change in changes:
            connection.exec_driver_sql(change)
            connection.commit()
            seen.append(revision())
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        config.attributes["connection"] = connection
        command.downgrade(config, "0013")
        command.upgrade(config, "head")
        connection.commit()
        return [*seen, revision()]

    async def check() -> list[int]:
        await (await Store.open(database_url)).close()  # at the latest revision
        engine = create_async_engine(database_url)
        try:
            async with engine.connect() as connection:
                return await connection.run_sync(revisions)
        finally:
            await engine.dispose()

    start, inserted, unchanged, updated, deleted, again = anyio.run(check)
    assert (inserted, unchanged, updated, deleted) == (start + 1, start + 1, start + 2, start + 3)
    assert again not in range(start, deleted + 1)
