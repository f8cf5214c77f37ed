"""Grouped inserts on a real SQLite file: a bad row fails only its own caller, and a row
whose write failed is never written later."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from agentstream.agents import AgentSpec
from agentstream.events import RunStarted, StepStarted
from agentstream.store import Store
from agentstream.store.tables import RunEventRow

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def create_run(store: Store, run_id: str, session_id: str) -> None:
    """A run of agent "a" in a new session."""
    agent = await store.get_agent("a") or await store.put_agent(AgentSpec(id="a"))
    first = RunStarted(run_id=run_id, seq=1, ts=time.time(), agent_id="a", session_id=session_id)
    await store.create_run(
        run_id=run_id,
        agent=agent,
        session_id=session_id,
        new_session=True,
        input="hi",
        reasoning_requested=False,
        first_event=first,
    )


async def test_one_bad_row_fails_only_its_caller_and_is_never_written(tmp_path: Path) -> None:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
    try:
        await create_run(store, "run_1", "ses_1")
        outcomes: dict[int, str] = {}

        async def append(seq: int, run_id: str) -> None:
            try:
                await store.append_event(StepStarted(run_id=run_id, seq=seq, ts=0.0, step=1))
                outcomes[seq] = "written"
            except IntegrityError:
                outcomes[seq] = "refused"

        async with anyio.create_task_group() as group:  # queued together: one group
            for seq in range(2, 12):
                group.start_soon(append, seq, "run_1" if seq != 6 else "no_such_run")
        assert outcomes == {seq: "refused" if seq == 6 else "written" for seq in range(2, 12)}

        await append(2, "run_2")  # refused: run_2 does not exist yet
        assert outcomes[2] == "refused"
        await create_run(store, "run_2", "ses_2")
        await append(12, "run_1")  # must not carry the refused row along, now valid
        async with store.db.session() as db:
            rows = (await db.execute(select(RunEventRow.run_id, RunEventRow.seq))).all()
        assert sorted(rows) == sorted(
            [("run_1", seq) for seq in (1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12)] + [("run_2", 1)]
        )
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
            except IntegrityError:
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
