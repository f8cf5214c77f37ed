"""Where the CPU of one persisted event goes, layer by layer, on a SQLite file:
``python -m bench.store_writes [N]``.

Each line adds one layer to the one before: the INSERT and COMMIT through ``sqlite3``
alone; the row made from the event and written through SQLAlchemy (``database.add``) in
the calling thread; then from the event loop through ``Database.transact`` (its turn to
write, and ``store.sqlite_file``'s connection on the loop); then grouped with other
runs' events (``Database.insert``); then the whole ``Store.append_events``. CPU time of
the process (all its threads), per event, N events one after the other. The first two
layers' connections checkpoint the WAL now and then as SQLite does by default; the
store's do it in a thread every ``SQLiteFile.CHECKPOINT_EVERY`` writes.
"""

from __future__ import annotations

import resource
import sqlite3
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvloop
from sqlalchemy import Connection, create_engine, event

from agentstream.agents import AgentSpec
from agentstream.events import RunStarted, StepStarted
from agentstream.store import Store
from agentstream.store.database import add
from agentstream.store.runs import event_row
from agentstream.store.sqlite_file import sqlite_pragmas

RUN = "r"


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def measure(events: int) -> list[tuple[str, float]]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bench.db"
        store = await Store.open(f"sqlite+aiosqlite:///{path}")
        try:
            agent = await store.put_agent(AgentSpec(id="a", model="offline"))
            started = RunStarted(run_id=RUN, seq=1, ts=0.0, agent_id="a", session_id="s")
            await store.create_run(
                run_id=RUN,
                agent=agent,
                session_id="s",
                new_session=True,
                input="x",
                reasoning_requested=False,
                first_events=(started,),
                owner="bench",
            )
            return await _layers(store, path, events)
        finally:
            await store.close()


async def _layers(store: Store, path: Path, events: int) -> list[tuple[str, float]]:
    seqs = iter(range(2, 10**9))

    def next_event() -> StepStarted:
        return StepStarted(run_id=RUN, seq=next(seqs), ts=0.0, step=1)

    def write_row(connection: Connection) -> None:
        add(connection, [event_row(next_event())])

    alone = sqlite3.connect(path)
    sqlite_pragmas(alone, None)  # as the store's own connections: WAL, synced at checkpoints
    engine = create_engine(f"sqlite:///{path}")
    event.listen(engine, "connect", sqlite_pragmas)
    connection = engine.connect()

    def sqlite_alone() -> None:
        alone.execute(
            "INSERT INTO run_events (run_id, seq, type, ts, payload) VALUES (?, ?, ?, ?, ?)",
            (RUN, next(seqs), "step_started", 0.0, "{}"),
        )
        alone.commit()

    def same_thread() -> None:
        with connection.begin():
            write_row(connection)

    layers: list[tuple[str, Callable[[], Awaitable[None] | None]]] = [
        ("sqlite3 alone", sqlite_alone),
        ("row and SQLAlchemy, same thread", same_thread),
        ("from the loop (transact)", lambda: store.db.transact(write_row)),
        ("grouped (Database.insert)", lambda: store.db.insert(event_row(next_event()))),
        ("Store.append_events", lambda: store.append_events(next_event())),
    ]
    figures = []
    for name, write in layers:
        spent = cpu_seconds()
        for _ in range(events):
            pending = write()
            if pending is not None:
                await pending
        figures.append((name, 1e6 * (cpu_seconds() - spent) / events))
    alone.close()
    connection.close()
    engine.dispose()
    return figures


def main() -> None:
    events = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    print(f"One persisted event on a SQLite file, CPU µs each, {events:,} events a layer:")
    for name, micros in uvloop.run(measure(events)):
        print(f"  {name:<32} {micros:6.0f}")


if __name__ == "__main__":
    main()
