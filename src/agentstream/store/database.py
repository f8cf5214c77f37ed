"""Sessions on the store's engine, with writes that queue instead of fighting over a lock.

SQLite lets one connection write at a time; the others retry on a timer and, under load,
give up with "database is locked" after seconds. So on SQLite this process's writes take
turns on one lock, shared by every store over the engine. And the events that runs
persist one by one are written in groups: whoever leads writes every event that is
waiting, in one transaction. Events wait while a write is under way (on PostgreSQL, or on
a SQLite file whose lock another process holds); a write on the loop (below) is over
before any other task runs, so there an insert goes at once, unless another task's went in
a moment before (until the event loop has run the callbacks ready then): then it waits
one iteration for the rest of their burst.

The reads and writes on a run's path (``read``, ``transact``) are plain functions of a
connection. The async SQLite driver makes three to five trips to its thread and back
through the event loop for every statement, which costs twenty times what the statement
does (a read by primary key: 1 ms against 50 µs), and a write holds the turn all along,
so under load those trips, not SQLite, set the pace of every write in the process. So on
a SQLite file both run right on the event loop (``store.sqlite_file``).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from typing import Any, TypeVar
from weakref import WeakKeyDictionary

import anyio
import anyio.lowlevel
from sqlalchemy import Connection, Dialect, Engine, bindparam, event, insert, inspect
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, StatementError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.pool import QueuePool

from agentstream.store.held_connection import HeldConnection
from agentstream.store.one_statement import OneStatement
from agentstream.store.sqlite_file import SQLiteFile
from agentstream.store.tables import Base
from agentstream.store.waiters import tell
from agentstream.telemetry.metrics import STORE_SECONDS

__all__ = ["Database", "NewRow", "UnknownColumns", "add"]

T = TypeVar("T")

NewRow = tuple[type[Base], dict[str, Any]]
"""A row to insert: its table and the values of the columns it sets, by name (the others
take their defaults). Not an ORM object: setting each attribute through the ORM's
instrumentation made a tenth of a run start's instructions, for rows that are only ever
inserted."""


class Database:
    """One per engine: every store over the engine shares it (and its turn to write)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.session = async_sessionmaker(engine, expire_on_commit=False)
        """For reads."""
        # Taken at once when free (``fast_acquire``): by default anyio takes a free lock and
        # then lets every other ready task run, a trip through the event loop each time,
        # and under load each trip waits for the whole loop.
        self._turn = anyio.Lock(fast_acquire=True) if engine.dialect.name == "sqlite" else None
        self._insert = sqlite.insert if engine.dialect.name == "sqlite" else postgresql.insert
        self._waiting: list[_Queued] = []
        self._leading = False
        """A caller is writing the rows that wait (``insert``); the others wait for it."""
        self._wrote_this_iteration: asyncio.Task[Any] | None = None
        """The task whose group went in a moment ago (until the event loop has run the
        callbacks ready then), if one did: an insert of another task meanwhile is a burst,
        and waits for the rest of it (``insert``)."""
        self._autocommit: AsyncEngine | None = None
        """On PostgreSQL, for statements that are whole on their own: no ``BEGIN`` and
        ``COMMIT`` (or ``ROLLBACK``) round trips around them."""
        if engine.dialect.name == "postgresql":
            self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._one_statement: OneStatement | None = None
        """On PostgreSQL through asyncpg, where ``insert`` writes its groups: on one of the
        pool's connections, held (if the pool has more than one)."""
        self._held_reads: HeldConnection | None = None
        """On asyncpg, another of the pool's connections, held for ``read_value`` (if the
        pool has more than two)."""
        pool = engine.sync_engine.pool
        if engine.dialect.driver == "asyncpg" and isinstance(pool, QueuePool):
            if pool.size() > 1:
                self._one_statement = OneStatement(HeldConnection(engine))
            if pool.size() > 2:
                self._held_reads = HeldConnection(engine)
        self._file: SQLiteFile | None = None
        """The same SQLite file through the standard library's driver, for ``read`` and
        ``transact``."""
        if engine.dialect.name == "sqlite" and engine.url.database not in (None, "", ":memory:"):
            self._file = SQLiteFile(engine.url)
        for timed in (engine.sync_engine, self._file and self._file.engine):
            if timed is not None:
                event.listen(timed, "before_cursor_execute", _started)
                event.listen(timed, "after_cursor_execute", _returned)
                event.listen(timed, "handle_error", _failed)

    async def close(self) -> None:
        for held in (self._one_statement, self._held_reads):  # back to the pool, disposed below
            if held is not None:
                await held.close()
        await self.engine.dispose()
        if self._file is not None:
            await self._file.close()

    async def read(self, work: Callable[[Connection], T]) -> T:
        """``work``'s read, one statement by key: on the event loop itself on a SQLite file
        (it costs tens of µs there); on PostgreSQL outside a transaction, since one
        statement sees what is committed either way (a third less CPU a read)."""
        if self._file is not None:
            return self._file.read(work)
        async with (self._autocommit or self.engine).connect() as connection:
            return await connection.run_sync(work)

    async def read_value(self, sql: str) -> Any:
        """The one value of ``sql``, a read without parameters, through the driver's own
        API: SQLAlchemy's execution costs ten times a read of one row (28 µs against 2.3 on
        SQLite). On PostgreSQL it goes on a held connection, shared by the callers
        waiting as it goes out (``HeldConnection.value``). Where the driver fails, the
        read goes again through SQLAlchemy, which raises its own error (a 503 when the
        database is gone)."""
        again = functools.partial(self.read, functools.partial(_value, sql=sql))
        if self._held_reads is not None:
            return await self._held_reads.value(sql, again)
        return await again()

    async def transact(self, work: Callable[[Connection], T]) -> T:
        """``work`` in one write transaction, committed if it returns."""
        turn: AbstractAsyncContextManager[object] = self._turn or nullcontext()
        async with turn:
            if self._file is not None:
                return await self._file.write(work)
            async with self.engine.begin() as connection:
                return await connection.run_sync(work)

    @asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncSession]:
        """A transaction that writes: committed when the block ends, rolled back on error."""
        turn: AbstractAsyncContextManager[object] = self._turn or nullcontext()
        async with turn, self.session.begin() as db:
            yield db

    def upsert(self, table: type[Base]) -> sqlite.Insert | postgresql.Insert:
        """An INSERT that says what becomes of a row that is already there
        (``on_conflict_do_nothing`` / ``on_conflict_do_update``), decided by the database
        in the one statement, so processes racing to write it cannot both win."""
        return self._insert(table)

    async def insert_or_lock(self, db: AsyncSession, row: _Row) -> tuple[_Row, bool]:
        """``row`` inserted, or else the row already there with its key, locked until ``db``'s
        transaction ends; and whether ``row`` went in. A read-then-insert instead lets two
        processes that create the same thing at once both insert, and one of them fail."""
        statement = self._insert(type(row)).values(_values(row)).on_conflict_do_nothing()
        inserted = await db.execute(statement)
        key = inspect(type(row)).primary_key_from_instance(row)
        stored = await db.get_one(type(row), key, with_for_update=True, populate_existing=True)
        return stored, bool(inserted.rowcount)  # type: ignore[attr-defined]

    async def insert(self, *rows: NewRow | None) -> None:
        """Insert ``rows`` together, with the rows that others wait to insert (group commit).

        One INSERT per table (``_statements``), in the order of the tables' foreign keys, so
        a row may refer to a row of another table in the group (a run to its new session);
        None stands for no row.

        Callers take turns to lead: one writes every row waiting, all or nothing, and
        each of those callers resumes as soon as it is done (waiting for a lock instead, they
        would resume one an iteration of the event loop, each handing it to the next); then
        the next caller waiting, if one is, leads. A caller waits on a future of its own
        (``store.waiters``): told once its rows went in, unless it was cancelled meanwhile.
        """
        loop = asyncio.get_running_loop()
        queued = _Queued(rows, loop)
        self._waiting.append(queued)
        if self._leading:
            try:
                if await queued.outcome:
                    return  # written
            except asyncio.CancelledError:
                self._withdraw(queued)
                raise
            queued.outcome = loop.create_future()  # this caller leads now
        self._leading = True
        try:
            with anyio.CancelScope(shield=True):  # it writes others' rows too
                await self._write_waiting(loop)
        except BaseException:
            # Cut short by ``Task.cancel``, which the shield does not hold off: the rows of
            # the others go back to wait; this caller's, never to be told, do not.
            if queued in self._waiting:
                self._waiting.remove(queued)
            raise
        finally:
            self._pass_lead()
        queued.outcome.result()

    async def _write_waiting(self, loop: asyncio.AbstractEventLoop) -> None:
        task = asyncio.current_task()
        if self._wrote_this_iteration not in (None, task):
            # A burst (a write on the loop is over before the next task's insert): the rest
            # of it queues behind this one while the loop goes round once.
            await anyio.lowlevel.checkpoint()
        group = [queued for queued in self._waiting if not queued.outcome.cancelled()]
        self._waiting = []
        if self._wrote_this_iteration is None:
            loop.call_soon(setattr, self, "_wrote_this_iteration", None)
        self._wrote_this_iteration = task
        try:
            await self._insert_group(group)
        except Exception as exc:
            for unwritten in group:
                tell(unwritten.outcome, exc)
        except BaseException:
            self._waiting[:0] = [queued for queued in group if not queued.outcome.done()]
            raise

    def _pass_lead(self) -> None:
        """The leader is done: the first caller still waiting leads next (one cancelled, its
        future with it, withdraws)."""
        while self._waiting and self._waiting[0].outcome.cancelled():
            del self._waiting[0]
        if self._waiting:
            self._waiting[0].outcome.set_result(False)
        else:
            self._leading = False

    def _withdraw(self, queued: _Queued) -> None:
        """A waiting caller was cancelled: its rows, not written yet, are not written; and
        if it had just been told to lead, the next one does."""
        if queued in self._waiting:
            self._waiting.remove(queued)
            told = queued.outcome
            if told.done() and not told.cancelled() and not told.result():
                self._pass_lead()

    async def _insert_group(self, group: list[_Queued]) -> None:
        try:
            await self._write_rows([queued.rows for queued in group])
        except Exception as exc:
            if len(group) == 1 or not _a_rows_fault(exc):
                raise
            await self._insert_each(group)  # one bad row must not fail the others
        else:
            for queued in group:
                tell(queued.outcome, True)

    async def _insert_each(self, group: list[_Queued]) -> None:
        for queued in group:
            try:
                await self._write_rows([queued.rows])
            except Exception as exc:
                tell(queued.outcome, exc)
            else:
                tell(queued.outcome, True)

    async def _write_rows(self, inserts: list[tuple[NewRow | None, ...]]) -> None:
        """Every row of ``inserts``, or none. Rows that make one INSERT (runs' events) go on
        PostgreSQL without a transaction around it, which saves two of the three round trips
        of a run's persisted event: a lone ``INSERT``, or asyncpg's ``executemany``, is
        all-or-nothing by itself. On asyncpg with a pool of more than one connection they
        go as one statement (``OneStatement``), and this way only where the database
        refused that, or where a table has several INSERTs (an agent run's and a workflow
        execution's): a statement's INSERTs run in no set order, where a key the database
        makes (a message's) would follow their order here."""
        statements = _statements(row for group in inserts for row in group if row is not None)
        if self._one_statement is not None and statements and _one_a_table(statements):
            prepared = _driver_inserts(self.engine.sync_engine, statements)
            shape = tuple(compiled for compiled, _ in prepared)
            if await self._one_statement.insert(shape, [values for _, values in prepared]):
                return
        if len(statements) > 1 or self._autocommit is None:
            await self.transact(functools.partial(_execute, statements=statements))
        elif statements:
            async with self._autocommit.connect() as connection:
                await connection.run_sync(_execute, statements)


def _value(connection: Connection, sql: str) -> Any:
    """``Database.read_value``'s read on a connection of the pool: through the driver's
    cursor, and through SQLAlchemy where that fails."""
    try:
        cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.execute(sql)
            row = cursor.fetchone()
        finally:
            cursor.close()
    except connection.dialect.loaded_dbapi.Error:
        row = connection.exec_driver_sql(sql).one()
    return None if row is None else row[0]


_Row = TypeVar("_Row", bound=Base)


class _Queued:
    """A caller's rows, waiting to be written."""

    __slots__ = ("outcome", "rows")

    def __init__(self, rows: tuple[NewRow | None, ...], loop: asyncio.AbstractEventLoop) -> None:
        self.rows = rows
        self.outcome: asyncio.Future[bool] = loop.create_future()
        """True once written; False if not, and the caller now leads the writes."""


def add(connection: Connection, rows: Iterable[NewRow]) -> None:
    """Insert new ``rows``: a statement, not a session's unit of work, which costs several
    times more for rows that are only ever inserted."""
    _execute(connection, _statements(rows))


_Statement = tuple[type[Base], list[dict[str, Any]]]
"""One INSERT: a table and its rows, each setting the same columns."""


def _statements(rows: Iterable[NewRow]) -> list[_Statement]:
    """The INSERTs that write ``rows``: one per table, the tables a foreign key refers to
    first (a session, then its runs, then their events), each table's rows in their order;
    and another wherever a table's next row sets other columns (an agent run's and a
    workflow execution's, written in one group), as a statement over several rows takes its
    columns from the first. A name that is no column of its table is refused here, before
    anything is written: the INSERT would leave its value out without a word."""
    by_table: dict[type[Base], list[list[dict[str, Any]]]] = {}
    for table, values in rows:
        batches = by_table.setdefault(table, [])
        if batches and batches[-1][-1].keys() == values.keys():
            batches[-1].append(values)
        else:
            _check_columns(table, tuple(values))
            batches.append([values])
    ordered = sorted(by_table, key=_table_order)
    return [(table, batch) for table in ordered for batch in by_table[table]]


def _execute(connection: Connection, statements: list[_Statement]) -> None:
    """The INSERTs, in ``connection``'s transaction. On SQLite, through the driver's cursor:
    SQLAlchemy's execution (an execution context, the events, a cursor a statement) was
    a ninth of a run start's instructions; with no connection to lose, nothing of it is
    missed but its error, raised as it raises it (``IntegrityError``, ...)."""
    engine = connection.engine
    if connection.dialect.name != "sqlite":
        for compiled, parameters in _driver_inserts(engine, statements):
            connection.exec_driver_sql(compiled.sql, parameters)
        return
    if not connection.in_transaction():  # as a statement would begin it: then it commits
        connection.begin()
    cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        for compiled, parameters in _driver_inserts(engine, statements):
            started = time.perf_counter()
            try:
                cursor.executemany(compiled.sql, parameters)
            except engine.dialect.loaded_dbapi.Error as exc:
                raise _driver_error(engine, compiled.sql, parameters, exc, many=True) from exc
            _INSERT_SECONDS.observe(time.perf_counter() - started)
    finally:
        cursor.close()


def _driver_inserts(
    engine: Engine, statements: list[_Statement]
) -> list[tuple[_CompiledInsert, list[Any]]]:
    """Each INSERT compiled for the engine's dialect, with its rows' values as the driver
    takes them: all of them made before any goes out (a value no column takes fails its
    caller's group before anything is sent)."""
    inserts = []
    for table, rows in statements:
        compiled = _compiled_insert(engine.dialect, table, tuple(rows[0]))
        inserts.append((compiled, compiled.parameters(rows, engine)))
    return inserts


def _driver_error(
    engine: Engine, sql: str, parameters: Any, exc: Exception, *, many: bool = False
) -> StatementError:
    """The driver's ``exc`` as SQLAlchemy raises it (a ``sqlite3.IntegrityError`` as an
    ``IntegrityError``; a value no bind processor takes as a ``StatementError``), with the
    parameters of ``many`` rows shown as it shows them (the first ten)."""
    return DBAPIError.instance(
        sql,
        parameters,
        exc,
        engine.dialect.loaded_dbapi.Error,
        hide_parameters=engine.hide_parameters,
        dialect=engine.dialect,
        ismulti=many,
    )


def _one_a_table(statements: list[_Statement]) -> bool:
    """Each table has one INSERT (not an agent run's and a workflow execution's)."""
    return len({table for table, _ in statements}) == len(statements)


@functools.cache
def _table_order(table: type[Base]) -> int:
    return Base.metadata.sorted_tables.index(Base.metadata.tables[table.__tablename__])


class _CompiledInsert:
    """A table's INSERT of some of its columns, compiled for one dialect, and the values of
    each row as the driver takes them: in the SQL's order (a tuple for a positional
    paramstyle, SQLite's and asyncpg's), each through its column type's bind processor (JSON
    to text; a datetime to SQLite's text), a column the row leaves out at its default.

    The SQL and the values are those Core sends the driver's ``executemany`` for an
    ``insert`` of the same rows (no ``RETURNING``: nothing reads the new keys). Executing
    Core's ``insert`` instead looks its compiled form up by cache key and builds each row's
    parameters through the compiled statement's bookkeeping: a tenth of a run start's
    instructions."""

    __slots__ = (
        "_defaults",
        "_names",
        "_positional",
        "_processors",
        "dialect",
        "keys",
        "sql",
        "table",
    )

    def __init__(self, dialect: Dialect, table: type[Base], given: tuple[str, ...]) -> None:
        self.dialect = dialect
        self.table = into = Base.metadata.tables[table.__tablename__]
        columns = into.columns
        defaulted = [c.key for c in columns if c.key not in given and c.default is not None]
        for key in defaulted:
            if not columns[key].default.is_scalar:  # type: ignore[union-attr]
                raise TypeError(f"{into.name}.{key}: a default that is not a value")
        binds = {key: bindparam(key, type_=columns[key].type) for key in (*given, *defaulted)}
        compiled = insert(into).inline().values(binds).compile(dialect=dialect)
        self.sql = compiled.string
        self._positional = compiled.positional
        self.keys = tuple(compiled.positiontup or binds)
        """The values' columns, in the SQL's order."""
        self._names = tuple(compiled.escaped_bind_names.get(key, key) for key in self.keys)
        """Their parameters' names in the SQL, for a paramstyle that takes them by name."""
        self._defaults = tuple(
            None if key in given else columns[key].default.arg  # type: ignore[union-attr]
            for key in self.keys
        )
        self._processors = [
            (i, processor)
            for i, key in enumerate(self.keys)
            if (processor := columns[key].type.dialect_impl(dialect).bind_processor(dialect))
        ]

    def parameters(self, rows: list[dict[str, Any]], engine: Engine) -> list[Any]:
        """The rows' values for the driver's ``executemany``. A value its processor refuses
        (what JSON cannot hold) fails the statement as in Core: a ``StatementError``."""
        keys, defaults, processors = self.keys, self._defaults, self._processors
        parameters: list[Any] = []
        for row in rows:
            values = list(map(row.get, keys, defaults))  # no bytecode a column
            try:
                for i, processor in processors:
                    values[i] = processor(values[i])
            except Exception as exc:
                raise _driver_error(engine, self.sql, row, exc) from exc
            parameters.append(
                tuple(values) if self._positional else dict(zip(self._names, values, strict=True))
            )
        return parameters


_Inserts = dict[tuple[type[Base], tuple[str, ...]], _CompiledInsert]
"""A dialect's compiled inserts, by table and the columns the rows give."""

_COMPILED_INSERTS: WeakKeyDictionary[Dialect, _Inserts] = WeakKeyDictionary()
"""By dialect (one an engine), for as long as its engine is in use."""


def _compiled_insert(
    dialect: Dialect, table: type[Base], given: tuple[str, ...]
) -> _CompiledInsert:
    inserts = _COMPILED_INSERTS.setdefault(dialect, {})
    key = (table, given)
    if key not in inserts:
        inserts[key] = _CompiledInsert(dialect, table, given)
    return inserts[key]


class UnknownColumns(ValueError):
    """A row to insert names what is no column of its table (a fault of that row alone)."""


@functools.cache
def _check_columns(table: type[Base], columns: tuple[str, ...]) -> None:
    """Refuse a set of columns that the table lacks one of (accepted sets are kept)."""
    if unknown := set(columns) - set(_columns(table)):
        raise UnknownColumns(f"{table.__tablename__} has no column {', '.join(sorted(unknown))}")


def _values(row: Base) -> dict[str, Any]:
    """The columns set on a new ``row``, by name (its ``__dict__`` also holds the ORM's
    state, which is no column)."""
    given = row.__dict__
    return {name: given[name] for name in _columns(type(row)) if name in given}


@functools.cache
def _columns(table: type[Base]) -> tuple[str, ...]:
    return tuple(attribute.key for attribute in inspect(table).column_attrs)


def _a_rows_fault(exc: Exception) -> bool:
    """The database refused a row (a key, a constraint, a value), or a value could not be
    sent: rows written one by one, the others go in. Not a connection that failed or
    could not be had, where writing them one by one would only wait as long again."""
    return isinstance(exc, IntegrityError | DataError | UnknownColumns) or (
        isinstance(exc, StatementError) and not isinstance(exc, DBAPIError)
    )


_TIMERS = {
    operation: STORE_SECONDS.labels(operation)
    for operation in ("select", "insert", "update", "delete", "other")
}
"""Each operation's histogram, looked up once: ``labels()`` takes a lock and builds a key on
every call, and this is every statement's path."""
_INSERT_SECONDS = _TIMERS["insert"]


def _started(connection: Connection, *_: Any) -> None:
    connection.info.setdefault("agentstream_started", []).append(time.perf_counter())


def _failed(context: ExceptionContext) -> None:
    """A statement failed: its start is no longer timed."""
    if context.connection is not None and context.execution_context is not None:
        started = context.connection.info.get("agentstream_started")
        if started:
            started.pop()


def _returned(connection: Connection, _cursor: Any, statement: str, *_: Any) -> None:
    """A statement returned: how long it took (``agentstream_store_seconds``)."""
    seconds = time.perf_counter() - connection.info["agentstream_started"].pop()
    timer = _TIMERS.get(statement.lstrip()[:6].lower(), _TIMERS["other"])
    timer.observe(seconds)
