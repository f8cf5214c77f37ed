"""The run log: any number of viewers, from any seq, through the end of the run."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from agentstream.events import Event, StepStarted
from agentstream.runlog import RunLog

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def step(seq: int) -> StepStarted:
    return StepStarted(run_id="r", seq=seq, ts=0.0, step=seq)


async def read_all(log: RunLog, after: int = 0) -> list[int]:
    subscription = log.subscribe("r", after=after)
    return [event.seq async for event in subscription]


async def test_viewers_see_every_event_from_where_they_joined() -> None:
    log = RunLog(retention=60)
    log.open("r")
    log.append(step(1))
    log.append(step(2))
    seen: dict[str, list[int]] = {}

    async def view(name: str, after: int) -> None:
        seen[name] = await read_all(log, after)

    async with anyio.create_task_group() as group:
        group.start_soon(view, "early", 0)
        group.start_soon(view, "late", 1)
        await anyio.lowlevel.checkpoint()
        for seq in range(3, 6):
            log.append(step(seq))
            await anyio.lowlevel.checkpoint()
        log.close("r")

    assert seen == {"early": [1, 2, 3, 4, 5], "late": [2, 3, 4, 5]}


async def test_next_batch_returns_everything_pending_at_once() -> None:
    log = RunLog()
    log.open("r")
    subscription = log.subscribe("r")
    for seq in range(1, 4):
        log.append(step(seq))
    batch: list[Event] = await subscription.next_batch()
    assert [e.seq for e in batch] == [1, 2, 3]
    log.close("r")
    assert subscription.ended
    assert await subscription.next_batch() == []


async def test_cancelled_wait_loses_nothing() -> None:
    log = RunLog()
    log.open("r")
    subscription = log.subscribe("r")
    with anyio.move_on_after(0.01):
        await subscription.next_batch()
    log.append(step(1))
    assert [e.seq for e in await subscription.next_batch()] == [1]


async def test_closed_log_is_dropped_after_retention() -> None:
    log = RunLog(retention=0.01)
    log.open("r")
    log.close("r")
    assert "r" in log
    await anyio.sleep(0.05)
    assert "r" not in log
    with pytest.raises(KeyError):
        log.subscribe("r")


async def test_a_reopened_run_outlives_the_old_streams_retention() -> None:
    """A run continued after a pause gets a new stream; the paused one's timer spares it."""
    log = RunLog(retention=0.01)
    log.open("r")
    log.close("r")
    log.open("r", after=5)
    await anyio.sleep(0.05)
    assert "r" in log
    log.append(step(6))
    assert [e.seq for e in await log.subscribe("r", after=5).next_batch()] == [6]
