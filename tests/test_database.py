"""The store on a real database: grouped inserts (a bad row fails only its own caller, and a
row whose write failed is never written later), and the one run path that agent runs and
workflow executions share."""

from __future__ import annotations

import asyncio
import functools
import itertools
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, closing, contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import asyncpg
import pytest
from sqlalchemy import Connection, event, insert, select
from sqlalchemy.exc import IntegrityError, StatementError
from sqlalchemy.ext.asyncio import create_async_engine

from agentstream.agents import AgentSpec, StoredAgent
from agentstream.deployments import DeploymentSettings
from agentstream.errors import Conflict
from agentstream.events import (
    INTERRUPTED,
    BaseEvent,
    BlockOutput,
    Event,
    Reasoning,
    RunCompleted,
    RunFailed,
    RunStarted,
    StepCompleted,
    StepStarted,
    Text,
    ToolCall,
    ToolResult,
    Usage,
)
from agentstream.providers.base import (
    Message,
    ModelPart,
    ModelRequest,
    ReasoningSummaryPart,
    TextPart,
    ToolCallArgsPart,
    ToolCallEndPart,
    ToolCallStartPart,
    TurnEndPart,
)
from agentstream.providers.scripted import ScriptedModel
from agentstream.runlog import RunLog
from agentstream.runtime import leases as leases_module
from agentstream.runtime.agent import AgentState, run_agent
from agentstream.runtime.context import RunContext
from agentstream.runtime.leases import SEAL_GAP, Leases
from agentstream.runtime.supervisor import Stopped, Supervisor
from agentstream.runtime.tools import Tool
from agentstream.store import Store
from agentstream.store.clock import now
from agentstream.store.database import Database, NewRow, UnknownColumns, add
from agentstream.store.definitions_cache import one_request
from agentstream.store.processes import ProcessStore
from agentstream.store.sqlite_file import SQLiteFile
from agentstream.store.tables import Base, MessageRow, RunEventRow, RunRow, SessionRow
from agentstream.store.workflows import WorkflowStore
from agentstream.workflows import Workflow, parse_workflow
from conftest import through_sqlalchemy

pytestmark = pytest.mark.anyio


OWNER = "prc_test"
"""The process the runs of these tests belong to (not registered: a dead one)."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def create_run(store: Store, run_id: str, session_id: str, owner: str = OWNER) -> None:
    """A run of agent "a" in a new session, executed by ``owner``."""
    agent = await store.get_agent("a") or await store.put_agent(AgentSpec(id="a"))
    first = RunStarted(run_id=run_id, seq=1, ts=time.time(), agent_id="a", session_id=session_id)
    await store.create_run(
        run_id=run_id,
        agent=agent,
        session_id=session_id,
        new_session=True,
        input="hi",
        reasoning_requested=False,
        first_events=[first],
        owner=owner,
    )


Sent = list[tuple[str, Any]]
"""Statements, each with its parameters (a list of them for an ``executemany``)."""


@pytest.fixture
def sent_to_sqlite(monkeypatch: pytest.MonkeyPatch) -> Sent:
    """Each statement the ``sqlite3`` driver is sent on a cursor, on every connection opened
    from now on (the store's inserts go to the driver's cursor, not through SQLAlchemy's
    events); not a connection's own ``execute`` (the store's pragmas)."""
    sent: Sent = []

    class Cursor(sqlite3.Cursor):
        def execute(self, sql: str, parameters: Any = (), /) -> Cursor:
            sent.append((sql, parameters))
            return super().execute(sql, parameters)

        def executemany(self, sql: str, parameters: Any, /) -> Cursor:
            parameters = list(parameters)
            sent.append((sql, parameters))
            return super().executemany(sql, parameters)

    class Recording(sqlite3.Connection):
        def cursor(self, factory: Any = Cursor) -> Any:
            return super().cursor(factory)

    connect = sqlite3.connect
    recording = functools.partial(connect, factory=Recording)
    monkeypatch.setattr(sqlite3, "connect", recording)  # aiosqlite's
    monkeypatch.setattr(sqlite3.dbapi2, "connect", recording)  # SQLAlchemy's pysqlite's
    return sent


@contextmanager
def tables_inserted_into(sent: Sent) -> Iterator[list[str]]:
    """The table of each INSERT sent while the block runs, in order (filled as it ends)."""
    inserts: list[str] = []
    before = len(sent)
    yield inserts
    inserts += [sql.split()[2] for sql, _ in sent[before:] if sql.startswith("INSERT")]


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


async def test_one_bad_row_fails_only_its_caller_and_is_never_written(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events queued together go in together (one statement on PostgreSQL, outside a
    transaction); a bad one fails its caller alone, and nothing of it is written."""
    store = await Store.open(database_url)
    # A shared database: ids of this test's own.
    run_1, run_2, no_run = (f"run_{uuid.uuid4().hex}" for _ in range(3))
    try:
        await create_run(store, run_1, f"ses_{uuid.uuid4().hex}")
        outcomes: dict[int, str] = {}

        async def append(seq: int, run_id: str) -> None:
            try:
                await store.append_events(StepStarted(run_id=run_id, seq=seq, ts=0.0, step=1))
                outcomes[seq] = "written"
            except IntegrityError:
                outcomes[seq] = "refused"

        groups = _groups_written(monkeypatch)
        async with anyio.create_task_group() as group:
            for seq in range(2, 12):
                group.start_soon(append, seq, run_1 if seq != 6 else no_run)
        assert groups == [1, 9], "a burst: the first alone, the other nine queued together"
        assert outcomes == {seq: "refused" if seq == 6 else "written" for seq in range(2, 12)}

        await append(2, run_2)  # refused: run_2 does not exist yet
        assert outcomes[2] == "refused"
        await create_run(store, run_2, f"ses_{uuid.uuid4().hex}")
        await append(12, run_1)  # must not carry the refused row along, now valid
        ours = RunEventRow.run_id.in_([run_1, run_2, no_run])
        async with store.db.session() as db:
            rows = (await db.execute(select(RunEventRow.run_id, RunEventRow.seq).where(ours))).all()
        assert sorted(rows) == sorted(
            [(run_1, seq) for seq in (1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12)] + [(run_2, 1)]
        )
    finally:
        for run_id in (run_1, run_2):  # not left running for the sweeps of other tests
            await store.runs.mark_failed(run_id, "The test is over")
        await store.close()


async def test_a_write_another_process_holds_the_lock_for_waits_off_the_event_loop(
    tmp_path: Path,
) -> None:
    """SQLite writes run on the event loop, on a connection that never waits: while another
    process (here: another connection) holds the write lock, the write waits in a thread,
    the loop goes on serving, and the write lands once the lock is free."""
    path = tmp_path / "db.sqlite"
    store = await Store.open(f"sqlite+aiosqlite:///{path}")
    try:
        await create_run(store, "run_1", "ses_1")
        with closing(sqlite3.connect(path)) as other:
            other.execute("BEGIN IMMEDIATE")  # the write lock, as `agentstream keys` takes it
            ticks = 0

            async def tick() -> None:
                nonlocal ticks
                while True:
                    await anyio.sleep(0.01)
                    ticks += 1

            written = anyio.Event()

            async def append() -> None:
                await store.append_events(StepStarted(run_id="run_1", seq=2, ts=0.0, step=1))
                written.set()

            async with anyio.create_task_group() as group:
                group.start_soon(tick)
                group.start_soon(append)
                await anyio.sleep(0.3)
                assert ticks > 5, "the loop went on while the write waited"
                assert not written.is_set()
                assert store_events(path) == [1], "not written while the lock is held"
                other.rollback()
                with anyio.fail_after(5):
                    await written.wait()
                assert store_events(path) == [1, 2]
                await store.append_events(StepStarted(run_id="run_1", seq=3, ts=0.0, step=1))
                assert store_events(path) == [1, 2, 3], "and the loop's connection writes again"
                group.cancel_scope.cancel()
    finally:
        await store.close()


@dataclass
class AppendingRun:
    """A run on a store, whose events are appended each by a task of its own."""

    store: Store
    run_id: str

    def append(self, seq: int) -> asyncio.Task[None]:
        event = StepStarted(run_id=self.run_id, seq=seq, ts=0.0, step=1)
        return asyncio.create_task(self.store.append_events(event))

    async def seqs(self) -> list[int]:
        """The seqs of its events in the database."""
        ours = select(RunEventRow.seq).where(RunEventRow.run_id == self.run_id)
        async with self.store.db.session() as db:
            return sorted((await db.execute(ours)).scalars())


@pytest.fixture
async def appending(database_url: str) -> AsyncIterator[AppendingRun]:
    store = await Store.open(database_url)
    run = AppendingRun(store, f"run_{uuid.uuid4().hex}")  # a shared database: ids of its own
    try:
        await create_run(store, run.run_id, f"ses_{uuid.uuid4().hex}")
        yield run
    finally:
        await store.runs.mark_failed(run.run_id, "The test is over")
        await store.close()


async def test_callers_waiting_to_insert_resume_and_lead_one_turn_of_the_loop_later(
    appending: AppendingRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each turn of the event loop a run start waits more is tens of milliseconds once the
    process is at a whole core. Ten callers insert at once: the next caller to lead sends
    its group in the turn after the first group's caller resumed, and the callers whose
    rows it wrote resume in the turn after it."""
    happened: list[str] = []
    write_rows = Database._write_rows

    async def recorded(database: Database, inserts: list[Any]) -> None:
        happened.append("sent")
        await write_rows(database, inserts)

    async def tick() -> None:
        while True:
            await asyncio.sleep(0)
            happened.append("tick")

    async def append(seq: int) -> None:  # in the caller's own task
        event = StepStarted(run_id=appending.run_id, seq=seq, ts=0.0, step=1)
        await appending.store.append_events(event)
        happened.append("resumed")

    groups = _groups_written(monkeypatch)
    monkeypatch.setattr(Database, "_write_rows", recorded)
    ticking = asyncio.create_task(tick())
    try:
        await asyncio.gather(*(append(seq) for seq in range(2, 12)))
    finally:
        ticking.cancel()
    assert groups == [1, 9]
    first = happened.index("resumed")
    assert happened[first : first + 3] == ["resumed", "tick", "sent"]
    led = happened.index("resumed", first + 1)
    assert happened[led : led + 10] == ["resumed", "tick"] + ["resumed"] * 8


HeldWrites = tuple[list[list[int]], list[asyncio.Event], list[Callable[[], object]]]


def held_writes(monkeypatch: pytest.MonkeyPatch) -> HeldWrites:
    """Each group written from now on is held until its event is set: the seqs of each
    group's events, in order; the events, one a group; and what to call once a held
    group is written, before its callers are told."""
    write_rows = Database._write_rows
    writes: list[list[int]] = []
    release = [asyncio.Event() for _ in range(3)]
    when_written: list[Callable[[], object]] = []

    async def held(database: Database, inserts: list[Any]) -> None:
        number = len(writes)
        writes.append([values["seq"] for rows in inserts for _, values in rows])
        await release[number].wait()
        await write_rows(database, inserts)
        for call in when_written:
            call()

    monkeypatch.setattr(Database, "_write_rows", held)
    return writes, release, when_written


async def test_callers_cancelled_while_they_wait_to_insert_leave_the_others_written(
    appending: AppendingRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each caller waits on a future of its own, which its cancel cancels. One cancelled
    while it waits, and one in the very turn the leader is done (before it could
    withdraw): their rows stay out. One cancelled just as it is told to lead: the next one
    leads. One cancelled once a leader has taken its rows: they go in, and the others are
    told theirs did."""
    writes, release, when_written = held_writes(monkeypatch)
    leading = appending.append(2)
    await asyncio.sleep(0)
    waiting_out, out_as_led, told_out, leading_next, taken_out = map(appending.append, range(3, 8))
    await asyncio.sleep(0)
    waiting_out.cancel()
    await asyncio.sleep(0)
    when_written.append(out_as_led.cancel)
    when_written.append(lambda: asyncio.get_running_loop().call_soon(told_out.cancel))
    release[0].set()
    await leading
    for _ in range(100):
        if len(writes) == 2:
            break
        await asyncio.sleep(0)
    assert writes == [[2], [6, 7]]
    when_written.clear()
    taken_out.cancel()
    release[1].set()
    await leading_next
    for cancelled in (waiting_out, out_as_led, told_out, taken_out):
        with pytest.raises(asyncio.CancelledError):
            await cancelled
    monkeypatch.undo()
    assert await appending.seqs() == [1, 2, 6, 7]


async def test_a_caller_cancelled_as_the_next_leader_takes_its_group_stays_out(
    appending: AppendingRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller is cancelled in the turn the next leader takes the rows waiting, before it
    could withdraw them: they are not written."""
    writes, release, when_written = held_writes(monkeypatch)
    leading = appending.append(2)
    await asyncio.sleep(0)
    leading_next, cancelled = appending.append(3), appending.append(4)
    await asyncio.sleep(0)
    # Called before the next leader is told: its cancel runs first in the next turn.
    when_written.append(lambda: asyncio.get_running_loop().call_soon(cancelled.cancel))
    for released in release:
        released.set()
    await asyncio.wait_for(asyncio.gather(leading, leading_next), 10)
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert writes == [[2], [3]]
    monkeypatch.undo()
    assert await appending.seqs() == [1, 2, 3]


async def test_a_leader_cancelled_outright_hands_the_lead_on(
    appending: AppendingRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller writing a group is cancelled outright (``Task.cancel``, which a cancel
    scope's shield does not hold off: a process stopping cancels its runs' tasks so): the
    caller waiting leads next, and the writes go on."""
    writes, release, _ = held_writes(monkeypatch)
    leading = appending.append(2)
    await asyncio.sleep(0)
    waiting = appending.append(3)
    await asyncio.sleep(0)
    leading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leading
    release[1].set()
    release[2].set()
    await asyncio.wait_for(waiting, 10)
    await asyncio.wait_for(appending.append(4), 10)
    assert writes == [[2], [3], [4]]
    monkeypatch.undo()
    assert await appending.seqs() == [1, 3, 4]


async def test_a_leader_cancelled_outright_as_it_waits_for_a_burst_hands_the_lead_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a SQLite file, the caller that leads after another's write in the same turn
    waits a turn for the rest of the burst; cancelled outright meanwhile, before it took
    any rows, it hands the lead to the caller queued behind it."""
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
    run = AppendingRun(store, "run_1")
    try:
        await create_run(store, run.run_id, "ses_1")
        groups = _groups_written(monkeypatch)
        written, waiting_for_the_burst, queued = map(run.append, (2, 3, 4))
        await asyncio.sleep(0)  # the first wrote; the second waits a turn; the third queued
        waiting_for_the_burst.cancel()
        await asyncio.wait_for(asyncio.gather(written, queued), 10)
        with pytest.raises(asyncio.CancelledError):
            await waiting_for_the_burst
        assert groups == [1, 1]
        assert await run.seqs() == [1, 2, 4]
    finally:
        await store.close()


def _groups_written(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the groups of inserts written from now on, in order."""
    sizes: list[int] = []
    write_group = Database._insert_group

    async def counted(database: Database, group: list[Any]) -> None:
        sizes.append(len(group))
        await write_group(database, group)

    monkeypatch.setattr(Database, "_insert_group", counted)
    return sizes


async def test_a_write_on_a_sqlite_file_takes_no_trip_through_the_event_loop(
    tmp_path: Path,
) -> None:
    """A task's writes on a SQLite file (a run's record, then its events) are done before
    any other task runs: under load, each trip through the event loop would wait for every
    ready task, and a run start would wait for several."""
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
    try:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await anyio.lowlevel.checkpoint()
                ticks += 1

        await store.put_agent(AgentSpec(id="a"))  # found by create_run on the loop, no trip
        async with anyio.create_task_group() as group:
            group.start_soon(tick)
            await anyio.sleep(0.01)
            before = ticks
            await create_run(store, "run_1", "ses_1")
            for seq in range(2, 6):
                await store.append_events(StepStarted(run_id="run_1", seq=seq, ts=0.0, step=1))
            assert ticks == before
            group.cancel_scope.cancel()
        assert store_events(tmp_path / "db.sqlite") == [1, 2, 3, 4, 5]
    finally:
        await store.close()


def store_events(path: Path) -> list[int]:
    with closing(sqlite3.connect(path)) as db:
        return [seq for (seq,) in db.execute("select seq from run_events order by seq")]


@pytest.mark.parametrize("every", [10, 10**9])
async def test_the_wal_is_checkpointed_by_the_files_thread_alone(
    every: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection that writes on the loop never checkpoints (a checkpoint syncs the
    file): with no checkpoint from the file's thread, 600 writes leave the WAL past the
    1,000 pages where SQLite's own would start it over. The thread checkpoints every
    ``CHECKPOINT_EVERY`` writes and starts the WAL over, so it stays small. Measured once
    the thread has done the checkpoints asked of it (on a busy machine it runs behind the
    loop's writes), with room for a few in a row that found a write in progress and could
    not start it over (in one CI run, 284 pages)."""
    monkeypatch.setattr(SQLiteFile, "CHECKPOINT_EVERY", every)
    checkpoints = 0
    checkpoint = SQLiteFile._checkpoint

    def counted(self: SQLiteFile) -> None:
        nonlocal checkpoints
        checkpoints += 1
        checkpoint(self)

    monkeypatch.setattr(SQLiteFile, "_checkpoint", counted)
    path = tmp_path / "db.sqlite"
    store = await Store.open(f"sqlite+aiosqlite:///{path}")
    try:
        await create_run(store, "run_1", "ses_1")
        for seq in range(2, 602):
            await store.append_events(StepStarted(run_id="run_1", seq=seq, ts=0.0, step=1))
        file = store.db._file
        assert file is not None
        await asyncio.get_running_loop().run_in_executor(file._thread, lambda: None)
        with closing(sqlite3.connect(path)) as db:
            (_, frames, _) = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    finally:
        await store.close()
    if every == 10:
        assert checkpoints >= 60
        assert frames < 500, "600 commits of two pages or more each, and the WAL started over"
    else:
        assert checkpoints == 0
        assert frames > 1_000, "the loop's connection checkpointed by itself"


async def test_a_reader_in_the_wal_does_not_hold_the_writes_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint that would start the WAL over waits for its readers with the lock to
    write held; with a reader that stays (a backup), it gives up at once and tries again
    later, instead of holding every write up for SQLite's busy timeout (5 s each time)."""
    monkeypatch.setattr(SQLiteFile, "CHECKPOINT_EVERY", 5)
    path = tmp_path / "db.sqlite"
    store = await Store.open(f"sqlite+aiosqlite:///{path}")
    try:
        await create_run(store, "run_1", "ses_1")
        with closing(sqlite3.connect(path, isolation_level=None)) as reader:
            reader.execute("BEGIN")
            reader.execute("select count(*) from run_events").fetchone()  # holds its snapshot
            with anyio.fail_after(10):  # six checkpoints: 30 s if each waited it out
                for seq in range(2, 32):
                    await store.append_events(StepStarted(run_id="run_1", seq=seq, ts=0.0, step=1))
            reader.execute("COMMIT")
        assert store_events(path) == list(range(1, 32))
    finally:
        await store.close()


async def test_runs_created_together_land_in_order_and_fail_alone(tmp_path: Path) -> None:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
    try:
        await store.put_agent(AgentSpec(id="a"))
        outcomes: dict[str, str] = {}

        async def create(run_id: str, session_id: str) -> None:
            try:
                await create_run(store, run_id, session_id)
                outcomes[run_id] = "created"
            except Conflict:  # the session is taken
                outcomes[run_id] = "refused"

        await create("run_0", "ses_taken")
        async with anyio.create_task_group() as group:  # one group: sessions, runs, events
            for n in range(1, 21):
                group.start_soon(create, f"run_{n}", "ses_taken" if n == 7 else f"ses_{n}")
        assert outcomes == {f"run_{n}": "refused" if n == 7 else "created" for n in range(21)}
        for n in (1, 20):
            assert (await store.get_run(f"run_{n}")) is not None
            assert await store.session_agent(f"ses_{n}") == "a"
        assert await store.get_run("run_7") is None
    finally:
        await store.close()


async def test_a_group_of_writes_is_one_insert_per_table_the_referred_ones_first(
    tmp_path: Path, sent_to_sqlite: Sent
) -> None:
    """Whatever order a group's rows came in (here an event of a run that exists, then new
    sessions with their runs and events), each table is one INSERT, and a table goes after
    those its rows refer to."""
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
    try:
        await create_run(store, "run_0", "ses_0")
        with tables_inserted_into(sent_to_sqlite) as inserts:
            async with anyio.create_task_group() as group:
                group.start_soon(create_run, store, "run_1", "ses_1")  # goes at once, alone
                # the rest of the burst waits for it, then goes as one group
                group.start_soon(
                    store.append_events, StepStarted(run_id="run_0", seq=2, ts=0, step=1)
                )
                for n in (2, 3):
                    group.start_soon(create_run, store, f"run_{n}", f"ses_{n}")
        assert inserts == ["sessions", "runs", "run_events"] * 2
        assert [e.seq for e in await store.run_events("run_0")] == [1, 2]
        assert all([await store.get_run(f"run_{n}") for n in (1, 2, 3)])
    finally:
        await store.close()


async def test_runs_of_both_kinds_in_one_group_are_an_insert_each_not_written_one_by_one(
    tmp_path: Path, sent_to_sqlite: Sent
) -> None:
    """An agent run and a workflow execution set different columns: in one group, a run
    whose row sets other columns than the one before is another INSERT (one statement for
    all would take the first row's columns, fail, and leave the group to be written again
    caller by caller)."""
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
    workflows = WorkflowStore(store.db)
    execution = functools.partial(
        workflows.create_execution,
        "wfx_1",
        flow("f"),
        version=None,
        draft=True,
        input={"n": 1},
        owner=OWNER,
    )
    try:
        await create_run(store, "run_0", "ses_0")
        with tables_inserted_into(sent_to_sqlite) as inserts:
            async with anyio.create_task_group() as group:
                group.start_soon(create_run, store, "run_1", "ses_1")  # goes at once, alone
                group.start_soon(create_run, store, "run_2", "ses_2")  # the rest: one group
                group.start_soon(execution)
                group.start_soon(create_run, store, "run_3", "ses_3")
        run_1 = ["sessions", "runs", "run_events"]
        the_group = ["sessions", "runs", "runs", "runs", "run_events"]  # runs in order
        assert inserts == [*run_1, *the_group]
        assert all([await store.get_run(f"run_{n}") for n in (1, 2, 3)])
        assert await workflows.get_execution("wfx_1") is not None
    finally:
        await store.close()


def agent_run_row(run_id: str, **columns: Any) -> NewRow:
    """An agent run's row, ended, in no session."""
    common = {"status": "completed", "created_at": now(), "owner": OWNER}
    return RunRow, {"id": run_id, "kind": "agent", "agent_id": "a", **common, **columns}


async def test_a_group_of_several_inserts_into_one_table_is_written_whole_or_not_at_all(
    database_url: str,
) -> None:
    """An agent run's row and a workflow execution's are INSERTs of their own: together in
    a transaction on PostgreSQL too, where a lone INSERT goes without one."""
    store = await Store.open(database_url)
    taken, new = f"run_{uuid.uuid4().hex}", f"run_{uuid.uuid4().hex}"
    execution = {"id": taken, "kind": "workflow", "workflow_id": "f", "draft": True}
    try:
        await store.db.insert(agent_run_row(taken))
        with pytest.raises(IntegrityError):
            await store.db.insert(
                agent_run_row(new), (RunRow, execution | {"status": "failed", "created_at": now()})
            )
        assert (await store.runs.exists(taken), await store.runs.exists(new)) == (True, False)
    finally:
        await store.close()


async def test_a_row_that_names_no_column_is_refused_alone_and_none_of_its_callers_rows_go_in(
    tmp_path: Path,
) -> None:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
    refused: list[Exception] = []

    async def insert_misnamed() -> None:
        session = {"id": "ses_x", "agent_id": "a", "created_at": now()}
        try:
            await store.db.insert((SessionRow, session), agent_run_row("run_x", agent_versoin=1))
        except UnknownColumns as error:
            refused.append(error)

    try:
        await create_run(store, "run_0", "ses_0")
        await insert_misnamed()
        async with anyio.create_task_group() as group:
            group.start_soon(create_run, store, "run_1", "ses_1")  # goes at once, alone
            group.start_soon(insert_misnamed)  # the rest: one group
            group.start_soon(create_run, store, "run_2", "ses_2")
        assert [str(error) for error in refused] == ["runs has no column agent_versoin"] * 2
        assert not await store.runs.exists("run_x")
        assert await store.session_agent("ses_x") is None
        assert all([await store.get_run(f"run_{n}") for n in (1, 2)])
    finally:
        await store.close()


async def test_rows_go_to_the_driver_with_the_sql_and_values_a_core_insert_of_them_sends(
    database_url: str, sent_to_sqlite: Sent
) -> None:
    """Two sessions, two runs (JSON, a time with its zone, a flag, a float, columns left to
    their defaults), their events and messages (whose keys the database makes), inserted by
    ``add`` and by Core's ``insert``: the same statements and parameters, of the same types,
    reach the driver."""
    store = await Store.open(database_url)
    ids = [uuid.uuid4().hex for _ in range(2)]
    at = datetime(2026, 12, 6, 9, 30, 15, 123456, tzinfo=timezone(timedelta(hours=2)))
    message: dict[str, Any] = {
        "role": "user",
        "content": "hi",
        "tool_calls": [],
        "provider_state": None,
    }
    tables: list[list[NewRow]] = [
        [(SessionRow, {"id": f"ses_{n}", "agent_id": "a", "created_at": at}) for n in ids],
        [
            agent_run_row(
                f"run_{n}",
                session_id=f"ses_{n}",
                created_at=at,
                input={"text": "Grüße ☃", "n": [1.5, None]},
                reasoning_requested=True,
                cost_usd=0.25,
            )
            for n in ids
        ],
        [
            (
                RunEventRow,
                {"run_id": f"run_{n}", "seq": 1, "type": "start", "ts": 1.5, "payload": {}},
            )
            for n in ids
        ],
        [  # a key the database makes
            (MessageRow, {"session_id": f"ses_{n}", "run_id": f"run_{n}", **message}) for n in ids
        ],
    ]

    def sent(connection: Connection, write: Callable[[Connection], object]) -> Sent:
        """What reaches the driver: on SQLite, its own; on PostgreSQL, SQLAlchemy's last step
        before its asyncpg adapter (where ``add`` goes through SQLAlchemy's execution)."""
        statements: Sent = []
        before = len(sent_to_sqlite)

        def record(_: Any, _cursor: Any, statement: str, parameters: Any, *__: Any) -> None:
            statements.append((statement, parameters))

        event.listen(connection, "before_cursor_execute", record)
        try:
            write(connection)
        finally:
            event.remove(connection, "before_cursor_execute", record)
            connection.rollback()
        return sent_to_sqlite[before:] if connection.dialect.name == "sqlite" else statements

    def by_core(connection: Connection) -> None:
        for rows in tables:
            table = Base.metadata.tables[rows[0][0].__tablename__]
            connection.execute(insert(table), [values for _, values in rows])

    every_row = [row for rows in tables for row in rows]

    try:
        async with store.db.engine.connect() as connection:
            core = await connection.run_sync(sent, by_core)
            ours = await connection.run_sync(sent, functools.partial(add, rows=every_row))
        tables_written = sorted(statement.split()[2] for statement, _ in core)
        assert tables_written == ["messages", "run_events", "runs", "sessions"]
        assert sorted(map(repr, ours)) == sorted(map(repr, core))  # in the order of their keys
    finally:
        await store.close()


async def test_add_on_a_connection_begins_its_transaction_as_a_statement_would(
    database_url: str,
) -> None:
    """``add`` on a connection with no transaction begun: committed, its rows are there for
    a connection of its own; rolled back, none are; and either way the connection holds
    no lock once it is given back."""
    store = await Store.open(database_url)
    kept, dropped = uuid.uuid4().hex, uuid.uuid4().hex

    async def seen(run_id: str) -> bool:
        """By a connection of its own, which takes the lock to write first on SQLite."""
        if database_url.startswith("sqlite"):
            with closing(sqlite3.connect(database_url.split("///", 1)[1], timeout=0)) as own:
                own.execute("BEGIN IMMEDIATE")  # "database is locked" if it is held
                found = own.execute("SELECT count(*) FROM runs WHERE id = ?", (run_id,))
                return bool(found.fetchone()[0])
        own_pg = await asyncpg.connect(database_url.replace("+asyncpg", ""))
        try:
            return bool(await own_pg.fetchval("SELECT count(*) FROM runs WHERE id = $1", run_id))
        finally:
            await own_pg.close()

    try:
        for tag, end in ((kept, "commit"), (dropped, "rollback")):
            async with store.db.engine.connect() as connection:
                await connection.run_sync(add, [agent_run_row(f"run_{tag}")])
                await getattr(connection, end)()
            assert await seen(f"run_{tag}") == (tag == kept)
    finally:
        await store.close()


async def test_a_value_json_cannot_hold_is_refused_alone_and_its_callers_other_rows_stay_out(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value its column cannot take fails its caller's statement as the database's
    refusal of a row does: none of that caller's rows go in (its run's session neither),
    the other callers of its group do."""
    store = await Store.open(database_url)
    ids = [uuid.uuid4().hex for _ in range(4)]
    refused: list[Exception] = []

    async def insert(n: str, **columns: Any) -> None:
        session = {"id": f"ses_{n}", "agent_id": "a", "created_at": now()}
        run = agent_run_row(f"run_{n}", session_id=f"ses_{n}", **columns)
        try:
            await store.db.insert((SessionRow, session), run)
        except StatementError as error:
            refused.append(error)

    try:
        groups = _groups_written(monkeypatch)
        async with anyio.create_task_group() as group:
            group.start_soon(insert, ids[0])  # goes at once, alone
            group.start_soon(insert, ids[1])  # the rest: one group
            group.start_soon(functools.partial(insert, ids[2], input={"at": object()}))
            group.start_soon(insert, ids[3])
        assert groups[:2] == [1, 3], "then the group's callers one by one"
        assert ["not JSON serializable" in str(error) for error in refused] == [True]
        assert [await store.runs.exists(f"run_{n}") for n in ids] == [True, True, False, True]
        assert [await store.session_agent(f"ses_{n}") for n in ids] == ["a", "a", None, "a"]
    finally:
        await store.close()


async def test_rows_go_in_through_a_driver_that_takes_parameters_by_name(tmp_path: Path) -> None:
    """SQLite's driver takes ``:name`` parameters as well as ``?`` ones: rows are handed
    to it by name where the dialect says so (PostgreSQL's psycopg takes them so)."""
    engine = create_async_engine("sqlite+aiosqlite://", paramstyle="named")
    database = Database(engine)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(Base.metadata.create_all)
        await database.insert(agent_run_row("run_1", input={"n": 1}))
        async with database.session() as db:
            row = await db.get_one(RunRow, "run_1")
        stored = (row.kind, row.status, row.agent_id, row.owner, row.input, row.input_tokens)
        assert stored == ("agent", "completed", "a", OWNER, {"n": 1}, 0)
    finally:
        await engine.dispose()


async def test_a_step_hands_the_store_its_calls_and_its_ending_at_once(tmp_path: Path) -> None:
    """The events a step emits together are written together: its tool calls in one write,
    its ending (the answer's text, its summary, ``step_completed``) in one more; each a
    transaction, and on PostgreSQL a round trip, where one each cost as many."""
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
    agent = AgentSpec(id="a")
    await create_run(store, "run_1", "ses_1")
    writes: list[list[str]] = []
    append = store.append_events

    async def recorded(*events: BaseEvent) -> None:
        writes.append([type(event).__name__ for event in events])
        await append(*events)

    store.append_events = recorded  # type: ignore[method-assign]

    def turns(request: ModelRequest) -> list[ModelPart]:
        if request.messages[-1].role == "tool":
            return [TextPart("Done."), ReasoningSummaryPart("Added."), TurnEndPart("end_turn")]
        calls: list[ModelPart] = []
        for call_id in ("c0", "c1", "c2"):
            calls += [
                ToolCallStartPart(call_id, "add"),
                ToolCallArgsPart(call_id, "{}"),
                ToolCallEndPart(call_id),
            ]
        return [TextPart("Let me add."), *calls, TurnEndPart("tool_calls")]

    def add() -> int:
        return 1

    log = RunLog()
    log.open("run_1", after=1)
    ctx = RunContext("run_1", log=log, store=store, seq=1)
    try:
        await run_agent(
            ctx,
            agent,
            ScriptedModel("s", turns),
            [Tool.from_function(add)],
            state=AgentState.begin(agent, [], "go"),
            reasoning=False,
        )
        assert writes == [
            ["StepStarted"],
            ["ToolCall", "ToolCall", "ToolCall"],
            ["ToolResult"],
            ["ToolResult"],
            ["ToolResult"],
            ["StepCompleted"],
            ["StepStarted"],
            ["Text", "ReasoningSummary", "StepCompleted"],
        ]
        stored = [type(event).__name__ for event in await store.run_events("run_1")]
        assert stored == ["RunStarted", *itertools.chain(*writes)]
    finally:
        await store.close()


async def test_events_whose_write_failed_give_their_seqs_back() -> None:
    """Nothing of a write that failed was published, and the run's next event (its
    terminal one) takes the first seq it left: no hole, so the log's last seq is the run's
    last event's, where viewers in other processes stop."""

    class Refusing:
        async def append_events(self, *events: BaseEvent) -> None:
            if len(events) > 1:
                raise IntegrityError("INSERT", {}, Exception("refused"))

        async def mark_failed(self, run_id: str, error: str) -> None:
            pass

    log = RunLog()
    log.open("run_1", after=1)
    seen = log.subscribe("run_1", after=1)
    ctx = RunContext("run_1", log=log, store=Refusing(), seq=1)
    await ctx.emit(StepStarted, step=1)
    with pytest.raises(IntegrityError):
        await ctx.emit_all((Text, {"step": 1, "text": "hi"}), (StepCompleted, {"step": 1}))
    await ctx.end(
        ctx.stamp(RunFailed, status="error", message="no"), lambda _: anyio.lowlevel.checkpoint()
    )
    assert [(type(e).__name__, e.seq) for e in await seen.next_batch()] == [
        ("StepStarted", 2),
        ("RunFailed", 3),
    ]


# --- the one run path: agent runs and workflow executions alike ------------------------------


def flow(workflow_id: str) -> Workflow:
    return parse_workflow(
        {
            "id": workflow_id,
            "blocks": [
                {"id": "start", "type": "start"},
                {"id": "out", "type": "response", "output": 1},
            ],
            "edges": [{"from": "start", "to": "out"}],
        }
    )


async def test_runs_of_both_kinds_share_one_table_and_are_told_apart(database_url: str) -> None:
    store = await Store.open(database_url)
    workflows = WorkflowStore(store.db)
    run_id, execution_id = f"run_{uuid.uuid4().hex}", f"wfx_{uuid.uuid4().hex}"
    try:
        await create_run(store, run_id, f"ses_{uuid.uuid4().hex}")
        await workflows.create_execution(
            execution_id, flow("f"), version=None, draft=True, input={"n": 1}, owner=OWNER
        )
        assert await store.get_run(execution_id) is None
        assert await workflows.get_execution(run_id) is None
        execution = await workflows.get_execution(execution_id)
        assert execution is not None
        assert (execution.status, execution.input, execution.draft) == ("running", {"n": 1}, True)
        run = await store.get_run(run_id)
        assert run is not None
        assert (run.status, run.input) == ("running", "hi")

        await workflows.finish_execution(
            execution_id,
            status="completed",
            result=[1, 2],
            error=None,
            last_event=RunCompleted(run_id=execution_id, seq=1, ts=1.0, result=[1, 2]),
        )
        await store.finish_run(
            run_id,
            status="completed",
            content="hello",
            error=None,
            usage=Usage(input_tokens=3, output_tokens=4),
            memory=[],
            last_event=RunCompleted(run_id=run_id, seq=2, ts=2.0, content="hello"),
        )
        execution = await workflows.get_execution(execution_id)
        run = await store.get_run(run_id)
        assert execution is not None
        assert run is not None
        assert (execution.status, execution.result, execution.finished_at is not None) == (
            "completed",
            [1, 2],
            True,
        )
        assert (run.status, run.content, run.usage.total_tokens) == ("completed", "hello", 7)
        assert [e.type for e in await store.run_events(run_id)] == ["run_started", "run_completed"]
        assert [e.type for e in await workflows.execution_events(execution_id)] == ["run_completed"]
    finally:
        await store.close()


async def test_a_workflows_events_are_kept_and_read_back_unchanged(database_url: str) -> None:
    """Block-scoped events of the one vocabulary, through the one store path."""
    store = await Store.open(database_url)
    workflows = WorkflowStore(store.db)
    wfx = f"wfx_{uuid.uuid4().hex}"
    stamp: dict[str, Any] = {"run_id": wfx, "ts": 1.5}
    block: dict[str, Any] = {**stamp, "block_id": "ask"}
    events: list[BaseEvent] = [
        RunStarted(**stamp, seq=1, workflow_id="f"),
        Reasoning(**block, seq=2, step=1, text="first"),
        ToolCall(**block, seq=3, step=1, call_id="ask:c", tool_name="t", arguments={"x": 1}),
        ToolResult(**block, seq=4, step=1, call_id="ask:c", tool_name="t", status="error",
                   result="boom"),
        Reasoning(**block, seq=5, step=2, text="second"),
        Text(**block, seq=6, step=2, text="ok"),
        BlockOutput(**block, seq=7, output={"content": "ok"}),
    ]  # fmt: skip
    last = RunFailed(**stamp, seq=8, status="error", message="failed", failed_block="ask")
    try:
        await workflows.create_execution(
            wfx, flow("f"), version=1, draft=False, input=None, owner=OWNER
        )
        for event in events:
            await workflows.append_events(event)
        await workflows.finish_execution(
            wfx, status="error", result=None, error="failed", last_event=last
        )
        assert await workflows.execution_events(wfx) == [*events, last]
        async with store.db.session() as db:
            kept = (await db.scalars(select(RunEventRow).where(RunEventRow.run_id == wfx))).all()
        assert sorted((row.seq, row.type) for row in kept) == [
            (1, "run_started"),
            (2, "reasoning"),
            (3, "tool_call"),
            (4, "tool_result"),
            (5, "reasoning"),
            (6, "text"),
            (7, "block_output"),
            (8, "run_failed"),
        ]
    finally:
        await store.close()


async def test_runs_of_a_dead_process_end_interrupted_once_and_live_ones_are_left(
    database_url: str,
) -> None:
    store = await Store.open(database_url)
    workflows = WorkflowStore(store.db)
    processes = ProcessStore(store.db)
    orphan, wfx, alive = (f"{kind}_{uuid.uuid4().hex}" for kind in ("run", "wfx", "run"))
    try:
        await processes.register(
            "prc_alive", host="h", pid=1, address="a", lease_until=time.time() + 60
        )
        await create_run(store, orphan, f"ses_{uuid.uuid4().hex}")  # its owner never registered
        await create_run(store, alive, f"ses_{uuid.uuid4().hex}", owner="prc_alive")
        await workflows.create_execution(
            wfx, flow("f"), version=1, draft=False, input=None, owner=OWNER
        )
        started = RunStarted(run_id=wfx, seq=1, ts=1.0, workflow_id="f")
        await workflows.append_events(started)

        me = Leases(processes, Supervisor(RunLog()), lease_seconds=15)
        assert await me.join("here", alone=False) == 2
        other = Leases(processes, Supervisor(RunLog()), lease_seconds=15)
        assert await other.sweep() == 0, "once"
        for run_id in (orphan, wfx):
            [first, stopped] = await store.runs.events(run_id)
            assert first.type == "run_started"
            assert isinstance(stopped, RunFailed)
            assert (stopped.seq, stopped.status, stopped.message) == (
                1 + SEAL_GAP,
                "interrupted",
                INTERRUPTED,
            )
        execution = await workflows.get_execution(wfx)
        assert execution is not None
        assert (execution.status, execution.error) == ("interrupted", INTERRUPTED)
        live = await store.get_run(alive)
        assert live is not None
        assert live.status == "running", "its process holds its lease"

        # A process that holds the SQLite database knows it is alone: every other is dead.
        assert await me.sweep(alone=True) == 1
        live = await store.get_run(alive)
        assert live is not None
        assert live.status == "interrupted"
    finally:
        await store.close()


async def test_mark_failed_ends_a_running_run_of_either_kind_and_nothing_else(
    database_url: str,
) -> None:
    store = await Store.open(database_url)
    workflows = WorkflowStore(store.db)
    run_id, wfx = f"run_{uuid.uuid4().hex}", f"wfx_{uuid.uuid4().hex}"
    try:
        await create_run(store, run_id, f"ses_{uuid.uuid4().hex}")
        await workflows.create_execution(
            wfx, flow("f"), version=1, draft=False, input=None, owner=OWNER
        )
        await store.mark_failed(run_id, "lost")
        await workflows.mark_failed(wfx, "lost too")
        run, execution = await store.get_run(run_id), await workflows.get_execution(wfx)
        assert run is not None
        assert (run.status, run.error) == ("error", "lost")
        assert execution is not None
        assert (execution.status, execution.error) == (
            "error",
            "lost too",
        )
        await workflows.mark_failed(wfx, "again")  # ended: left as it is
        execution = await workflows.get_execution(wfx)
        assert execution is not None
        assert execution.error == "lost too"
    finally:
        await store.close()


async def test_finishing_a_run_another_process_ended_keeps_that_ending(database_url: str) -> None:
    """A run taken for dead and interrupted elsewhere, whose own process then finishes it:
    the first ending stands, with no second terminal event and no memory added."""
    store = await Store.open(database_url)
    run_id, session_id = f"run_{uuid.uuid4().hex}", f"ses_{uuid.uuid4().hex}"
    try:
        await create_run(store, run_id, session_id)
        await store.mark_failed(run_id, "lost")
        await store.finish_run(
            run_id,
            status="completed",
            content="late",
            error=None,
            usage=Usage(input_tokens=1, output_tokens=1),
            memory=[Message(role="assistant", content="late")],
            last_event=RunCompleted(run_id=run_id, seq=2, ts=2.0, content="late"),
        )
        run = await store.get_run(run_id)
        assert run is not None
        assert (run.status, run.error, run.content) == ("error", "lost", None)
        assert [e.type for e in await store.run_events(run_id)] == ["run_started"]
        assert await store.history(session_id) == []
    finally:
        await store.close()


class SharedLog:
    """The other processes as an orphaned run's sealing sees them: a shared live log that
    holds the run up to seq ``live``, and what is sealed there."""

    def __init__(self, live: int) -> None:
        self.live = live
        self.sealed: list[list[int]] = []

    async def subscribe(self, run_id: str, *, after: int) -> None:
        return None

    async def cancel(self, run_id: str, reason: str) -> None:
        return None

    async def last_seq(self, run_id: str) -> int:
        return self.live

    async def seal(self, events: Sequence[Event]) -> None:
        self.sealed.append([event.seq for event in events])


class UnreadableEvents(ProcessStore):
    async def events_between(self, run_id: str, after: int, through: int) -> list[Event]:
        raise RuntimeError("the database went away")


@pytest.mark.parametrize(
    ("live", "most", "store", "sealed"),
    [
        (2, 1000, ProcessStore, [3, 4, 5]),
        (0, 1000, ProcessStore, [1, 2, 3, 4, 5]),
        (0, 4, ProcessStore, []),
        (5, 1000, ProcessStore, []),
        (2, 1000, UnreadableEvents, []),
    ],
    ids=["behind", "no stream", "too far behind", "all there", "unreadable"],
)
async def test_an_orphaned_runs_shared_log_gets_the_persisted_events_it_lacks_then_its_end(
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    live: int,
    most: int,
    store: type[ProcessStore],
    sealed: list[int],
) -> None:
    """A dead process's last quiet batch may not have reached the shared live log: the run's
    persisted events past the log's last seq are copied there before its terminal event
    (``SEAL_COPY_MOST`` seqs behind at most: further, viewers read them from the store). If
    they cannot be read, the terminal event goes alone, and the run is ended all the same."""
    monkeypatch.setattr(leases_module, "SEAL_COPY_MOST", most)
    opened = await Store.open(database_url)
    run_id = f"run_{uuid.uuid4().hex}"
    try:
        await create_run(opened, run_id, f"ses_{uuid.uuid4().hex}")  # its owner never registered
        for seq in range(2, 6):
            await opened.append_events(StepStarted(run_id=run_id, seq=seq, ts=0.0, step=1))
        peers = SharedLog(live)
        leases = Leases(store(opened.db), Supervisor(RunLog(), peers=peers), lease_seconds=15)
        assert await leases.join("here", alone=False) >= 1
        assert peers.sealed == [[*sealed, 5 + SEAL_GAP]]
        run = await opened.get_run(run_id)
        assert run is not None
        assert run.status == "interrupted"
    finally:
        await opened.close()


async def test_a_run_of_this_process_it_no_longer_runs_is_ended_at_the_second_sweep(
    database_url: str,
) -> None:
    """Its end could not be saved (the database was away): it would stay ``running``, and
    its conversation busy, for good."""
    store = await Store.open(database_url)
    supervisor = Supervisor(RunLog())
    leases = Leases(ProcessStore(store.db), supervisor, lease_seconds=15)
    run_id = f"run_{uuid.uuid4().hex}"
    try:
        await leases.join("here", alone=False)
        await create_run(store, run_id, f"ses_{uuid.uuid4().hex}", owner=supervisor.process_id)
        assert await leases.sweep() == 0, "it may be starting: not at once"
        assert await leases.sweep() == 1
        run = await store.get_run(run_id)
        assert run is not None
        assert run.status == "interrupted"
    finally:
        await store.close()


@asynccontextmanager
async def leased_run(
    database_url: str, *, alone: bool
) -> AsyncIterator[tuple[ProcessStore, Leases, list[object]]]:
    """A process on leases of a second, running one run ("run_going"); the endings that
    run has had."""
    store = await Store.open(database_url)
    processes = ProcessStore(store.db)
    endings: list[object] = []

    async def record(ending: object) -> None:
        endings.append(ending)

    try:
        async with Supervisor(RunLog()) as supervisor:
            leases = Leases(processes, supervisor, lease_seconds=1)
            await leases.join("here", alone=alone)
            supervisor.launch("run_going", anyio.sleep_forever, record, timeout=60)
            yield processes, leases, endings
    finally:
        await store.close()


async def renewable(processes: ProcessStore, process_id: str) -> bool:
    now = time.time()
    return await processes.renew(process_id, now + 1, at=now)


async def run_out(processes: ProcessStore, process_id: str) -> None:
    """Its lease, as if its last rounds came late (a busy or suspended machine)."""
    past = time.time() - 10
    assert await processes.renew(process_id, past, at=past)


@pytest.mark.parametrize("swept", [True, False], ids=["swept", "not-yet-swept"])
async def test_a_process_taken_for_dead_stops_its_runs_and_registers_again(
    database_url: str, swept: bool
) -> None:
    """Not alone, it cannot know whether another ended its runs: it stops them, and is on
    record again with a lease it can renew, whether or not its old row is still there."""
    async with leased_run(database_url, alone=False) as (processes, leases, endings):
        if swept:
            await processes.forget_expired(time.time() + 60)  # another found its lease out
        else:
            await run_out(processes, leases.process_id)
        await leases.round()
        assert endings == [Stopped("interrupted", INTERRUPTED)]
        assert await renewable(processes, leases.process_id), "on record"


async def test_a_process_alone_on_its_database_keeps_its_runs_after_a_late_round(
    database_url: str,
) -> None:
    """Its lease ran out, but no other process can have taken it for dead: its runs go on
    and its lease is renewed."""
    async with leased_run(database_url, alone=True) as (processes, leases, endings):
        await run_out(processes, leases.process_id)
        await leases.round()
        assert leases.supervisor.get("run_going") is not None
        assert endings == []
        assert await renewable(processes, leases.process_id), "renewed"


async def test_processes_creating_the_same_definitions_at_once_all_succeed(
    database_url: str,
) -> None:
    """As workers starting together on a new database each create the demo definitions: the
    one that finds the row already there (just inserted by another) takes it, and no one
    fails or bumps a version for an unchanged definition."""
    stores = [await Store.open(database_url) for _ in range(2)]
    ids = [f"x{uuid.uuid4().hex[:8]}" for _ in range(8)]
    try:
        async with anyio.create_task_group() as group:
            for store in stores:
                workflows = WorkflowStore(store.db)
                for name in ids:
                    group.start_soon(create_all, store, workflows, name)
        for name in ids:
            agent = await stores[0].get_agent(name)
            workflow = await WorkflowStore(stores[0].db).get_workflow(name)
            deployment = await stores[0].get_deployment(name)
            assert agent is not None
            assert workflow is not None
            assert deployment is not None
            assert (agent.version, workflow.version) == (1, 1)
            assert deployment.settings.agent_id == name
    finally:
        for store in stores:
            await store.close()


async def create_all(store: Store, workflows: WorkflowStore, name: str) -> None:
    agent = await store.put_agent(AgentSpec(id=name))
    await workflows.put_workflow(flow(name))
    settings = DeploymentSettings(slug=name, agent_id=name)
    await store.put_deployment(settings, target=agent, password_hash=None)


async def test_what_a_store_looked_up_follows_every_change_made_through_another(
    database_url: str,
) -> None:
    """Keys, agents and deployments are kept as looked up (``DefinitionsCache``) until a
    change to any of them, made by any connection (another process, a command): the next
    lookup reads it."""
    reader, writer = [await Store.open(database_url) for _ in range(2)]
    try:
        key = await writer.create_api_key("ci")
        agent = await writer.put_agent(AgentSpec(id="kept", instructions="One."))
        await writer.put_deployment(
            DeploymentSettings(slug="kept", agent_id="kept"), target=agent, password_hash=None
        )
        assert await reader.api_key_name(key) == "ci"
        assert (await reader.get_agent("kept")) == agent
        assert (await reader.get_deployment("kept")).settings.title == ""  # type: ignore[union-attr]

        edited = await writer.put_agent(AgentSpec(id="kept", instructions="Two."))
        assert (await reader.get_agent("kept")) == edited
        await writer.put_deployment(
            DeploymentSettings(slug="kept", agent_id="kept", title="Kept"),
            target=edited,
            password_hash=None,
        )
        assert (await reader.get_deployment("kept")).settings.title == "Kept"  # type: ignore[union-attr]
        (listed,) = [k for k in await writer.list_api_keys() if k.name == "ci"]
        assert await writer.revoke_api_key(listed.id)
        assert await reader.api_key_name(key) is None
        assert await writer.delete_agent("kept")
        assert await reader.get_agent("kept") is None
        assert await writer.delete_deployment("kept")
        assert await reader.get_deployment("kept") is None
        if writer.engine.dialect.name == "postgresql":  # SQLite has no TRUNCATE
            key = await writer.create_api_key("ci")
            assert await reader.api_key_name(key) == "ci"
            async with writer.engine.begin() as db:
                await db.exec_driver_sql("TRUNCATE api_keys CASCADE")
            assert await reader.api_key_name(key) is None
    finally:
        await reader.close()
        await writer.close()


@contextmanager
def counter_reads(store: Store) -> Iterator[list[str]]:
    """The reads of the definitions' counter ``store`` makes within the block, one item
    each."""
    reads: list[str] = []
    read_value = store.db.read_value

    async def counted(sql: str) -> Any:
        reads.append(sql)
        return await read_value(sql)

    store.db.read_value = counted  # type: ignore[method-assign]
    try:
        yield reads
    finally:
        del store.db.read_value


async def test_one_requests_lookups_read_the_definitions_counter_once(database_url: str) -> None:
    """Within ``one_request`` (a route's handler) the key's and the agent's lookups share
    one read of the counter; outside it, and in a task the request starts (a run's), each
    lookup reads it, so a change made meanwhile by another connection is seen at once; a
    change made through the store within the request is seen by its next lookup. A
    request's lookup on its older read leaves what is kept under a newer one as it is."""
    reader, writer = [await Store.open(database_url) for _ in range(2)]
    try:
        key = await writer.create_api_key("ci")
        first = await writer.put_agent(AgentSpec(id="once", instructions="One."))
        with counter_reads(reader) as reads:
            with one_request():
                assert await reader.api_key_name(key) == "ci"
                assert await reader.get_agent("once") == first
                assert await reader.get_agent("missing") is None
            assert len(reads) == 1

            with one_request():
                assert await reader.get_agent("once") == first
                second = await reader.put_agent(AgentSpec(id="once", instructions="Two."))
                assert await reader.get_agent("once") == second  # its own change
                third = await writer.put_agent(AgentSpec(id="once", instructions="Three."))

                async def started_within() -> StoredAgent | None:
                    return await reader.get_agent("once")

                assert await asyncio.create_task(started_within()) == third
                with through_sqlalchemy("agents") as agent_reads:
                    await reader.get_agent("once")  # read: its counter is older than kept's
                assert len(agent_reads) == 1
            assert len(reads) == 4  # 1 + the one after its change + the task's

            with through_sqlalchemy("agents") as agent_reads, one_request():
                assert await reader.get_agent("once") == third
            assert agent_reads == []  # kept since the task read it
            assert await reader.get_agent("once") == third
            assert len(reads) == 6
    finally:
        await reader.close()
        await writer.close()
