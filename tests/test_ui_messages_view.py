"""The AI SDK UI message stream view over random agent runs: well-formed (one start, every
part begun is ended, exactly one ending), and the message a client assembles holds each
step's text."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agent_runs import Run, agent_runs, reasoning_within_text
from agentstream.events import Event
from agentstream.views.continued import continued
from agentstream.views.frames import as_dict
from agentstream.views.ui_messages import UIMessageChunks

ENDINGS = ("finish", "error", "abort")


def chunks(events: list[Event], after: int = 0) -> list[dict[str, Any]]:
    view = UIMessageChunks("run_1")
    shown = continued(view, after, view.opening)
    return [as_dict(chunk) for event in events for chunk in shown(event)]


def parts(chunks: list[dict[str, Any]], kind: str) -> list[str]:
    """The text of each part of ``kind`` (``text``, ``reasoning``), as a client joins its
    deltas; a delta outside its part fails."""
    open_: dict[str, str] = {}
    done = []
    for chunk in chunks:
        if chunk["type"] == f"{kind}-start":
            assert chunk["id"] not in open_
            open_[chunk["id"]] = ""
        elif chunk["type"] == f"{kind}-delta":
            open_[chunk["id"]] += chunk["delta"]
        elif chunk["type"] == f"{kind}-end":
            done.append(open_.pop(chunk["id"]))
    assert open_ == {}, "every part begun is ended"
    return done


@given(agent_runs())
def test_chunks_are_well_formed(run: Run) -> None:
    sent = chunks(run.live)
    assert sent[0] == {"type": "start", "messageId": "run_1"}
    assert [c["type"] for c in sent].count("start") == 1
    endings = [c for c in sent if c["type"] in ENDINGS]
    assert endings == [sent[-1]]
    if run.paused:
        assert sent[-1] == {"type": "finish", "finishReason": "tool-calls"}
        assert sent[-3]["type"] == "tool-approval-request"
    elif run.answer is not None:
        assert sent[-1] == {"type": "finish", "finishReason": "stop"}
    steps = [c["type"] for c in sent if c["type"] in ("start-step", "finish-step")]
    assert steps == ["start-step", "finish-step"] * (len(steps) // 2)
    calls = {c["toolCallId"] for c in sent if c["type"] == "tool-input-available"}
    settled = {c["toolCallId"] for c in sent if c["type"].startswith("tool-output-")}
    waiting = {c["toolCallId"] for c in sent if c["type"] == "tool-approval-request"}
    assert settled | waiting == calls or sent[-1]["type"] != "finish"


@given(agent_runs())
def test_the_message_holds_each_step_s_text(run: Run) -> None:
    assert parts(chunks(run.live), "text") == run.texts
    if run.answer is not None or run.paused:  # a failed step's text was never settled
        assert parts(chunks(run.stored), "text") == run.stored_texts  # read back: one delta


@given(agent_runs(), st.data())
def test_a_continued_message_starts_again(run: Run, data: st.DataObject) -> None:
    after = data.draw(st.integers(1, len(run.live)))
    later = chunks(run.live, after=after)
    if after < len(run.live):
        assert later[0] == {"type": "start", "messageId": "run_1"}
        assert [c["type"] for c in later].count("start") == 1
    else:
        assert later == []


def test_reasoning_that_comes_within_the_text_ends_before_the_text_goes_on() -> None:
    """The reasoning part ends before the next text delta: parts never overlap."""
    assert [(c["type"], c.get("delta")) for c in chunks(reasoning_within_text())[2:]] == [
        ("text-start", None),
        ("text-delta", "a"),
        ("reasoning-start", None),
        ("reasoning-delta", "r"),
        ("reasoning-end", None),
        ("text-delta", "b"),
        ("text-delta", ""),
        ("text-delta", "c"),
    ]
